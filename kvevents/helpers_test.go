package kvevents

import (
	"encoding/binary"
	"encoding/hex"
	"math"
	"strings"
	"testing"
)

// mp builds msgpack the way msgspec writes it (smallest int width, fixstr/fixarray where
// they fit). Test-only; the package itself never encodes.
type mp []byte

func (m mp) hdr(n int, fix, b16, b32 byte) mp {
	switch {
	case n < 16:
		return append(m, fix|byte(n))
	case n < 1<<16:
		return binary.BigEndian.AppendUint16(append(m, b16), uint16(n))
	default:
		return binary.BigEndian.AppendUint32(append(m, b32), uint32(n))
	}
}

func (m mp) arr(n int) mp { return m.hdr(n, 0x90, 0xdc, 0xdd) }
func (m mp) obj(n int) mp { return m.hdr(n, 0x80, 0xde, 0xdf) }
func (m mp) nil_() mp     { return append(m, 0xc0) }

func (m mp) str(s string) mp {
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

func (m mp) bin(b []byte) mp {
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

func (m mp) uint(v uint64) mp {
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

func (m mp) int(v int64) mp {
	switch {
	case v >= 0:
		return m.uint(uint64(v))
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

func (m mp) f64(v float64) mp {
	return binary.BigEndian.AppendUint64(append(m, 0xcb), math.Float64bits(v))
}

func (m mp) raw(h string) mp { return append(m, unhex(h)...) }
func (m mp) add(b []byte) mp { return append(m, b...) }

func (m mp) uints(vs ...uint64) mp {
	m = m.arr(len(vs))
	for _, v := range vs {
		m = m.uint(v)
	}
	return m
}

func (m mp) tokens(vs []uint32) mp {
	m = m.arr(len(vs))
	for _, v := range vs {
		m = m.uint(uint64(v))
	}
	return m
}

// batch wraps already-encoded events into [ts, events, rank].
func batch(rank int64, events ...mp) []byte {
	m := mp{}.arr(3).f64(tsGolden).arr(len(events))
	for _, e := range events {
		m = m.add(e)
	}
	return m.int(rank)
}

func unhex(h string) []byte {
	h = strings.NewReplacer(" ", "", "\n", "", "\t", "").Replace(h)
	b, err := hex.DecodeString(h)
	if err != nil {
		panic(err)
	}
	return b
}

// norm returns the events with empty slices made nil, for comparisons.
func norm(evs []Event) []Event {
	out := make([]Event, len(evs))
	for i, e := range evs {
		if len(e.Seqs) == 0 {
			e.Seqs = nil
		}
		if len(e.Contents) == 0 {
			e.Contents = nil
		}
		out[i] = e
	}
	return out
}

func mustNew(t testing.TB, cfg Config) *Decoder {
	t.Helper()
	d, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return d
}
