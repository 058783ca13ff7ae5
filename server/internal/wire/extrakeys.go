package wire

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"unicode/utf8"

	"github.com/kvindex/kvindex/hash"
	"github.com/kvindex/kvindex/internal/cbor"
)

// Per-block extra keys of a /v1/match request: the inputs other than tokens that the
// engine hashed into each block (multimodal identifiers, vLLM's cache salt on block 0,
// prompt-embedding digests), as vLLM's generate_block_hash_extra_keys gives them, less
// the LoRA name (lora_name names the namespace instead):
//
//	"extra_keys": [ ["<mm_hash of image 1>"], ["<mm_hash of image 1>", "<mm_hash of image 2>"], null, ... ]
//
// Element i belongs to block i; null or [] means none; the list may be shorter than the
// blocks (the rest have none). A key is a string, an integer, an array of keys (older
// vLLM's (mm_hash, offset) pairs: ["<mm_hash>", 7]), or {"bytes_hex": "..."} for a byte
// string. A block with keys gets the content hash
//
//	hash.ContentExtra(tokens, CBOR(keys)) = XXH3-64(seed 1337, LE64(hash.Content(tokens)) ++ CBOR(keys))
//
// with CBOR the canonical encoding of the block's key list as an array, which is what
// the decoder (package kvevents) computes from the block's extra_keys entry in an event:
// the same prompt with the same images matches, the same placeholder tokens with another
// image do not. The golden vectors are in testdata/vllmhash/vectors.json ("contents").

// Bounds of extra keys in one request. They hold before anything is decoded: the
// entries are counted (at most one per block of the query) and each entry's JSON is
// bounded (maxEntryJSON) by a scan of the raw value, and only then is each entry decoded,
// one at a time, so a hostile list costs what its query's blocks allow (an oversized
// list of 1 MiB cost ~0.4 s of CPU and ~35 MB when the whole value was decoded first).
const (
	maxExtraDepth = 8
	// MaxKeyBytes bounds the CBOR bytes of one block's keys.
	MaxKeyBytes = 4096
	// maxEntryJSON bounds one entry's JSON: every CBOR key byte is at most six JSON
	// bytes (a \u00XX escape, a hex digit pair is two) plus punctuation.
	maxEntryJSON = 8 * MaxKeyBytes
)

// scanValue returns the offset past the JSON value at b[i] (strings, arrays, objects and
// scalars), checking only its bracket structure; the value is decoded afterwards.
func scanValue(b []byte, i int) (int, error) {
	depth := 0
	for j := i; j < len(b); j++ {
		switch c := b[j]; c {
		case '"':
			end, err := scanString(b, j)
			if err != nil {
				return 0, err
			}
			j = end - 1
			if depth == 0 {
				return end, nil
			}
		case '[', '{':
			depth++
			if depth > maxExtraDepth+2 {
				return 0, errors.New("nested too deep")
			}
		case ']', '}':
			if depth == 0 { // the end of a scalar at the top level
				return j, nil
			}
			depth--
			if depth == 0 {
				return j + 1, nil
			}
		case ',':
			if depth == 0 {
				return j, nil
			}
		default:
			if depth == 0 && isSpace(c) {
				return j, nil
			}
		}
	}
	if depth == 0 {
		return len(b), nil
	}
	return 0, fmt.Errorf("%w: unterminated value", ErrSyntax)
}

// ParseExtraKeys decodes the extra_keys value raw into each block's CBOR key (nil:
// none), for a query of nb blocks.
func ParseExtraKeys(raw []byte, nb int) ([][]byte, error) {
	if bytes.Equal(raw, []byte("null")) {
		return nil, nil
	}
	entries, err := splitEntries(raw, nb)
	if err != nil {
		return nil, err
	}
	out := make([][]byte, len(entries))
	for i, e := range entries {
		// Numbers stay json.Number, so integers of 64 bits are exact.
		dec := json.NewDecoder(bytes.NewReader(e))
		dec.UseNumber()
		var v any
		if err := dec.Decode(&v); err != nil {
			return nil, fmt.Errorf("entry %d: %v", i, err)
		}
		if v == nil {
			continue
		}
		list, ok := v.([]any)
		if !ok {
			return nil, fmt.Errorf("entry %d: want null or an array of keys", i)
		}
		if len(list) == 0 {
			continue
		}
		key, err := appendKey(nil, list, 1)
		if err != nil {
			return nil, fmt.Errorf("entry %d: %v", i, err)
		}
		if len(key) > MaxKeyBytes {
			return nil, fmt.Errorf("entry %d: keys of %d bytes exceed %d", i, len(key), MaxKeyBytes)
		}
		out[i] = key
	}
	return out, nil
}

