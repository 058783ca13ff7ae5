package tokenize

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
)

// fileJSON is the part of a Hugging Face tokenizer.json this package reads.
type fileJSON struct {
	AddedTokens   []addedJSON     `json:"added_tokens"`
	Normalizer    json.RawMessage `json:"normalizer"`
	PreTokenizer  json.RawMessage `json:"pre_tokenizer"`
	PostProcessor json.RawMessage `json:"post_processor"`
	Decoder       json.RawMessage `json:"decoder"`
	Model         modelJSON       `json:"model"`
}

type addedJSON struct {
	ID         int    `json:"id"`
	Content    string `json:"content"`
	SingleWord bool   `json:"single_word"`
	LStrip     bool   `json:"lstrip"`
	RStrip     bool   `json:"rstrip"`
	Normalized bool   `json:"normalized"`
	Special    bool   `json:"special"`
}

type modelJSON struct {
	Type                    string           `json:"type"`
	Vocab                   map[string]int   `json:"vocab"`
	Merges                  json.RawMessage  `json:"merges"`
	UnkToken                *string          `json:"unk_token"`
	ContinuingSubwordPrefix *string          `json:"continuing_subword_prefix"`
	EndOfWordSuffix         *string          `json:"end_of_word_suffix"`
	FuseUnk                 bool             `json:"fuse_unk"`
	ByteFallback            bool             `json:"byte_fallback"`
	IgnoreMerges            bool             `json:"ignore_merges"`
	Dropout                 *json.RawMessage `json:"dropout"`
}

// componentJSON is any normalizer, pre-tokenizer, post-processor or decoder node: the
// union of the fields the supported types use.
type componentJSON struct {
	Type          string            `json:"type"`
	Normalizers   []json.RawMessage `json:"normalizers"`
	PreTokenizers []json.RawMessage `json:"pretokenizers"`
	Processors    []json.RawMessage `json:"processors"`
	Pattern       *patternJSON      `json:"pattern"`
	Content       string            `json:"content"`
	Prepend       string            `json:"prepend"`
	Behavior      string            `json:"behavior"`
	Invert        bool              `json:"invert"`
	AddPrefix     bool              `json:"add_prefix_space"`
	UseRegex      *bool             `json:"use_regex"`
	Replacement   string            `json:"replacement"`
	PrependScheme string            `json:"prepend_scheme"`
	Split         *bool             `json:"split"`
	Single        []templatePieceJS `json:"single"`
	Special       map[string]struct {
		IDs []int `json:"ids"`
	} `json:"special_tokens"`
}

type patternJSON struct {
	Regex  *string `json:"Regex"`
	String *string `json:"String"`
}

type templatePieceJS struct {
	SpecialToken *struct {
		ID string `json:"id"`
	} `json:"SpecialToken"`
	Sequence *struct {
		ID string `json:"id"`
	} `json:"Sequence"`
}

// parseMerges reads both serialisations of BPE merges: "a b" strings (tokenizers before
// 0.20) and [a, b] pairs (after; they allow spaces inside a token).
func parseMerges(raw json.RawMessage) ([][2]string, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return nil, nil
	}
	var pairs [][2]string
	if err := json.Unmarshal(raw, &pairs); err == nil {
		return pairs, nil
	}
	var lines []string
	if err := json.Unmarshal(raw, &lines); err != nil {
		return nil, fmt.Errorf("model.merges is neither [[a, b], ...] nor [\"a b\", ...]: %w", err)
	}
	pairs = make([][2]string, len(lines))
	for i, l := range lines {
		a, b, ok := strings.Cut(l, " ")
		if !ok {
			return nil, fmt.Errorf("model.merges[%d] %q has no space", i, l)
		}
		pairs[i] = [2]string{a, b}
	}
	return pairs, nil
}

// isNull says whether a component is absent (missing or JSON null).
func isNull(raw json.RawMessage) bool {
	return len(raw) == 0 || string(raw) == "null"
}

func parseComponent(raw json.RawMessage, what string) (componentJSON, error) {
	var c componentJSON
	if err := json.Unmarshal(raw, &c); err != nil {
		return c, fmt.Errorf("%s: %w", what, err)
	}
	if c.Type == "" {
		return c, fmt.Errorf("%s: no type", what)
	}
	return c, nil
}

var errUnsupported = errors.New("unsupported")
