package fakevllm

// Enc is the one msgpack encoder of vLLM batches in the module: the fake engines'
// batches (payload.go), the test vectors of the decoders' tests and the hostile peers'
// payloads are all written with it. It writes the smallest header and integer widths,
// as msgspec (vLLM's encoder) does.

import (
	"encoding/binary"
	"encoding/hex"
	"math"
	"strings"
)

// Enc is msgpack under construction; each method appends one item and returns the
// result, so that calls chain: Enc{}.Arr(2).Uint(1).Str("x").
type Enc []byte

func (m Enc) hdr(n int, fix, b16, b32 byte) Enc {
	switch {
	case n < 16:
		return append(m, fix|byte(n))
	case n < 1<<16:
		return binary.BigEndian.AppendUint16(append(m, b16), uint16(n))
	default:
		return binary.BigEndian.AppendUint32(append(m, b32), uint32(n))
	}
}

// Arr starts an array of n items.
func (m Enc) Arr(n int) Enc { return m.hdr(n, 0x90, 0xdc, 0xdd) }

// Map starts a map of n key/value pairs.
func (m Enc) Map(n int) Enc { return m.hdr(n, 0x80, 0xde, 0xdf) }

// Nil appends nil.
func (m Enc) Nil() Enc { return append(m, 0xc0) }

// Str appends a string.
func (m Enc) Str(s string) Enc {
	switch n := len(s); {
	case n < 32:
		m = append(m, 0xa0|byte(n))
	case n < 1<<8:
		m = append(m, 0xd9, byte(n))
	case n < 1<<16:
		m = binary.BigEndian.AppendUint16(append(m, 0xda), uint16(n))
	default:
		m = binary.BigEndian.AppendUint32(append(m, 0xdb), uint32(n))
	}
	return append(m, s...)
}

// Bin appends a byte string.
func (m Enc) Bin(b []byte) Enc {
	switch n := len(b); {
	case n < 1<<8:
		m = append(m, 0xc4, byte(n))
	case n < 1<<16:
		m = binary.BigEndian.AppendUint16(append(m, 0xc5), uint16(n))
	default:
		m = binary.BigEndian.AppendUint32(append(m, 0xc6), uint32(n))
	}
	return append(m, b...)
}

// Uint appends an unsigned integer in its smallest form.
func (m Enc) Uint(v uint64) Enc {
	switch {
	case v < 128:
		return append(m, byte(v))
	case v < 1<<8:
		return append(m, 0xcc, byte(v))
	case v < 1<<16:
		return binary.BigEndian.AppendUint16(append(m, 0xcd), uint16(v))
	case v < 1<<32:
		return binary.BigEndian.AppendUint32(append(m, 0xce), uint32(v))
	}
	return binary.BigEndian.AppendUint64(append(m, 0xcf), v)
}

// Int appends a signed integer in its smallest form.
func (m Enc) Int(v int64) Enc {
	switch {
	case v >= 0:
		return m.Uint(uint64(v))
	case v >= -32:
		return append(m, byte(int8(v)))
	case v >= math.MinInt8:
		return append(m, 0xd0, byte(int8(v)))
	case v >= math.MinInt16:
		return binary.BigEndian.AppendUint16(append(m, 0xd1), uint16(int16(v)))
	case v >= math.MinInt32:
		return binary.BigEndian.AppendUint32(append(m, 0xd2), uint32(int32(v)))
	}
	return binary.BigEndian.AppendUint64(append(m, 0xd3), uint64(v))
}

// F64 appends a float64.
func (m Enc) F64(v float64) Enc {
	return binary.BigEndian.AppendUint64(append(m, 0xcb), math.Float64bits(v))
}

// Raw appends bytes written in hex (spaces and newlines ignored).
func (m Enc) Raw(h string) Enc { return append(m, Unhex(h)...) }

// Add appends already-encoded bytes.
func (m Enc) Add(b []byte) Enc { return append(m, b...) }

// Uints appends an array of unsigned integers.
func (m Enc) Uints(vs ...uint64) Enc {
	m = m.Arr(len(vs))
	for _, v := range vs {
		m = m.Uint(v)
	}
	return m
}

// Tokens appends an array of token ids.
func (m Enc) Tokens(vs []uint32) Enc {
	m = m.Arr(len(vs))
	for _, v := range vs {
		m = m.Uint(uint64(v))
	}
	return m
}

// Unhex decodes hex, ignoring spaces, tabs and newlines; it panics on bad input (a
// broken test vector).
func Unhex(h string) []byte {
	h = strings.NewReplacer(" ", "", "\n", "", "\t", "").Replace(h)
	b, err := hex.DecodeString(h)
	if err != nil {
		panic(err)
	}
	return b
}
