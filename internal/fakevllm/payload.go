package fakevllm

// A vLLM KVEventBatch as msgspec encodes it (package kvevents decodes it;
// docs/engines.md describes it): [ts float64, events, data_parallel_rank]. Events are
// encoded as vLLM v0.26.0 does (map form, vLLM's kv_events.py) or in the
// positional array form of the vLLM releases before map events (Encoding "array"). Everything
// appends to a caller's buffer: a batch costs no allocation once buffers have grown.

// Encodings of the events.
const (
	EncodingMap   = "map"
	EncodingArray = "array"
)

// batchEncoder writes one batch's payload: begin, then stored/removed events, then
// the payload is the encoder's bytes. The events array header is written for the
// count announced at begin.
type batchEncoder struct {
	enc       string
	blockSize int
}

// begin starts a batch of nEvents events at Unix time ts.
func (e batchEncoder) begin(dst []byte, ts float64, nEvents int) []byte {
	return []byte(Enc(dst).Arr(3).F64(ts).Arr(nEvents))
}

// end closes a batch: the data-parallel rank (0: the fleet's engines are not DP).
func (e batchEncoder) end(dst []byte) []byte { return []byte(Enc(dst).Uint(0)) }

// stored appends a BlockStored of hashes (parent 0 with hasParent false: a root),
// the tokens of each block given by tokens(i, dst).
func (e batchEncoder) stored(dst []byte, hashes []uint64, parent uint64, hasParent bool, tokens func(i int, dst []byte) []byte) []byte {
	m := Enc(dst)
	if e.enc == EncodingArray {
		// [tag, block_hashes, parent, token_ids, block_size, lora_id, medium, lora_name,
		//  extra_keys, group_idx, kv_cache_spec_kind, kv_cache_spec_sliding_window]
		m = m.Arr(12).Str("BlockStored")
	} else {
		m = m.Map(11).Str("type").Str("BlockStored").Str("block_hashes")
	}
	m = m.Arr(len(hashes))
	for _, h := range hashes {
		m = m.Uint(h)
	}
	if e.enc != EncodingArray {
		m = m.Str("parent_block_hash")
	}
	if hasParent {
		m = m.Uint(parent)
	} else {
		m = m.Nil()
	}
	if e.enc != EncodingArray {
		m = m.Str("token_ids")
	}
	m = m.Arr(len(hashes) * e.blockSize)
	for i := range hashes {
		m = Enc(tokens(i, m))
	}
	if e.enc == EncodingArray {
		m = m.Uint(uint64(e.blockSize)).Nil().Str("GPU").Nil()
		m = m.Arr(len(hashes))
		for range hashes {
			m = m.Nil()
		}
		return []byte(m.Uint(0).Str("full_attention").Nil())
	}
	m = m.Str("block_size").Uint(uint64(e.blockSize)).Str("lora_id").Nil().Str("medium").Str("GPU").
		Str("lora_name").Nil().Str("extra_keys").Arr(len(hashes))
	for range hashes {
		m = m.Nil()
	}
	return []byte(m.Str("group_idx").Uint(0).Str("kv_cache_spec_kind").Str("full_attention"))
}

// removed appends a BlockRemoved of hashes.
func (e batchEncoder) removed(dst []byte, hashes []uint64) []byte {
	m := Enc(dst)
	if e.enc == EncodingArray {
		m = m.Arr(4).Str("BlockRemoved")
	} else {
		m = m.Map(4).Str("type").Str("BlockRemoved").Str("block_hashes")
	}
	m = m.Arr(len(hashes))
	for _, h := range hashes {
		m = m.Uint(h)
	}
	if e.enc == EncodingArray {
		return []byte(m.Str("GPU").Uint(0))
	}
	return []byte(m.Str("medium").Str("GPU").Str("group_idx").Uint(0))
}

// appendTokenIDs appends token ids as msgpack unsigned ints.
func appendTokenIDs(dst []byte, ids []uint32) []byte {
	m := Enc(dst)
	for _, t := range ids {
		m = m.Uint(uint64(t))
	}
	return []byte(m)
}
