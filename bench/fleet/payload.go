package fleet

import (
	"encoding/binary"
	"math"
)

// A vLLM KVEventBatch as msgspec encodes it (/work/shared/EVENTS.md §3; package
// kvevents decodes it): [ts float64, events, data_parallel_rank]. Events are
// encoded as vLLM v0.26.0 does (map form, the capture in EVENTS.md §3.2) or in the
// positional array form of the vLLM releases before map events (Encoding "array"). Everything
// appends to a caller's buffer: a batch costs no allocation once buffers have grown.

// Encodings of the events.
const (
	EncodingMap   = "map"
	EncodingArray = "array"
)

// mp appends msgpack items (smallest widths, as msgspec writes them).
type mp []byte

func (m mp) hdr(n int, fix, b16, b32 byte) mp {
	switch {
	case n < 16:
		return append(m, fix|byte(n))
	case n < 1<<16:
		return binary.BigEndian.AppendUint16(append(m, b16), uint16(n))
	}
	return binary.BigEndian.AppendUint32(append(m, b32), uint32(n))
}

func (m mp) arr(n int) mp { return m.hdr(n, 0x90, 0xdc, 0xdd) }
func (m mp) fmap(n int) mp {
	return m.hdr(n, 0x80, 0xde, 0xdf)
}
func (m mp) nil() mp { return append(m, 0xc0) }

func (m mp) str(s string) mp {
	switch n := len(s); {
	case n < 32:
		m = append(m, 0xa0|byte(n))
	case n < 1<<8:
		m = append(m, 0xd9, byte(n))
	default:
		m = binary.BigEndian.AppendUint16(append(m, 0xda), uint16(n))
	}
	return append(m, s...)
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

func (m mp) f64(v float64) mp {
	return binary.BigEndian.AppendUint64(append(m, 0xcb), math.Float64bits(v))
}

// batchEncoder writes one batch's payload: begin, then stored/removed events, then
// the payload is the encoder's bytes. The events array header is written for the
// count announced at begin.
type batchEncoder struct {
	enc       string
	blockSize int
}

// begin starts a batch of nEvents events at Unix time ts.
func (e batchEncoder) begin(dst []byte, ts float64, nEvents int) []byte {
	return []byte(mp(dst).arr(3).f64(ts).arr(nEvents))
}

// end closes a batch: the data-parallel rank (0: the fleet's engines are not DP).
func (e batchEncoder) end(dst []byte) []byte { return []byte(mp(dst).uint(0)) }

// stored appends a BlockStored of hashes (parent 0 with hasParent false: a root),
// the tokens of each block given by tokens(i, dst).
func (e batchEncoder) stored(dst []byte, hashes []uint64, parent uint64, hasParent bool, tokens func(i int, dst []byte) []byte) []byte {
	m := mp(dst)
	if e.enc == EncodingArray {
		// [tag, block_hashes, parent, token_ids, block_size, lora_id, medium, lora_name,
		//  extra_keys, group_idx, kv_cache_spec_kind, kv_cache_spec_sliding_window]
		m = m.arr(12).str("BlockStored")
	} else {
		m = m.fmap(11).str("type").str("BlockStored").str("block_hashes")
	}
	m = m.arr(len(hashes))
	for _, h := range hashes {
		m = m.uint(h)
	}
	if e.enc != EncodingArray {
		m = m.str("parent_block_hash")
	}
	if hasParent {
		m = m.uint(parent)
	} else {
		m = m.nil()
	}
	if e.enc != EncodingArray {
		m = m.str("token_ids")
	}
	m = m.arr(len(hashes) * e.blockSize)
	for i := range hashes {
		m = mp(tokens(i, m))
	}
	if e.enc == EncodingArray {
		m = m.uint(uint64(e.blockSize)).nil().str("GPU").nil()
		m = m.arr(len(hashes))
		for range hashes {
			m = m.nil()
		}
		return []byte(m.uint(0).str("full_attention").nil())
	}
	m = m.str("block_size").uint(uint64(e.blockSize)).str("lora_id").nil().str("medium").str("GPU").
		str("lora_name").nil().str("extra_keys").arr(len(hashes))
	for range hashes {
		m = m.nil()
	}
	return []byte(m.str("group_idx").uint(0).str("kv_cache_spec_kind").str("full_attention"))
}

// removed appends a BlockRemoved of hashes.
func (e batchEncoder) removed(dst []byte, hashes []uint64) []byte {
	m := mp(dst)
	if e.enc == EncodingArray {
		m = m.arr(4).str("BlockRemoved")
	} else {
		m = m.fmap(4).str("type").str("BlockRemoved").str("block_hashes")
	}
	m = m.arr(len(hashes))
	for _, h := range hashes {
		m = m.uint(h)
	}
	if e.enc == EncodingArray {
		return []byte(m.str("GPU").uint(0))
	}
	return []byte(m.str("medium").str("GPU").str("group_idx").uint(0))
}

// appendTokenIDs appends token ids as msgpack unsigned ints.
func appendTokenIDs(dst []byte, ids []uint32) []byte {
	m := mp(dst)
	for _, t := range ids {
		m = m.uint(uint64(t))
	}
	return []byte(m)
}
