package tokenize

import (
	"encoding/json"
	"errors"
	"fmt"
	"hash/maphash"
	"math"
	"regexp"

	"golang.org/x/text/unicode/norm"
)

// build turns tokenizer.json into a Tokenizer.
// Every component type it does not implement is an error naming it: a tokenizer that
// loads encodes exactly.
func build(tj []byte) (*Tokenizer, error) {
	var f fileJSON
	if err := json.Unmarshal(tj, &f); err != nil {
		return nil, fmt.Errorf("tokenize: tokenizer.json: %w", err)
	}
	t := &Tokenizer{}
	var err error
	if t.pre, t.model.byteLevel, err = buildPre(f.PreTokenizer); err != nil {
		return nil, fmt.Errorf("tokenize: pre_tokenizer: %w", err)
	}
	if t.norm, err = buildNorm(f.Normalizer, nil); err != nil {
		return nil, fmt.Errorf("tokenize: normalizer: %w", err)
	}
	if err = t.buildModel(&f.Model); err != nil {
		return nil, fmt.Errorf("tokenize: model: %w", err)
	}
	if err = t.buildAdded(f.AddedTokens); err != nil {
		return nil, fmt.Errorf("tokenize: added_tokens: %w", err)
	}
	if t.prefix, t.suffix, err = buildPost(f.PostProcessor); err != nil {
		return nil, fmt.Errorf("tokenize: post_processor: %w", err)
	}
	t.decode = buildDecoder(f.Decoder, t.model.byteLevel)
	return t, nil
}

func (t *Tokenizer) buildModel(mj *modelJSON) error {
	m := &t.model
	switch {
	case mj.Type != "BPE" && !(mj.Type == "" && mj.Vocab != nil && mj.Merges != nil):
		return fmt.Errorf("type %q: %w (BPE only)", mj.Type, errUnsupported)
	case mj.Dropout != nil && string(*mj.Dropout) != "null" && string(*mj.Dropout) != "0" && string(*mj.Dropout) != "0.0":
		return fmt.Errorf("dropout %s: %w", *mj.Dropout, errUnsupported)
	case mj.ContinuingSubwordPrefix != nil && *mj.ContinuingSubwordPrefix != "":
		return fmt.Errorf("continuing_subword_prefix: %w", errUnsupported)
	case mj.EndOfWordSuffix != nil && *mj.EndOfWordSuffix != "":
		return fmt.Errorf("end_of_word_suffix: %w", errUnsupported)
	case len(mj.Vocab) == 0:
		return errors.New("empty vocabulary")
	}
	m.byteFallback, m.ignoreMerges, m.fuseUnk, m.unk = mj.ByteFallback, mj.IgnoreMerges, mj.FuseUnk, -1
	size := 0
	for tok, id := range mj.Vocab {
		if id < 0 || id > math.MaxInt32 {
			return fmt.Errorf("token %q has id %d", tok, id)
		}
		size = max(size, id+1)
	}
	t.idText = make([]string, size)
	m.vocab = make(map[string]int32, len(mj.Vocab))
	for tok, id := range mj.Vocab {
		key := tok
		if m.byteLevel {
			raw, ok := byteLevelDecode(tok)
			if !ok {
				t.idText[id] = tok
				continue // not made of byte characters: BPE cannot produce it
			}
			key = string(raw)
		}
		m.vocab[key] = int32(id)
		t.idText[id] = key
	}
	for b := range 256 {
		m.byteIDs[b] = -1
		key := string([]byte{byte(b)})
		if !m.byteLevel {
			key = fmt.Sprintf("<0x%02X>", b)
		}
		if id, ok := m.vocab[key]; ok {
			m.byteIDs[b] = id
		}
	}
	if mj.UnkToken != nil && *mj.UnkToken != "" {
		id, ok := mj.Vocab[*mj.UnkToken]
		if !ok {
			return fmt.Errorf("unk_token %q is not in the vocabulary", *mj.UnkToken)
		}
		m.unk = int32(id)
	}
	m.vtab = newVocabTable(m.vocab)
	if err := t.buildMerges(mj); err != nil {
		return err
	}
	if !m.ignoreMerges {
		m.computeDirect(size)
	}
	m.cache = &pieceCache{seed: maphash.MakeSeed()}
	return nil
}

