package vllmhash

import (
	"crypto/sha256"
	"encoding/binary"
	"errors"
)

// vLLM's default algorithm, "sha256", hashes pickle.dumps(x, protocol=HIGHEST_PROTOCOL)
// instead of CBOR. For the values a block hash takes (bytes, str, int, None, bool and
// tuples of them) CPython's pickler (protocol 5) writes, read from its output:
//
//	\x80 \x05                     PROTO 5
//	\x95 LE64(n)                  FRAME of the n bytes that follow (STOP included)
//	C len8 data | B LE32 data     bytes (SHORT_BINBYTES below 256 bytes), then MEMOIZE \x94
//	\x8c len8 utf8 | X LE32 utf8  str, then MEMOIZE
//	K b | M LE16 | J LE32 | \x8a n LE(n)   int: 0..255, 256..65535, int32, else LONG1
//	N, \x88, \x89                 None, True, False
//	) | items \x85 | \x86 | \x87 | ( items t     tuple of 0, 1, 2, 3, more items; then
//	                              MEMOIZE (not after the empty tuple)
//	.                             STOP
//
// Limits of this reproduction, where it reports "not reproducible" instead of guessing:
// one frame only (the pickler cuts frames at 64 KiB), and no two identical objects inside
// one block's input (the pickler would write a memo reference for the second).

// Algorithms.
const (
	// SHA256CBOR is prefix_caching_hash_algo "sha256_cbor".
	SHA256CBOR = "sha256_cbor"
	// SHA256Pickle is "sha256", vLLM's default: SHA-256 over pickle protocol 5.
	SHA256Pickle = "sha256"
)

// ErrNotReproducible reports an input this package cannot serialize as vLLM would.
var ErrNotReproducible = errors.New("vllmhash: input not reproducible")

const maxFrame = 64 << 10

func pickleInt(dst []byte, neg bool, mag uint64) []byte {
	switch {
	case !neg && mag <= 0xff:
		return append(dst, 'K', byte(mag))
	case !neg && mag <= 0xffff:
		return append(dst, 'M', byte(mag), byte(mag>>8))
	case !neg && mag <= 1<<31-1, neg && mag <= 1<<31:
		v := uint32(mag)
		if neg {
			v = uint32(-int64(mag))
		}
		return binary.LittleEndian.AppendUint32(append(dst, 'J'), v)
	}
	// LONG1: little-endian two's complement, as short as keeps the sign.
	var v [9]byte
	x := mag
	if neg {
		x = -mag // two's complement of the magnitude
	}
	binary.LittleEndian.PutUint64(v[:8], x)
	if neg {
		v[8] = 0xff
	}
	n := 9
	for n > 1 {
		top, next := v[n-1], v[n-2]
		if (top == 0 && next&0x80 == 0) || (top == 0xff && next&0x80 != 0) {
			n--
			continue
		}
		break
	}
	return append(append(dst, 0x8a, byte(n)), v[:n]...)
}

func pickleBytes(dst, b []byte) []byte {
	if len(b) < 256 {
		dst = append(dst, 'C', byte(len(b)))
	} else {
		dst = binary.LittleEndian.AppendUint32(append(dst, 'B'), uint32(len(b)))
	}
	return append(append(dst, b...), 0x94)
}

func pickleStr(dst, s []byte) []byte {
	if len(s) < 256 {
		dst = append(dst, 0x8c, byte(len(s)))
	} else {
		dst = binary.LittleEndian.AppendUint32(append(dst, 'X'), uint32(len(s)))
	}
	return append(append(dst, s...), 0x94)
}

// tupleOpen and tupleClose bracket a tuple of n items.
func tupleOpen(dst []byte, n int) []byte {
	switch n {
	case 0:
		return append(dst, ')')
	case 1, 2, 3:
		return dst
	}
	return append(dst, '(')
}

func tupleClose(dst []byte, n int) []byte {
	switch n {
	case 0:
		return dst
	case 1:
		return append(dst, 0x85, 0x94)
	case 2:
		return append(dst, 0x86, 0x94)
	case 3:
		return append(dst, 0x87, 0x94)
	}
	return append(dst, 't', 0x94)
}

