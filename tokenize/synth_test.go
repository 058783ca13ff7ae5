package tokenize_test

import (
	"encoding/json"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"unicode/utf8"

	"github.com/kvindex/kvindex/tokenize"
)

// A synthetic byte-level tokenizer, trained here on a small sample with the textbook
// BPE loop, lets the package's tests run without the oracle: Encode is compared with
// a naive reference (the regex alternatives tried one by one, then "merge the
// lowest-ranked adjacent pair, leftmost first" until none applies).

// gpt2Char is GPT-2's printable stand-in for byte b (written out again here, not taken
// from the package, so that a mistake in either shows).
func gpt2Char(b byte) rune {
	if ('!' <= b && b <= '~') || (0xA1 <= b && b <= 0xAC) || 0xAE <= b {
		return rune(b)
	}
	n := 0
	for c := 0; c < int(b); c++ {
		if !(('!' <= c && c <= '~') || (0xA1 <= c && c <= 0xAC) || (0xAE <= c && c <= 0xFF)) {
			n++
		}
	}
	return rune(256 + n)
}

func gpt2String(b string) string {
	var s strings.Builder
	for i := 0; i < len(b); i++ {
		s.WriteRune(gpt2Char(b[i]))
	}
	return s.String()
}

const llama3Pattern = `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`

// refSplit splits s as the Llama 3 pattern does: its alternatives compiled one by one
// with Go's regexp (\s spelled as Unicode's White_Space), the look-ahead one by hand.
var refAlts = func() []*regexp.Regexp {
	ws := `[\t\n\v\f\r \x{85}\x{a0}\x{1680}\x{2000}-\x{200a}\x{2028}\x{2029}\x{202f}\x{205f}\x{3000}]`
	alts := []string{`(?i:'s|'t|'re|'ve|'m|'ll|'d)`, `[^\r\n\p{L}\p{N}]?\p{L}+`, `\p{N}{1,3}`,
		` ?[^\s\p{L}\p{N}]+[\r\n]*`, `\s*[\r\n]+`, ``, `\s+`}
	out := make([]*regexp.Regexp, len(alts))
	for i, a := range alts {
		a = strings.ReplaceAll(a, `[^\s\p{L}\p{N}]`, `[^\t\n\v\f\r \x{85}\x{a0}\x{1680}\x{2000}-\x{200a}\x{2028}\x{2029}\x{202f}\x{205f}\x{3000}\p{L}\p{N}]`)
		a = strings.ReplaceAll(a, `\s`, ws)
		out[i] = regexp.MustCompile(`^(?:` + a + `)`)
	}
	return out
}()

func refSplit(s string) []string {
	var out []string
	for i := 0; i < len(s); {
		n := 0
		for k, re := range refAlts {
			if k == 5 { // \s+(?!\S): the longest whitespace prefix followed by no non-space
				m := refAlts[6].FindStringIndex(s[i:])
				if m == nil {
					continue
				}
				for j := i + m[1]; j > i; {
					if j == len(s) || refAlts[6].MatchString(s[j:]) {
						n = j - i
						break
					}
					_, w := utf8.DecodeLastRuneInString(s[i:j])
					j -= w
				}
				if n > 0 {
					break
				}
				continue
			}
			if m := re.FindStringIndex(s[i:]); m != nil && m[1] > 0 {
				n = m[1]
				break
			}
		}
		if n == 0 {
			panic(fmt.Sprintf("no alternative matches %q", s[i:]))
		}
		out = append(out, s[i:i+n])
		i += n
	}
	return out
}

type synth struct {
	json   []byte
	vocab  map[string]int // raw bytes -> id
	merges [][2]string    // raw bytes
	rank   map[[2]string]int
}

