package tokenize

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"unicode"
	"unicode/utf8"
)

// Defaults and bounds of Config.
const (
	DefaultMaxInputBytes = 4 << 20
	MaxMaxInputBytes     = 256 << 20
	// maxFileBytes bounds tokenizer.json (the largest common ones, Qwen's and Gemma's,
	// are 11 and 33 MB).
	maxFileBytes = 256 << 20
)

// ErrTooLong is returned for a text longer than Config.MaxInputBytes.
var ErrTooLong = errors.New("tokenize: text longer than the configured maximum")

// Config says where a tokenizer comes from. Zero values mean the defaults.
type Config struct {
	// Dir is a model folder holding tokenizer.json (LoadModel also reads its chat
	// template).
	Dir string
	// TokenizerJSON is tokenizer.json's content, used instead of Dir.
	TokenizerJSON []byte
	// MaxInputBytes bounds the text one Encode call accepts (default 4 MiB, at most
	// 256 MiB).
	MaxInputBytes int
}

// Tokenizer encodes text into token ids as Hugging Face's tokenizers do for the same
// tokenizer.json. It is immutable after New: any number of goroutines may call it.
type Tokenizer struct {
	model     bpe
	norm      []normOp
	pre       preTokenizer
	trie      addedTrie
	added     []addedToken
	prefix    []uint32 // the post-processor's special tokens before the text
	suffix    []uint32 // and after
	decode    decoder
	idText    []string // id -> the text (raw bytes for byte-level entries) it decodes to
	maxInput  int
	scratches sync.Pool
}

type addedToken struct {
	id             uint32
	content        string
	lstrip, rstrip bool
	special        bool
}

// New loads a tokenizer.
func New(cfg Config) (*Tokenizer, error) {
	maxIn := cfg.MaxInputBytes
	switch {
	case maxIn == 0:
		maxIn = DefaultMaxInputBytes
	case maxIn < 0 || maxIn > MaxMaxInputBytes:
		return nil, fmt.Errorf("tokenize: MaxInputBytes %d out of range [1, %d]", maxIn, MaxMaxInputBytes)
	}
	tj, err := readFile(cfg)
	if err != nil {
		return nil, err
	}
	t, err := build(tj)
	if err != nil {
		return nil, err
	}
	t.maxInput = maxIn
	t.scratches.New = func() any { return new(scratch) }
	return t, nil
}

// readFile returns tokenizer.json's content.
func readFile(cfg Config) ([]byte, error) {
	switch {
	case cfg.Dir == "" && len(cfg.TokenizerJSON) == 0:
		return nil, errors.New("tokenize: Config needs Dir or TokenizerJSON")
	case cfg.Dir != "" && len(cfg.TokenizerJSON) > 0:
		return nil, errors.New("tokenize: give Config.Dir or Config.TokenizerJSON, not both")
	case cfg.Dir == "":
		return cfg.TokenizerJSON, nil
	}
	return readBounded(filepath.Join(cfg.Dir, "tokenizer.json"))
}

func readBounded(path string) ([]byte, error) {
	st, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("tokenize: %w", err)
	}
	if st.Size() > maxFileBytes {
		return nil, fmt.Errorf("tokenize: %s is %d bytes, more than the %d this package reads", path, st.Size(), maxFileBytes)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("tokenize: %w", err)
	}
	return b, nil
}

// VocabSize is the number of ids the tokenizer can produce (the largest id plus one).
func (t *Tokenizer) VocabSize() int { return len(t.idText) }

// Encode appends the ids of text to dst and returns the extended slice. With
// addSpecial, the tokens the tokenizer's post-processor adds (Llama's BOS) surround the
// text: what vLLM does for a completions prompt; a rendered chat is encoded without
// (the template wrote them). Added and special tokens written in the text are recognised
// as tokens in both cases, as Hugging Face's tokenizers do. Encode allocates nothing
// once dst and its pooled working memory have grown to the size of the text and the
// pieces it merges are in the piece cache (doc.go, "Cost").
func (t *Tokenizer) Encode(dst []uint32, text string, addSpecial bool) ([]uint32, error) {
	if len(text) > t.maxInput {
		return dst, fmt.Errorf("%w: %d bytes, the maximum is %d", ErrTooLong, len(text), t.maxInput)
	}
	if !utf8.ValidString(text) {
		return dst, fmt.Errorf("tokenize: text is not valid UTF-8 (at byte %d)", invalidAt(text))
	}
	sc := t.scratches.Get().(*scratch)
	defer t.scratches.Put(sc)
	if addSpecial {
		dst = append(dst, t.prefix...)
	}
	var err error
	if dst, err = t.encodeText(dst, text, sc); err != nil {
		return dst, err
	}
	if addSpecial {
		dst = append(dst, t.suffix...)
	}
	return dst, nil
}

func invalidAt(s string) int {
	for i := 0; i < len(s); {
		r, w := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && w == 1 {
			return i
		}
		i += w
	}
	return -1
}

// encodeText splits text on added tokens and encodes the sections between them.
func (t *Tokenizer) encodeText(dst []uint32, text string, sc *scratch) ([]uint32, error) {
	start, section := 0, 0
	rstrip := false
	var err error
	for i := 0; i < len(text); {
		if t.trie.root[text[i]] == 0 { // no added token starts with this byte
			i++
			continue
		}
		k, n := t.trie.match(text, i)
		if k < 0 {
			i++
			continue
		}
		a := &t.added[k]
		seg := text[start:i]
		if rstrip {
			seg = trimLeftSpace(seg)
		}
		if a.lstrip {
			seg = trimRightSpace(seg)
		}
		if dst, err = t.encodeSection(dst, seg, section, sc); err != nil {
			return dst, err
		}
		if start < i {
			section++
		}
		dst = append(dst, a.id)
		section++
		rstrip = a.rstrip
		i += n
		start = i
	}
	seg := text[start:]
	if rstrip {
		seg = trimLeftSpace(seg)
	}
	return t.encodeSection(dst, seg, section, sc)
}

func trimLeftSpace(s string) string {
	for len(s) > 0 {
		r, w := utf8.DecodeRuneInString(s)
		if !unicode.IsSpace(r) {
			break
		}
		s = s[w:]
	}
	return s
}

func trimRightSpace(s string) string {
	for len(s) > 0 {
		r, w := utf8.DecodeLastRuneInString(s)
		if !unicode.IsSpace(r) {
			break
		}
		s = s[:len(s)-w]
	}
	return s
}

// encodeSection normalizes, pre-tokenizes and encodes text between added tokens.
// section counts the sections before it (Metaspace's prepend_scheme "first").
func (t *Tokenizer) encodeSection(dst []uint32, s string, section int, sc *scratch) ([]uint32, error) {
	if s == "" {
		return dst, nil
	}
	if s = normalize(t.norm, s, sc); s == "" {
		return dst, nil
	}
	s = t.pre.prepare(s, section, sc)
	var err error
	for i := 0; i < len(s); {
		j := t.pre.next(s, i)
		if dst, err = t.model.word(dst, t.pre.piece(s[i:j], sc), sc); err != nil {
			return dst, err
		}
		i = j
	}
	return dst, nil
}