// splitEntries returns the raw JSON of each entry of the array raw, refusing more than
// nb entries, or an entry over maxEntryJSON bytes, as soon as the scan meets it.
func splitEntries(raw []byte, nb int) ([][]byte, error) {
	const want = "want an array with one entry per block"
	i := skipSpace(raw, 0)
	if i >= len(raw) || raw[i] != '[' {
		return nil, fmt.Errorf("%s", want)
	}
	i = skipSpace(raw, i+1)
	var out [][]byte
	done := func(i int) ([][]byte, error) {
		if skipSpace(raw, i+1) != len(raw) {
			return nil, fmt.Errorf("%s: trailing data at offset %d", want, i+1)
		}
		return out, nil
	}
	if i < len(raw) && raw[i] == ']' {
		return done(i)
	}
	for {
		if len(out) == nb {
			return nil, fmt.Errorf("more than %d entries for %d blocks", nb, nb)
		}
		end, err := scanValue(raw, i)
		if err != nil {
			return nil, fmt.Errorf("%s: %v", want, err)
		}
		if end == i {
			return nil, fmt.Errorf("%s: empty entry at offset %d", want, i)
		}
		if end-i > maxEntryJSON {
			return nil, fmt.Errorf("entry %d: %d bytes of JSON (at most %d)", len(out), end-i, maxEntryJSON)
		}
		out = append(out, raw[i:end])
		i = skipSpace(raw, end)
		switch {
		case i < len(raw) && raw[i] == ',':
			i = skipSpace(raw, i+1)
		case i < len(raw) && raw[i] == ']':
			return done(i)
		default:
			return nil, fmt.Errorf("%s: want ',' or ']' at offset %d", want, i)
		}
	}
}

// appendKey appends the canonical CBOR of one JSON key value.
func appendKey(dst []byte, v any, depth int) ([]byte, error) {
	if depth > maxExtraDepth {
		return nil, errors.New("keys nested too deep")
	}
	switch x := v.(type) {
	case string:
		if !utf8.ValidString(x) {
			return nil, errors.New("key is not UTF-8")
		}
		return cbor.AppendText(dst, x), nil
	case json.Number:
		if n, err := x.Int64(); err == nil {
			return cbor.AppendInt(dst, n), nil
		}
		if u, err := strconv.ParseUint(string(x), 10, 64); err == nil {
			return cbor.AppendUint(dst, u), nil
		}
		return nil, fmt.Errorf("key %s is not an integer of 64 bits (floats are not reproduced)", x)
	case bool:
		return cbor.AppendBool(dst, x), nil
	case []any:
		dst = cbor.AppendArray(dst, len(x))
		for _, e := range x {
			var err error
			if dst, err = appendKey(dst, e, depth+1); err != nil {
				return nil, err
			}
		}
		return dst, nil
	case map[string]any:
		h, ok := x["bytes_hex"].(string)
		if !ok || len(x) != 1 {
			return nil, errors.New(`an object key must be {"bytes_hex": "..."}`)
		}
		b, err := hex.DecodeString(h)
		if err != nil {
			return nil, fmt.Errorf("bytes_hex: %v", err)
		}
		return cbor.AppendBytes(dst, b), nil
	case nil:
		return cbor.AppendNull(dst), nil
	}
	return nil, fmt.Errorf("unsupported key %v", v)
}

// ContentsWithKeys appends the content hash of each full block of toks to dst, with the
// block's extra keys where it has them.
func ContentsWithKeys(dst []uint64, toks []uint32, blockSize int, keys [][]byte) []uint64 {
	n := len(toks) / blockSize
	for i := 0; i < n; i++ {
		t := toks[i*blockSize : (i+1)*blockSize]
		if i < len(keys) && len(keys[i]) > 0 {
			dst = append(dst, hash.ContentExtra(t, keys[i]))
			continue
		}
		dst = append(dst, hash.Content(t))
	}
	return dst
}
