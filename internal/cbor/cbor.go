// Package cbor appends the few CBOR (RFC 8949) items kvindex needs, in the canonical form
// of RFC 7049 §3.9 that Python's cbor2.dumps(..., canonical=True) writes for them: every
// length and integer in its shortest head, definite lengths only. It covers unsigned and
// negative integers, byte and text strings, arrays, null and booleans: the values vLLM
// puts into a block hash's input (package vllmhash) and into a block's extra keys.
// Floats and maps are not covered (canonical CBOR reorders map keys and shortens floats;
// callers treat such values as not reproducible).
package cbor

// Major types.
const (
	majorUint  = 0
	majorNeg   = 1
	majorBytes = 2
	majorText  = 3
	majorArray = 4
)

// head appends an item head: major type and argument in the shortest form.
func head(dst []byte, major byte, n uint64) []byte {
	m := major << 5
	switch {
	case n < 24:
		return append(dst, m|byte(n))
	case n <= 0xff:
		return append(dst, m|24, byte(n))
	case n <= 0xffff:
		return append(dst, m|25, byte(n>>8), byte(n))
	case n <= 0xffffffff:
		return append(dst, m|26, byte(n>>24), byte(n>>16), byte(n>>8), byte(n))
	}
	return append(dst, m|27, byte(n>>56), byte(n>>48), byte(n>>40), byte(n>>32),
		byte(n>>24), byte(n>>16), byte(n>>8), byte(n))
}

// AppendUint appends an unsigned integer.
func AppendUint(dst []byte, v uint64) []byte { return head(dst, majorUint, v) }

// AppendInt appends a signed integer (major type 1 holds -1-v for negative v).
func AppendInt(dst []byte, v int64) []byte {
	if v >= 0 {
		return head(dst, majorUint, uint64(v))
	}
	return head(dst, majorNeg, uint64(-1-v))
}

// AppendNegative appends the negative integer -1-n: the whole range CBOR's major type 1
// holds, below what an int64 can name.
func AppendNegative(dst []byte, n uint64) []byte { return head(dst, majorNeg, n) }

// AppendBytes appends a byte string.
func AppendBytes(dst, b []byte) []byte { return append(head(dst, majorBytes, uint64(len(b))), b...) }

// AppendText appends a text string (the caller vouches that it is UTF-8).
func AppendText[T string | []byte](dst []byte, s T) []byte {
	return append(head(dst, majorText, uint64(len(s))), s...)
}

// AppendArray appends the head of an array of n items; the items follow.
func AppendArray(dst []byte, n int) []byte { return head(dst, majorArray, uint64(n)) }

// AppendNull appends null (Python's None).
func AppendNull(dst []byte) []byte { return append(dst, 0xf6) }

// AppendBool appends false or true.
func AppendBool(dst []byte, v bool) []byte {
	if v {
		return append(dst, 0xf5)
	}
	return append(dst, 0xf4)
}
