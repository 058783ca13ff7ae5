package hash

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math/bits"
	"unsafe"

	"github.com/zeebo/xxh3"
)

// Seed is the XXH3 seed of both the content hash and the prefix chain.
const Seed = 1337

// MaxBlockSize is the largest block size, in tokens, that BlockSize validation accepts.
// Engines use 1 to 512 tokens per block; the bound keeps a hostile configuration from
// turning one request into one enormous block.
const MaxBlockSize = 1 << 16

// ErrBlockSize reports a block size outside [1, MaxBlockSize].
var ErrBlockSize = errors.New("hash: invalid block size")

// littleEndian is true on every platform Go commonly runs on; on big-endian machines the
// token ids are copied into little-endian order before hashing.
var littleEndian = func() bool {
	x := uint16(1)
	return *(*byte)(unsafe.Pointer(&x)) == 1
}()

// Content returns the content hash of one block: XXH3-64 with seed 1337 over the token
// ids, each as 4 bytes little-endian. Any length is accepted, including zero.
func Content(tokens []uint32) uint64 {
	if len(tokens) == 0 {
		return xxh3.HashSeed(nil, Seed)
	}
	if littleEndian {
		b := unsafe.Slice((*byte)(unsafe.Pointer(&tokens[0])), 4*len(tokens))
		return xxh3.HashSeed(b, Seed)
	}
	return contentPortable(tokens)
}

// contentPortable hashes through an explicit little-endian copy. It is the definition
// Content must equal; tests compare the two on random input.
func contentPortable(tokens []uint32) uint64 {
	var stack [256]byte
	var b []byte
	if 4*len(tokens) <= len(stack) {
		b = stack[:4*len(tokens)]
	} else {
		b = make([]byte, 4*len(tokens))
	}
	for i, t := range tokens {
		binary.LittleEndian.PutUint32(b[4*i:], t)
	}
	return xxh3.HashSeed(b, Seed)
}

// ContentExtra returns the content hash of a block whose engine hash also covers inputs
// other than its tokens (multimodal identifiers, a cache salt: vLLM's extra keys): XXH3-64
// with seed 1337 over LE64(Content(tokens)) followed by key, the canonical CBOR encoding
// of those inputs as an array (package kvevents builds it from events, package server from
// a request). Blocks with equal tokens and other keys so get other content hashes. With
// an empty key it is Content(tokens).
func ContentExtra(tokens []uint32, key []byte) uint64 {
	c := Content(tokens)
	if len(key) == 0 {
		return c
	}
	var stack [512]byte
	var b []byte
	if 8+len(key) <= len(stack) {
		b = stack[:8+len(key)]
	} else {
		b = make([]byte, 8+len(key)) // keys this long are rare: a few identifiers make ~100 bytes
	}
	binary.LittleEndian.PutUint64(b, c)
	copy(b[8:], key)
	return xxh3.HashSeed(b, Seed)
}

// XXH3's 9-to-16-byte path with seed 1337 reduces to two constants derived from the
// default secret (bytes 24..55); the prefix chain always hashes exactly 16 bytes, so Next
// computes that path inline instead of going through the general entry point.
const (
	bitflip1 = (0x1f67b3b7a4a44072 ^ 0x78e5c0cc4ee679cb) + Seed
	bitflip2 = (0x2172ffcc7dd05a82 ^ 0x8e2443f7744608b8) - Seed
)

// Next extends a prefix hash by one block: XXH3-64(LE64(prev) ++ LE64(content), seed 1337).
func Next(prev, content uint64) uint64 {
	lo := prev ^ bitflip1
	hi := content ^ bitflip2
	mh, ml := bits.Mul64(lo, hi)
	x := 16 + bits.ReverseBytes64(lo) + hi + (mh ^ ml)
	x ^= x >> 37
	x *= 0x165667919e3779f9
	x ^= x >> 32
	return x
}

// nextPortable is Next's definition through the general XXH3 entry point; tests hold Next
// to it.
func nextPortable(prev, content uint64) uint64 {
	var b [16]byte
	binary.LittleEndian.PutUint64(b[:8], prev)
	binary.LittleEndian.PutUint64(b[8:], content)
	return xxh3.HashSeed(b[:], Seed)
}

// CheckBlockSize validates a block size in tokens.
func CheckBlockSize(blockSize int) error {
	if blockSize < 1 || blockSize > MaxBlockSize {
		return fmt.Errorf("%w: %d (want 1..%d)", ErrBlockSize, blockSize, MaxBlockSize)
	}
	return nil
}

// Blocks cuts tokens into blocks of blockSize ids, drops a trailing partial block, and
// appends each full block's content hash to dst. It allocates only when dst lacks
// capacity for len(tokens)/blockSize more hashes.
func Blocks(dst []uint64, tokens []uint32, blockSize int) ([]uint64, error) {
	if err := CheckBlockSize(blockSize); err != nil {
		return dst, err
	}
	n := len(tokens) / blockSize
	for i := 0; i < n; i++ {
		dst = append(dst, Content(tokens[i*blockSize:(i+1)*blockSize]))
	}
	return dst, nil
}

// Prefixes appends the rolling prefix hash of every position of content to dst:
// dst[i] names content[0..i]. The first is content[0] itself.
func Prefixes(dst []uint64, content []uint64) []uint64 {
	if len(content) == 0 {
		return dst
	}
	h := content[0]
	dst = append(dst, h)
	for _, c := range content[1:] {
		h = Next(h, c)
		dst = append(dst, h)
	}
	return dst
}
