package kvevents

import (
	"encoding/binary"
	"math"
)

// This file is a minimal msgpack reader: just what the KV-event payload needs, written
// against the msgpack spec so that hostile input is handled by code we control. Every
// length read from a header is checked against the bytes that remain before it is used,
// so a header that claims 2^32 elements fails at once instead of driving an allocation
// or a long loop. The reader never allocates.

// rerr is a reader failure; the Decoder turns it into a public error with an offset.
type rerr uint8

const (
	rOK      rerr = iota
	rTrunc        // the value runs past the end of the payload
	rBadByte      // 0xc1, the one byte msgpack never uses
	rType         // a value of another msgpack type than the caller wants
	rRange        // an integer outside the range the caller wants
	rDepth        // containers nested deeper than the limit
)

func (e rerr) String() string {
	switch e {
	case rTrunc:
		return "truncated value"
	case rBadByte:
		return "invalid byte 0xc1"
	case rType:
		return "unexpected msgpack type"
	case rRange:
		return "integer out of range"
	case rDepth:
		return "nesting too deep"
	}
	return "ok"
}

// kind is the msgpack type family of a value, read from its first byte.
type kind uint8

const (
	kInvalid kind = iota
	kNil
	kBool
	kInt
	kFloat
	kStr
	kBin
	kArray
	kMap
	kExt
)

func (k kind) String() string {
	switch k {
	case kNil:
		return "nil"
	case kBool:
		return "bool"
	case kInt:
		return "int"
	case kFloat:
		return "float"
	case kStr:
		return "str"
	case kBin:
		return "bin"
	case kArray:
		return "array"
	case kMap:
		return "map"
	case kExt:
		return "ext"
	}
	return "invalid"
}

// kinds maps a value's first byte to its kind.
var kinds = func() (t [256]kind) {
	for i := range t {
		t[i] = classify(byte(i))
	}
	return t
}()

func kindOf(c byte) kind { return kinds[c] }

func classify(c byte) kind {
	switch {
	case c <= 0x7f || c >= 0xe0:
		return kInt
	case c <= 0x8f:
		return kMap
	case c <= 0x9f:
		return kArray
	case c <= 0xbf:
		return kStr
	}
	switch c {
	case 0xc0:
		return kNil
	case 0xc2, 0xc3:
		return kBool
	case 0xc4, 0xc5, 0xc6:
		return kBin
	case 0xc7, 0xc8, 0xc9, 0xd4, 0xd5, 0xd6, 0xd7, 0xd8:
		return kExt
	case 0xca, 0xcb:
		return kFloat
	case 0xcc, 0xcd, 0xce, 0xcf, 0xd0, 0xd1, 0xd2, 0xd3:
		return kInt
	case 0xd9, 0xda, 0xdb:
		return kStr
	case 0xdc, 0xdd:
		return kArray
	case 0xde, 0xdf:
		return kMap
	}
	return kInvalid // 0xc1
}

// reader walks one payload. b is never written; off only grows.
type reader struct {
	b        []byte
	off      int
	maxDepth int // deepest container nesting skip accepts; the batch array is depth 1
}

func (r *reader) left() uint64 { return uint64(len(r.b) - r.off) }

// peek returns the kind of the next value without consuming it.
func (r *reader) peek() (kind, rerr) {
	if r.off >= len(r.b) {
		return kInvalid, rTrunc
	}
	k := kindOf(r.b[r.off])
	if k == kInvalid {
		return k, rBadByte
	}
	return k, rOK
}

// uintN reads an n-byte big-endian unsigned integer after the format byte at r.off.
// It does not move r.off; callers advance by 1+n on success.
func (r *reader) uintN(n int) (uint64, rerr) {
	if r.left() < uint64(1+n) {
		return 0, rTrunc
	}
	p := r.b[r.off+1 : r.off+1+n]
	switch n {
	case 1:
		return uint64(p[0]), rOK
	case 2:
		return uint64(binary.BigEndian.Uint16(p)), rOK
	case 4:
		return uint64(binary.BigEndian.Uint32(p)), rOK
	default:
		return binary.BigEndian.Uint64(p), rOK
	}
}