func (t *Tokenizer) buildMerges(mj *modelJSON) error {
	pairs, err := parseMerges(mj.Merges)
	if err != nil {
		return err
	}
	if len(pairs) > math.MaxInt32 {
		return fmt.Errorf("%d merges", len(pairs))
	}
	m := &t.model
	merges := make(map[uint64]uint64, len(pairs))
	for rank, p := range pairs {
		a, okA := mj.Vocab[p[0]]
		b, okB := mj.Vocab[p[1]]
		c, okC := mj.Vocab[p[0]+p[1]]
		if !okA || !okB || !okC {
			return fmt.Errorf("merge %d (%q %q) names a token missing from the vocabulary", rank, p[0], p[1])
		}
		merges[pairKey(int32(a), int32(b))] = uint64(rank)<<32 | uint64(c)
	}
	m.merges = newMergeTable(merges)
	return nil
}

func (t *Tokenizer) buildAdded(list []addedJSON) error {
	for _, a := range list {
		switch {
		case a.Content == "":
			continue
		case a.SingleWord:
			return fmt.Errorf("%q: single_word: %w", a.Content, errUnsupported)
		case a.ID < 0 || a.ID > math.MaxInt32:
			return fmt.Errorf("%q has id %d", a.Content, a.ID)
		}
		if a.ID >= len(t.idText) {
			t.idText = append(t.idText, make([]string, a.ID+1-len(t.idText))...)
		}
		t.idText[a.ID] = a.Content
		t.trie.insert(a.Content, int32(len(t.added)))
		t.added = append(t.added, addedToken{id: uint32(a.ID), content: a.Content, lstrip: a.LStrip, rstrip: a.RStrip, special: a.Special})
	}
	return nil
}

// buildNorm flattens a normalizer (Sequence, NFC/NFD/NFKC/NFKD, Prepend, Replace of a
// literal string) into ops.
func buildNorm(raw json.RawMessage, ops []normOp) ([]normOp, error) {
	if isNull(raw) {
		return ops, nil
	}
	c, err := parseComponent(raw, "normalizer")
	if err != nil {
		return nil, err
	}
	switch c.Type {
	case "Sequence":
		for _, n := range c.Normalizers {
			if ops, err = buildNorm(n, ops); err != nil {
				return nil, err
			}
		}
		return ops, nil
	case "NFC", "NFD", "NFKC", "NFKD":
		return append(ops, normOp{kind: normForm, form: map[string]norm.Form{"NFC": norm.NFC, "NFD": norm.NFD, "NFKC": norm.NFKC, "NFKD": norm.NFKD}[c.Type]}), nil
	case "Prepend":
		return append(ops, normOp{kind: normPrepend, to: c.Prepend}), nil
	case "Replace":
		if c.Pattern == nil || c.Pattern.String == nil || *c.Pattern.String == "" {
			return nil, fmt.Errorf("type Replace with a regex: %w", errUnsupported)
		}
		return append(ops, normOp{kind: normReplace, from: *c.Pattern.String, to: c.Content}), nil
	}
	return nil, fmt.Errorf("type %q: %w", c.Type, errUnsupported)
}

// buildPre reads the pre-tokenizer; byteLevel says a ByteLevel step is present.
func buildPre(raw json.RawMessage) (p preTokenizer, byteLevel bool, err error) {
	if isNull(raw) {
		return p, false, nil
	}
	c, err := parseComponent(raw, "pre_tokenizer")
	if err != nil {
		return p, false, err
	}
	steps := []json.RawMessage{raw}
	if c.Type == "Sequence" {
		steps = c.PreTokenizers
	}
	for _, s := range steps {
		c, err := parseComponent(s, "pre_tokenizer")
		if err != nil {
			return p, false, err
		}
		switch c.Type {
		case "Split":
			err = p.addSplit(c)
		case "ByteLevel":
			byteLevel = true
			err = p.addByteLevel(c)
		case "Metaspace":
			err = p.addMetaspace(c)
		default:
			err = fmt.Errorf("type %q: %w", c.Type, errUnsupported)
		}
		if err != nil {
			return p, false, err
		}
	}
	return p, byteLevel, nil
}