// cborToPickle appends the pickle of the canonical CBOR item at c (as internal/cbor
// writes: arrays become tuples) and returns the rest of c.
func cborToPickle(dst, c []byte, depth int) ([]byte, []byte, error) {
	if len(c) == 0 || depth > 64 {
		return dst, nil, ErrNotReproducible
	}
	major, info := c[0]>>5, c[0]&31
	c = c[1:]
	var arg uint64
	switch {
	case info < 24:
		arg = uint64(info)
	case info <= 27:
		n := 1 << (info - 24)
		if len(c) < n {
			return dst, nil, ErrNotReproducible
		}
		for _, b := range c[:n] {
			arg = arg<<8 | uint64(b)
		}
		c = c[n:]
	default:
		return dst, nil, ErrNotReproducible
	}
	switch major {
	case 0:
		return pickleInt(dst, false, arg), c, nil
	case 1:
		if arg >= 1<<63 {
			return dst, nil, ErrNotReproducible // below -2^63: not in LONG1's 9 bytes here
		}
		return pickleInt(dst, true, arg+1), c, nil
	case 2, 3:
		if uint64(len(c)) < arg {
			return dst, nil, ErrNotReproducible
		}
		if major == 2 {
			return pickleBytes(dst, c[:arg]), c[arg:], nil
		}
		return pickleStr(dst, c[:arg]), c[arg:], nil
	case 4:
		if arg > uint64(len(c)) {
			return dst, nil, ErrNotReproducible
		}
		n := int(arg)
		dst = tupleOpen(dst, n)
		for i := 0; i < n; i++ {
			var err error
			if dst, c, err = cborToPickle(dst, c, depth+1); err != nil {
				return dst, nil, err
			}
		}
		return tupleClose(dst, n), c, nil
	case 7:
		switch info {
		case 20:
			return append(dst, 0x89), c, nil
		case 21:
			return append(dst, 0x88), c, nil
		case 22:
			return append(dst, 'N'), c, nil
		}
	}
	return dst, nil, ErrNotReproducible
}

// framed wraps body (STOP included) as PROTO 5 + one FRAME.
func framed(dst, body []byte) ([]byte, error) {
	if len(body) >= maxFrame {
		return dst, ErrNotReproducible
	}
	dst = append(dst, 0x80, 0x05, 0x95)
	dst = binary.LittleEndian.AppendUint64(dst, uint64(len(body)))
	return append(dst, body...), nil
}

// RootPickle returns NONE_HASH of the "sha256" algorithm: SHA-256 of the pickled seed.
func RootPickle(seed string) Digest {
	body := append(pickleStr(nil, []byte(seed)), '.')
	out, err := framed(nil, body)
	if err != nil {
		return Digest{} // a seed of 64 KiB: not a PYTHONHASHSEED
	}
	return sha256.Sum256(out)
}

// BlockPickle is Block for the "sha256" algorithm. extra is the block's extra keys as
// canonical CBOR (as Block takes them), nil for None.
func (h *Hasher) BlockPickle(parent *Digest, tokens []uint32, extra []byte) (Digest, error) {
	body := h.body[:0]
	body = pickleBytes(body, parent[:])
	body = tupleOpen(body, len(tokens))
	for _, t := range tokens {
		body = pickleInt(body, false, uint64(t))
	}
	body = tupleClose(body, len(tokens))
	if extra == nil {
		body = append(body, 'N')
	} else {
		var rest []byte
		var err error
		if body, rest, err = cborToPickle(body, extra, 0); err != nil || len(rest) != 0 {
			h.body = body
			return Digest{}, ErrNotReproducible
		}
	}
	body = append(tupleClose(body, 3), '.')
	h.body = body
	out, err := framed(h.buf[:0], body)
	h.buf = out
	if err != nil {
		return Digest{}, err
	}
	return sha256.Sum256(out), nil
}