// containerLen reads an array or map header of the wanted kind and returns its element
// count (pairs for a map). The count is checked against the remaining bytes: every
// element takes at least one byte, so a larger claim can only be a truncated or hostile
// payload, and it is reported as truncated before anything is sized by it.
func (r *reader) containerLen(want kind) (int, rerr) {
	k, e := r.peek()
	if e != rOK {
		return 0, e
	}
	if k != want {
		return 0, rType
	}
	c := r.b[r.off]
	var n uint64
	var hdr int
	switch {
	case c&0xf0 == 0x80 || c&0xf0 == 0x90:
		n, hdr = uint64(c&0x0f), 1
	case c == 0xdc || c == 0xde:
		v, e := r.uintN(2)
		if e != rOK {
			return 0, e
		}
		n, hdr = v, 3
	default: // 0xdd, 0xdf
		v, e := r.uintN(4)
		if e != rOK {
			return 0, e
		}
		n, hdr = v, 5
	}
	per := uint64(1)
	if want == kMap {
		per = 2
	}
	if n*per > r.left()-uint64(hdr) {
		return 0, rTrunc
	}
	r.off += hdr
	return int(n), rOK
}

func (r *reader) arrayLen() (int, rerr) { return r.containerLen(kArray) }
func (r *reader) mapLen() (int, rerr)   { return r.containerLen(kMap) }

// rawLen reads the header of a str, bin or ext value and returns the header size and the
// payload size (for ext, the payload includes the type byte).
func (r *reader) rawLen() (hdr int, n uint64, e rerr) {
	c := r.b[r.off]
	switch {
	case c >= 0xa0 && c <= 0xbf:
		return 1, uint64(c & 0x1f), rOK
	case c == 0xc4 || c == 0xd9:
		n, e = r.uintN(1)
		return 2, n, e
	case c == 0xc5 || c == 0xda:
		n, e = r.uintN(2)
		return 3, n, e
	case c == 0xc6 || c == 0xdb:
		n, e = r.uintN(4)
		return 5, n, e
	case c == 0xc7:
		n, e = r.uintN(1)
		return 2, n + 1, e
	case c == 0xc8:
		n, e = r.uintN(2)
		return 3, n + 1, e
	case c == 0xc9:
		n, e = r.uintN(4)
		return 5, n + 1, e
	case c >= 0xd4 && c <= 0xd8:
		return 1, 1 + (uint64(1) << (c - 0xd4)), rOK
	}
	return 0, 0, rType
}

// bytesOf reads a str (want == kStr) or bin (want == kBin) value and returns its bytes,
// aliasing the payload.
func (r *reader) bytesOf(want kind) ([]byte, rerr) {
	k, e := r.peek()
	if e != rOK {
		return nil, e
	}
	if k != want {
		return nil, rType
	}
	hdr, n, e := r.rawLen()
	if e != rOK {
		return nil, e
	}
	if n > r.left()-uint64(hdr) {
		return nil, rTrunc
	}
	start := r.off + hdr
	r.off = start + int(n)
	return r.b[start:r.off:r.off], rOK
}

// str reads a str value.
func (r *reader) str() ([]byte, rerr) { return r.bytesOf(kStr) }

// nilNext consumes a nil and reports true if the next value is nil.
func (r *reader) nilNext() bool {
	if r.off < len(r.b) && r.b[r.off] == 0xc0 {
		r.off++
		return true
	}
	return false
}

// integer reads any msgpack integer. bits is the value as a two's-complement uint64 (a
// negative value is sign-extended), neg reports whether the value is below zero.
func (r *reader) integer() (bits uint64, neg bool, e rerr) {
	k, e := r.peek()
	if e != rOK {
		return 0, false, e
	}
	if k != kInt {
		return 0, false, rType
	}
	c := r.b[r.off]
	switch {
	case c <= 0x7f:
		r.off++
		return uint64(c), false, rOK
	case c >= 0xe0:
		r.off++
		return uint64(int64(int8(c))), true, rOK
	}
	var n int
	switch c {
	case 0xcc, 0xd0:
		n = 1
	case 0xcd, 0xd1:
		n = 2
	case 0xce, 0xd2:
		n = 4
	default: // 0xcf, 0xd3
		n = 8
	}
	v, e := r.uintN(n)
	if e != rOK {
		return 0, false, e
	}
	r.off += 1 + n
	if c >= 0xd0 { // signed: sign-extend from n bytes
		shift := uint(64 - 8*n)
		s := int64(v<<shift) >> shift
		return uint64(s), s < 0, rOK
	}
	return v, false, rOK
}

// intIn reads an integer and checks it lies in [lo, hi].
func (r *reader) intIn(lo, hi int64) (int64, rerr) {
	save := r.off
	bits, neg, e := r.integer()
	if e != rOK {
		return 0, e
	}
	if !neg && bits > math.MaxInt64 {
		r.off = save
		return 0, rRange
	}
	v := int64(bits)
	if v < lo || v > hi {
		r.off = save
		return 0, rRange
	}
	return v, rOK
}