// trainSynth learns n merges from sample, byte-level, over refSplit's pieces.
func trainSynth(sample string, n int) *synth {
	s := &synth{vocab: map[string]int{}, rank: map[[2]string]int{}}
	for b := 0; b < 256; b++ {
		s.vocab[string([]byte{byte(b)})] = b
	}
	var words [][]string
	for _, p := range refSplit(sample) {
		var w []string
		for i := 0; i < len(p); i++ {
			w = append(w, p[i:i+1])
		}
		words = append(words, w)
	}
	for len(s.merges) < n {
		count := map[[2]string]int{}
		var best [2]string
		for _, w := range words {
			for i := 0; i+1 < len(w); i++ {
				p := [2]string{w[i], w[i+1]}
				count[p]++
				if c := count[p]; c > count[best] || (c == count[best] && p[0]+p[1] < best[0]+best[1]) {
					best = p
				}
			}
		}
		if count[best] < 2 {
			break
		}
		s.rank[best] = len(s.merges)
		s.merges = append(s.merges, best)
		if _, ok := s.vocab[best[0]+best[1]]; !ok {
			s.vocab[best[0]+best[1]] = len(s.vocab)
		}
		for k, w := range words {
			words[k] = mergeAll(w, best)
		}
	}
	vocab := map[string]int{}
	for k, v := range s.vocab {
		vocab[gpt2String(k)] = v
	}
	var merges [][2]string
	for _, m := range s.merges {
		merges = append(merges, [2]string{gpt2String(m[0]), gpt2String(m[1])})
	}
	added := []map[string]any{
		{"id": len(s.vocab), "content": "<|start|>", "special": true},
		{"id": len(s.vocab) + 1, "content": "<|end|>", "special": true},
		{"id": len(s.vocab) + 2, "content": "<|start|>x", "special": false},
	}
	s.json, _ = json.Marshal(map[string]any{
		"added_tokens": added,
		"normalizer":   nil,
		"pre_tokenizer": map[string]any{"type": "Sequence", "pretokenizers": []any{
			map[string]any{"type": "Split", "pattern": map[string]any{"Regex": llama3Pattern}, "behavior": "Isolated", "invert": false},
			map[string]any{"type": "ByteLevel", "add_prefix_space": false, "use_regex": false},
		}},
		"post_processor": map[string]any{"type": "TemplateProcessing",
			"single":         []any{map[string]any{"SpecialToken": map[string]any{"id": "<|start|>"}}, map[string]any{"Sequence": map[string]any{"id": "A"}}},
			"special_tokens": map[string]any{"<|start|>": map[string]any{"ids": []int{len(s.vocab)}}}},
		"decoder": map[string]any{"type": "ByteLevel"},
		"model":   map[string]any{"type": "BPE", "vocab": vocab, "merges": merges},
	})
	return s
}

func mergeAll(w []string, p [2]string) []string {
	out := w[:0:0]
	for i := 0; i < len(w); i++ {
		if i+1 < len(w) && w[i] == p[0] && w[i+1] == p[1] {
			out = append(out, p[0]+p[1])
			i++
			continue
		}
		out = append(out, w[i])
	}
	return out
}

// encode is the naive reference: split on added tokens (longest first), refSplit, and
// merge the lowest-ranked adjacent pair, leftmost first, until none applies.
func (s *synth) encode(text string, special bool) []uint32 {
	var out []uint32
	if special {
		out = append(out, uint32(len(s.vocab)))
	}
	added := []string{"<|start|>x", "<|start|>", "<|end|>"}
	for len(text) > 0 {
		at, which := len(text), -1
		for k, a := range added {
			if i := strings.Index(text, a); i >= 0 && (i < at || (i == at && len(a) > len(added[which]))) {
				at, which = i, k
			}
		}
		for _, p := range refSplit(text[:at]) {
			out = append(out, s.bpe(p)...)
		}
		if which < 0 {
			break
		}
		out = append(out, uint32(len(s.vocab)+[]int{2, 0, 1}[which]))
		text = text[at+len(added[which]):]
	}
	return out
}

