package tokenize

import (
	"encoding/json"
	"fmt"
	"strings"
)

// decoder turns ids back into text: byte-level entries are their raw bytes already;
// SentencePiece-style ones need the replacement turned back into spaces, <0xXX> into
// bytes, and the prepended space stripped.
type decoder struct {
	byteLevel    bool
	replace      string // the Metaspace replacement (▁), "" for none
	byteFallback bool
	stripLeft    int // spaces stripped from the start
	err          error
}

// buildDecoder reads the decoder; a type it does not implement makes Decode fail (it is
// not needed to encode).
func buildDecoder(raw json.RawMessage, byteLevel bool) decoder {
	d := decoder{byteLevel: byteLevel}
	if isNull(raw) {
		return d
	}
	d.err = d.add(raw)
	return d
}

func (d *decoder) add(raw json.RawMessage) error {
	c, err := parseComponent(raw, "decoder")
	if err != nil {
		return err
	}
	switch c.Type {
	case "Sequence":
		var list struct {
			Decoders []json.RawMessage `json:"decoders"`
		}
		if err := json.Unmarshal(raw, &list); err != nil {
			return err
		}
		for _, s := range list.Decoders {
			if err := d.add(s); err != nil {
				return err
			}
		}
	case "ByteLevel":
		d.byteLevel = true
	case "Replace":
		if c.Pattern == nil || c.Pattern.String == nil || c.Content != " " {
			return fmt.Errorf("decoder Replace other than to a space: %w", errUnsupported)
		}
		d.replace = *c.Pattern.String
	case "ByteFallback":
		d.byteFallback = true
	case "Fuse":
	case "Strip":
		var s struct {
			Content string `json:"content"`
			Start   int    `json:"start"`
		}
		if err := json.Unmarshal(raw, &s); err != nil || s.Content != " " {
			return fmt.Errorf("decoder Strip of %q: %w", s.Content, errUnsupported)
		}
		d.stripLeft = s.Start
	case "Metaspace":
		d.replace = c.Replacement
		if d.replace == "" {
			d.replace = "\u2581"
		}
		if c.PrependScheme != "never" && (c.PrependScheme != "" || c.AddPrefix) {
			d.stripLeft = 1
		}
	default:
		return fmt.Errorf("decoder type %q: %w", c.Type, errUnsupported)
	}
	return nil
}

// Decode appends the text of ids to dst. With skipSpecial, added tokens marked special
// are left out. Byte-level text is the exact bytes encoded (after normalization), so
// Decode(Encode(s)) is s for a tokenizer without a normalizer.
func (t *Tokenizer) Decode(dst []byte, ids []uint32, skipSpecial bool) ([]byte, error) {
	d := &t.decode
	if d.err != nil {
		return dst, fmt.Errorf("tokenize: %w", d.err)
	}
	start := len(dst)
	for _, id := range ids {
		if int(id) >= len(t.idText) {
			return dst, fmt.Errorf("tokenize: id %d is outside the vocabulary (%d)", id, len(t.idText))
		}
		if skipSpecial && t.isSpecial(id) {
			continue
		}
		s := t.idText[id]
		if b, ok := d.fallbackByte(s); ok {
			dst = append(dst, b)
			continue
		}
		if d.replace != "" && !t.isAdded(id) {
			dst = append(dst, strings.ReplaceAll(s, d.replace, " ")...)
			continue
		}
		dst = append(dst, s...)
	}
	for k := 0; k < d.stripLeft && len(dst) > start && dst[start] == ' '; k++ {
		dst = append(dst[:start], dst[start+1:]...)
	}
	return dst, nil
}

func (d *decoder) fallbackByte(s string) (byte, bool) {
	if !d.byteFallback || len(s) != 6 || !strings.HasPrefix(s, "<0x") || s[5] != '>' {
		return 0, false
	}
	var b byte
	if _, err := fmt.Sscanf(s[3:5], "%02X", &b); err != nil {
		return 0, false
	}
	return b, true
}

func (t *Tokenizer) isAdded(id uint32) bool {
	for i := range t.added {
		if t.added[i].id == id {
			return true
		}
	}
	return false
}

func (t *Tokenizer) isSpecial(id uint32) bool {
	for i := range t.added {
		if t.added[i].id == id {
			return t.added[i].special
		}
	}
	return false
}