// number reads an integer or a float as float64.
func (r *reader) number() (float64, rerr) {
	k, e := r.peek()
	if e != rOK {
		return 0, e
	}
	switch k {
	case kFloat:
		c := r.b[r.off]
		if c == 0xca {
			v, e := r.uintN(4)
			if e != rOK {
				return 0, e
			}
			r.off += 5
			return float64(math.Float32frombits(uint32(v))), rOK
		}
		v, e := r.uintN(8)
		if e != rOK {
			return 0, e
		}
		r.off += 9
		return math.Float64frombits(v), rOK
	case kInt:
		bits, neg, e := r.integer()
		if e != rOK {
			return 0, e
		}
		if neg {
			return float64(int64(bits)), rOK
		}
		return float64(bits), rOK
	}
	return 0, rType
}

// blockHash reads a block hash: an integer of any width (a negative one is taken as its
// two's-complement uint64), or a bin value folded as vLLM's maybe_convert_block_hash does:
// int.from_bytes(b, "big") & (2**64-1), i.e. the last 8 bytes big-endian, a shorter value
// left-padded with zeros (so an empty bin is 0). Strings, floats and the rest are rType.
func (r *reader) blockHash() (uint64, rerr) {
	k, e := r.peek()
	if e != rOK {
		return 0, e
	}
	switch k {
	case kInt:
		bits, _, e := r.integer()
		return bits, e
	case kBin:
		b, e := r.bytesOf(kBin)
		if e != rOK {
			return 0, e
		}
		if len(b) > 8 {
			b = b[len(b)-8:]
		}
		var v uint64
		for _, x := range b {
			v = v<<8 | uint64(x)
		}
		return v, rOK
	}
	return 0, rType
}

// skip consumes one complete value of any type. depth is the nesting depth the value sits
// at (the batch array is 1); a container deeper than r.maxDepth fails with rDepth, which
// bounds the recursion.
func (r *reader) skip(depth int) rerr {
	k, e := r.peek()
	if e != rOK {
		return e
	}
	switch k {
	case kNil, kBool:
		r.off++
		return rOK
	case kInt:
		_, _, e := r.integer()
		return e
	case kFloat:
		_, e := r.number()
		return e
	case kStr, kBin, kExt:
		hdr, n, e := r.rawLen()
		if e != rOK {
			return e
		}
		if n > r.left()-uint64(hdr) {
			return rTrunc
		}
		r.off += hdr + int(n)
		return rOK
	}
	if depth > r.maxDepth {
		return rDepth
	}
	n, e := r.containerLen(k)
	if e != rOK {
		return e
	}
	if k == kMap {
		n *= 2
	}
	for i := 0; i < n; i++ {
		// An element that is a nil, a bool or an integer whose bytes are all there is
		// skipped here, as skip would (token_ids are thousands of them per batch); any
		// other, or a truncated one, goes through skip.
		if r.off < len(r.b) {
			if w := int(scalarWidth[r.b[r.off]]); w != 0 && w <= len(r.b)-r.off {
				r.off += w
				continue
			}
		}
		if e := r.skip(depth + 1); e != rOK {
			return e
		}
	}
	return rOK
}

// scalarWidth is, per format byte, the whole width of a nil, a bool or an integer that
// starts with it (format byte included), and 0 for every other kind.
var scalarWidth = func() (w [256]uint8) {
	for c := range 256 {
		switch {
		case c <= 0x7f || c >= 0xe0 || c == 0xc0 || c == 0xc2 || c == 0xc3:
			w[c] = 1
		case c == 0xcc || c == 0xd0:
			w[c] = 2
		case c == 0xcd || c == 0xd1:
			w[c] = 3
		case c == 0xce || c == 0xd2:
			w[c] = 5
		case c == 0xcf || c == 0xd3:
			w[c] = 9
		}
	}
	return w
}()

// uint32Fast reads an unsigned integer below 2^32 in the encodings a publisher uses for
// token ids (positive fixint, uint 8, 16 and 32) when all its bytes are there, and
// reports false without moving otherwise: the caller then reads it with intIn, which
// gives the same value for these and the errors for the rest.
func (r *reader) uint32Fast() (uint32, bool) {
	b := r.b[r.off:]
	if len(b) == 0 {
		return 0, false
	}
	switch c := b[0]; {
	case c <= 0x7f:
		r.off++
		return uint32(c), true
	case c == 0xcc && len(b) >= 2:
		r.off += 2
		return uint32(b[1]), true
	case c == 0xcd && len(b) >= 3:
		r.off += 3
		return uint32(binary.BigEndian.Uint16(b[1:3])), true
	case c == 0xce && len(b) >= 5:
		r.off += 5
		return binary.BigEndian.Uint32(b[1:5]), true
	}
	return 0, false
}
