package kvevents

import (
	"strconv"

	"github.com/kvindex/kvindex/hash"
	"github.com/kvindex/kvindex/internal/cbor"
)

// Extra keys (vLLM's extra_keys, one entry per block: None or a tuple of the block's
// non-token hash inputs) and the verbatim copies that checks of the engine's own block
// hashes need.
//
// # The content hash of a block with extra keys
//
// A block's entry, less a first element equal to the event's lora_name (the namespace
// already carries the adapter), is its content key: when it holds anything (multimodal
// identifiers, vLLM's cache salt on block 0, prompt-embedding digests), the block's
// content hash is hash.ContentExtra(tokens, CBOR(key)) instead of hash.Content(tokens),
// where CBOR is canonical CBOR (internal/cbor) of the remaining elements as an array. Two
// prompts with the same placeholder tokens but other images so get other content hashes.
// A router computes the same from the extra keys it gives /v1/match (package server).
//
// Elements CBOR cannot reproduce canonically here (floats, maps, ext) make the entry
// opaque: its content key is 0xff followed by the entry's msgpack bytes (0xff never
// starts a CBOR item, so an opaque key never equals a CBOR one) and BlockExtras holds
// an empty (non-nil) slice for it.

// opaqueTag starts an opaque content key.
const opaqueTag = 0xff

// cborOf appends the canonical CBOR of the msgpack value at r (consuming it) and reports
// whether it could be transcoded. depth bounds the nesting as skip does.
func cborOf(dst []byte, r *reader, depth int) ([]byte, bool) {
	if depth > r.maxDepth {
		return dst, false
	}
	k, e := r.peek()
	if e != rOK {
		return dst, false
	}
	switch k {
	case kNil:
		r.off++
		return cbor.AppendNull(dst), true
	case kBool:
		v := r.b[r.off] == 0xc3
		r.off++
		return cbor.AppendBool(dst, v), true
	case kInt:
		bits, neg, e := r.integer()
		if e != rOK {
			return dst, false
		}
		if neg {
			return cbor.AppendInt(dst, int64(bits)), true
		}
		return cbor.AppendUint(dst, bits), true
	case kStr:
		s, e := r.str()
		if e != rOK {
			return dst, false
		}
		return cbor.AppendText(dst, s), true
	case kBin:
		s, e := r.bytesOf(kBin)
		if e != rOK {
			return dst, false
		}
		return cbor.AppendBytes(dst, s), true
	case kArray:
		n, e := r.arrayLen()
		if e != rOK {
			return dst, false
		}
		dst = cbor.AppendArray(dst, n)
		for i := 0; i < n; i++ {
			var ok bool
			if dst, ok = cborOf(dst, r, depth+1); !ok {
				return dst, false
			}
		}
		return dst, true
	}
	return dst, false // float, map, ext: not reproduced
}