func (s *synth) bpe(p string) []uint32 {
	var w []string
	for i := 0; i < len(p); i++ {
		w = append(w, p[i:i+1])
	}
	for {
		best, at := -1, -1
		for i := 0; i+1 < len(w); i++ {
			if r, ok := s.rank[[2]string{w[i], w[i+1]}]; ok && (best < 0 || r < best) {
				best, at = r, i
			}
		}
		if best < 0 {
			break
		}
		w = slices.Replace(w, at, at+2, w[at]+w[at+1])
	}
	ids := make([]uint32, len(w))
	for i, t := range w {
		ids[i] = uint32(s.vocab[t])
	}
	return ids
}

const synthSample = `The router asks which worker holds the longest cached prefix of a request. It's
the index's job: we're hashing blocks of tokens, they'll match prefixes, and I'd say
it isn't hard. 缓存路由器的模型。 こんにちは世界 안녕하세요 😀👍🏽 café naïve 12345 3.14159
func main() {\n\tfmt.Println("hello, world")\n}\n    indented    code    here
the the the then there these those router routers routing routed 1000000 2026`

var synthTok = func() *synth { return trainSynth(synthSample, 400) }()

func newSynth(t testing.TB) *tokenize.Tokenizer {
	t.Helper()
	tok, err := tokenize.New(tokenize.Config{TokenizerJSON: synthTok.json})
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

// checkSynth compares Encode with the reference and Decode(Encode(s)) with s.
func checkSynth(t *testing.T, tok *tokenize.Tokenizer, s string) {
	for _, special := range []bool{false, true} {
		got, err := tok.Encode(nil, s, special)
		if err != nil {
			t.Fatalf("%q: %v", s, err)
		}
		if want := synthTok.encode(s, special); !slices.Equal(got, want) {
			t.Fatalf("%q (special %v):\n got %v\nwant %v", s, special, got, want)
		}
		back, err := tok.Decode(nil, got, false)
		if err != nil {
			t.Fatal(err)
		}
		if want := map[bool]string{false: s, true: "<|start|>" + s}[special]; string(back) != want {
			t.Fatalf("Decode(Encode(%q)) = %q", s, back)
		}
	}
}

func TestSyntheticMatchesReference(t *testing.T) {
	tok := newSynth(t)
	for _, s := range corpus(seedFromEnv(t), 400) {
		checkSynth(t, tok, s)
	}
	for _, s := range []string{"ſ's 'ſ 'S 'LL 'Ll", "a\u0085b \u0085 \ufeff x", "<|start|>x<|start|><|end|>y", "  \n\n  x\t\t\r\n"} {
		checkSynth(t, tok, s)
	}
}

func FuzzEncode(f *testing.F) {
	for _, s := range corpus(7, 40) {
		f.Add(s)
	}
	tok := newSynth(f)
	f.Fuzz(func(t *testing.T, s string) {
		if !utf8.ValidString(s) {
			if _, err := tok.Encode(nil, s, false); err == nil {
				t.Fatalf("invalid UTF-8 %q encoded without an error", s)
			}
			return
		}
		checkSynth(t, tok, s)
	})
}

// TestEncodeConcurrent: goroutines encoding at once (sharing the pooled memory and the
// piece cache, filling it as they go) get the ids one goroutine gets alone. Run under
// -race by make test.
func TestEncodeConcurrent(t *testing.T) {
	texts := corpus(5, 200)
	want := make([][]uint32, len(texts))
	for i, s := range texts {
		want[i] = synthTok.encode(s, true)
	}
	tok := newSynth(t)
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	for g := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var ids []uint32
			for k := range texts {
				i := (k*7 + g*13) % len(texts) // each goroutine in its own order
				var err error
				if ids, err = tok.Encode(ids[:0], texts[i], true); err != nil || !slices.Equal(ids, want[i]) {
					errs <- fmt.Errorf("goroutine %d, text %d: %v %v, want %v", g, i, ids, err, want[i])
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}
