// Package vllmhash reproduces vLLM's prefix-caching block hashes for the sha256_cbor
// algorithm and for "sha256", vLLM's default (pickle.go), so that a router can check that the block hashes an engine publishes follow
// from the token ids (and extra keys) it publishes with them.
//
// # The definition
//
// Derived by reading vLLM's public source (vllm/v1/core/kv_cache_utils.py:
// init_none_hash, hash_block_tokens, generate_block_hash_extra_keys; vllm/utils/hashing.py:
// sha256_cbor); nothing here is copied from it.
//
//	sha256_cbor(x)  = SHA-256(cbor2.dumps(x, canonical=True))
//	NONE_HASH       = sha256_cbor(PYTHONHASHSEED)            the seed as a text string
//	hash(block)     = sha256_cbor((parent, tuple(token_ids), extra_keys))
//
// where parent is the 32-byte digest of the preceding block, NONE_HASH for a block that
// starts a sequence, and extra_keys is None or a tuple of the block's other inputs (the
// LoRA name, the multimodal identifiers of the inputs overlapping the block, the cache
// salt on block 0, prompt-embedding digests), in that order. The tuple is a CBOR array
// of 3 items: a byte string, an array of unsigned integers, and null or an array.
//
// "sha256" is the same over pickle.dumps(x, protocol=5) (pickle.go says which pickles are
// reproduced). Without PYTHONHASHSEED, NONE_HASH is 32 random bytes per engine process
// and nothing can be reproduced. "xxhash" and "xxhash_cbor" are not reproduced here.
//
// # What an event carries
//
// With VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=1 (vLLM's default) a published hash is the
// low 64 bits of the digest (its last 8 bytes, big-endian: Digest.Low64); with 0 it is
// the whole digest as msgpack bin. Either way a child's hash needs its parent's whole
// digest, which an int-hash event does not carry: a chain is recomputed from a root block
// (no parent) downwards, and a block whose parent's digest was never recomputed cannot
// be checked.
package vllmhash

import (
	"crypto/sha256"
	"encoding/binary"

	"github.com/kvindex/kvindex/internal/cbor"
)

// Size is the length of a digest in bytes.
const Size = sha256.Size

// Digest is a block hash as vLLM computes it (BlockHash).
type Digest [Size]byte

// Low64 is the digest as vLLM publishes it by default: its low 64 bits, that is its last
// 8 bytes read big-endian.
func (d *Digest) Low64() uint64 { return binary.BigEndian.Uint64(d[Size-8:]) }

// Root returns NONE_HASH for the given PYTHONHASHSEED value: the parent of every block
// that starts a sequence.
func Root(seed string) Digest {
	return sha256.Sum256(cbor.AppendText(nil, seed))
}

// Hasher computes block hashes with a reusable buffer; the zero Hasher is ready. Not safe
// for concurrent use.
type Hasher struct {
	buf  []byte
	body []byte // BlockPickle's frame body
}

// Block returns the hash of a block of tokens under parent. extra is the canonical CBOR
// encoding of the block's extra_keys tuple (an array), or nil for None. Once the buffer
// has grown to a block's size, Block does not allocate.
func (h *Hasher) Block(parent *Digest, tokens []uint32, extra []byte) Digest {
	b := cbor.AppendArray(h.buf[:0], 3)
	b = cbor.AppendBytes(b, parent[:])
	b = cbor.AppendArray(b, len(tokens))
	for _, t := range tokens {
		b = cbor.AppendUint(b, uint64(t))
	}
	if extra == nil {
		b = cbor.AppendNull(b)
	} else {
		b = append(b, extra...)
	}
	h.buf = b
	return sha256.Sum256(b)
}

// Chain returns the digests of consecutive blocks of blockSize tokens under parent (nil:
// the root, NONE_HASH for seed). extras, when not nil, holds each block's extra keys as
// for Block. It is the definition the incremental checks are tested against.
func Chain(seed string, parent *Digest, tokens []uint32, blockSize int, extras [][]byte) []Digest {
	p := Root(seed)
	if parent != nil {
		p = *parent
	}
	var h Hasher
	var out []Digest
	for i := 0; (i+1)*blockSize <= len(tokens); i++ {
		var x []byte
		if extras != nil {
			x = extras[i]
		}
		p = h.Block(&p, tokens[i*blockSize:(i+1)*blockSize], x)
		out = append(out, p)
	}
	return out
}