func (p *preTokenizer) addSplit(c componentJSON) error {
	switch {
	case p.hasSplit || p.meta:
		return fmt.Errorf("a second splitting step: %w", errUnsupported)
	case c.Behavior != "Isolated" || c.Invert:
		return fmt.Errorf("type Split with behavior %q (invert %v): %w (Isolated only)", c.Behavior, c.Invert, errUnsupported)
	case c.Pattern == nil:
		return errors.New("type Split without a pattern")
	}
	pattern := ""
	switch {
	case c.Pattern.Regex != nil:
		pattern = *c.Pattern.Regex
	case c.Pattern.String != nil:
		pattern = regexp.QuoteMeta(*c.Pattern.String)
	}
	sp, err := newSplitter(pattern)
	if err != nil {
		return fmt.Errorf("type Split: pattern %q is neither a known look-ahead pattern nor an RE2 one: %w", pattern, err)
	}
	p.split, p.hasSplit = sp, true
	return nil
}

func (p *preTokenizer) addByteLevel(c componentJSON) error {
	useRegex := c.UseRegex == nil || *c.UseRegex
	switch {
	case useRegex && (p.hasSplit || p.meta):
		return fmt.Errorf("ByteLevel use_regex after another split: %w", errUnsupported)
	case useRegex:
		p.split, p.hasSplit = splitter{style: styleGPT2}, true
		p.prefixSection = c.AddPrefix
	case c.AddPrefix && p.hasSplit:
		p.prefixPiece = true
	case c.AddPrefix:
		p.prefixSection = true
	}
	return nil
}

func (p *preTokenizer) addMetaspace(c componentJSON) error {
	if p.hasSplit || p.meta {
		return fmt.Errorf("type Metaspace after another split: %w", errUnsupported)
	}
	p.meta, p.metaRepl = true, c.Replacement
	if p.metaRepl == "" {
		p.metaRepl = "\u2581"
	}
	p.metaPrepend = prependAlways
	if !c.AddPrefix && c.PrependScheme == "" {
		p.metaPrepend = prependNever
	}
	switch c.PrependScheme {
	case "", "always":
	case "first":
		p.metaPrepend = prependFirst
	case "never":
		p.metaPrepend = prependNever
	default:
		return fmt.Errorf("type Metaspace with prepend_scheme %q: %w", c.PrependScheme, errUnsupported)
	}
	p.metaSplit = c.Split == nil || *c.Split
	return nil
}

// buildPost reads the special tokens a post-processor puts around a single text.
func buildPost(raw json.RawMessage) (prefix, suffix []uint32, err error) {
	if isNull(raw) {
		return nil, nil, nil
	}
	c, err := parseComponent(raw, "post_processor")
	if err != nil {
		return nil, nil, err
	}
	switch c.Type {
	case "ByteLevel":
		return nil, nil, nil // offsets only
	case "Sequence":
		for _, s := range c.Processors {
			p, q, err := buildPost(s)
			if err != nil {
				return nil, nil, err
			}
			prefix, suffix = append(prefix, p...), append(suffix, q...)
		}
		return prefix, suffix, nil
	case "TemplateProcessing":
		seen := false
		for _, piece := range c.Single {
			switch {
			case piece.Sequence != nil:
				seen = true
			case piece.SpecialToken != nil:
				st, ok := c.Special[piece.SpecialToken.ID]
				if !ok {
					return nil, nil, fmt.Errorf("template names %q, absent from special_tokens", piece.SpecialToken.ID)
				}
				for _, id := range st.IDs {
					if seen {
						suffix = append(suffix, uint32(id))
					} else {
						prefix = append(prefix, uint32(id))
					}
				}
			}
		}
		return prefix, suffix, nil
	}
	return nil, nil, fmt.Errorf("type %q: %w", c.Type, errUnsupported)
}