// blockExtras reads extra_keys (at off, not nil) of a stored event of nb blocks: it fills
// ev.BlockExtras and appends each block's content key to d.keys (with d.keyEnds marking
// where each ends; an empty key means a plain content hash). A list of another length
// than block_hashes is rejected: its keys cannot be told apart per block, and indexing
// the blocks by tokens alone would match prompts with other images.
func (d *Decoder) blockExtras(ev *Event, b *Batch, payload []byte, off, nb int, lora []byte) (Reason, string, bool) {
	r := d.at(payload, off)
	n, e := r.arrayLen()
	if e != rOK {
		return malformed(fExtraKeys, &r, "array of nil or arrays")
	}
	if n != nb {
		return ReasonMalformedField, "extra_keys has " + strconv.Itoa(n) + " entries, want one per block (" + strconv.Itoa(nb) + ")", false
	}
	d.keys, d.keyEnds = d.keys[:0], d.keyEnds[:0]
	start := len(b.extras)
	for i := 0; i < n; i++ {
		if r.nilNext() {
			b.extras = append(b.extras, nil)
			d.keyEnds = append(d.keyEnds, len(d.keys))
			continue
		}
		entryStart := r.off
		m, e := r.arrayLen()
		if e != rOK {
			b.extras = b.extras[:start]
			return malformed(fExtraKeys, &r, "nil or array (entry "+strconv.Itoa(i)+")")
		}
		// The whole entry, for checks of the engine's hash (vllmhash), then the content
		// key: the entry less a leading LoRA name.
		wholeStart := len(b.extraBytes)
		b.extraBytes = cbor.AppendArray(b.extraBytes, m)
		skipFirst := false
		if m > 0 && len(lora) > 0 {
			probe := r
			if s, e := probe.str(); e == rOK && string(s) == string(lora) {
				skipFirst = true
			}
		}
		// keyFrom: where in extraBytes the content key's elements start (after the
		// entry's head, or after its leading LoRA name).
		keyFrom := len(b.extraBytes)
		ok := true
		for j := 0; j < m && ok; j++ {
			b.extraBytes, ok = cborOf(b.extraBytes, &r, fieldDepth+2)
			if j == 0 && skipFirst {
				keyFrom = len(b.extraBytes)
			}
		}
		if !ok {
			// Opaque: skip the entry and key the block by its msgpack bytes.
			b.extraBytes = b.extraBytes[:wholeStart]
			r.off = entryStart
			if e := r.skip(fieldDepth + 1); e != rOK {
				b.extras = b.extras[:start]
				return malformed(fExtraKeys, &r, "a complete value")
			}
			b.extras = append(b.extras, b.extraBytes[wholeStart:wholeStart:wholeStart]) // empty, not nil
			d.keys = append(append(d.keys, opaqueTag), payload[entryStart:r.off]...)
			d.keyEnds = append(d.keyEnds, len(d.keys))
			continue
		}
		// A later append may move extraBytes; this slice keeps the bytes it has.
		b.extras = append(b.extras, b.extraBytes[wholeStart:len(b.extraBytes):len(b.extraBytes)])
		// Content key: the elements after the LoRA name, if any remain, as an array
		// (their CBOR is already in extraBytes).
		keep := m
		if skipFirst {
			keep--
		}
		if keep > 0 {
			d.keys = cbor.AppendArray(d.keys, keep)
			d.keys = append(d.keys, b.extraBytes[keyFrom:]...)
		}
		d.keyEnds = append(d.keyEnds, len(d.keys))
	}
	ev.BlockExtras = b.extras[start:len(b.extras):len(b.extras)]
	return 0, "", true
}

// contentsOf appends the content hash of each of the event's nb blocks to b.contents:
// hash.Content of its tokens, or hash.ContentExtra with its content key when it has one
// (keyed true: d.keys/d.keyEnds were filled by blockExtras).
func (d *Decoder) contentsOf(b *Batch, bs, nb int, keyed bool) {
	if u := d.cfg.BlockSize; d.cfg.Units && bs != u { // units of a larger block (Config.Units; no keys)
		for i := 0; i < nb*bs; i += u {
			b.contents = append(b.contents, hash.Content(d.tokens[i:i+u]))
		}
		return
	}
	from := 0
	for i := 0; i < nb; i++ {
		tok := d.tokens[i*bs : (i+1)*bs]
		if keyed {
			to := d.keyEnds[i]
			if to > from {
				b.contents = append(b.contents, hash.ContentExtra(tok, d.keys[from:to]))
				from = to
				continue
			}
		}
		b.contents = append(b.contents, hash.Content(tok))
	}
}

// verbatim copies what a check of the engine's own hashes needs (Config.Verbatim): the
// token ids, and the whole digests when every block hash (and the parent) is a bin of
// the same length.
func (d *Decoder) verbatim(ev *Event, b *Batch, payload []byte, at *[numFields]int, nb int) {
	ts := len(b.tokens)
	b.tokens = append(b.tokens, d.tokens...)
	ev.Tokens = b.tokens[ts:len(b.tokens):len(b.tokens)]

	r := d.at(payload, at[fBlockHashes])
	n, e := r.arrayLen() // read once already (hashes): n == nb
	if e != rOK || n == 0 || n != nb {
		return
	}
	ds, size := len(b.digests), -1
	for i := 0; i < n; i++ {
		v, e := r.bytesOf(kBin)
		if e != rOK || (size >= 0 && len(v) != size) || len(v) <= 8 {
			b.digests = b.digests[:ds]
			return
		}
		size = len(v)
		b.digests = append(b.digests, v...)
	}
	if at[fParent] >= 0 {
		pr := d.at(payload, at[fParent])
		if !pr.nilNext() {
			v, e := pr.bytesOf(kBin)
			if e != rOK || len(v) != size {
				b.digests = b.digests[:ds]
				return
			}
			b.digests = append(b.digests, v...)
			ev.ParentDigest = b.digests[len(b.digests)-size : len(b.digests) : len(b.digests)]
		}
	}
	ev.Digests = b.digests[ds : ds+n*size : ds+n*size]
	ev.DigestSize = size
}
