package tokenize

import (
	"regexp"
	"unicode"
	"unicode/utf8"
)

// The split patterns tokenizer.json files carry that Go's regexp cannot run (they look
// ahead: \s+(?!\S)). Each is scanned by hand (scanWords), which is also several times
// faster than a backtracking engine. Any other pattern that Go's regexp compiles runs
// through it: its leftmost-first semantics are those of the Oniguruma engine Hugging
// Face's tokenizers use for patterns without look-arounds.
const (
	// patternLlama3 is Llama 3.x's (numbers in runs of up to three digits).
	patternLlama3 = `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`
	// patternQwen2 is Qwen2, 2.5 and 3's (one digit a piece).
	patternQwen2 = `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`
	// patternGPT2 is GPT-2's, which a ByteLevel pre-tokenizer with use_regex applies.
	patternGPT2 = `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+`
)

// splitter cuts a normalized section into the pieces BPE encodes one by one. Exactly one
// of its modes is set: a hand-written scanner (style != 0), a Go regexp, or none (the
// whole section is one piece).
type splitter struct {
	style     int // styleWords or styleGPT2, or 0
	maxDigits int // styleWords: the \p{N}{1,maxDigits} alternative
	re        *regexp.Regexp
}

const (
	styleWords = 1 + iota // patternLlama3, patternQwen2
	styleGPT2             // patternGPT2
)

// newSplitter builds the splitter for a Split pre-tokenizer's regex.
func newSplitter(pattern string) (splitter, error) {
	switch pattern {
	case patternLlama3:
		return splitter{style: styleWords, maxDigits: 3}, nil
	case patternQwen2:
		return splitter{style: styleWords, maxDigits: 1}, nil
	case patternGPT2:
		return splitter{style: styleGPT2}, nil
	}
	re, err := regexp.Compile(pattern)
	if err != nil {
		return splitter{}, err
	}
	return splitter{re: re}, nil
}

// next returns the end of the piece that starts at i (i < len(s)). A regexp splitter
// returns -1 when no match starts at i (the bytes up to the next match are a piece of
// their own: behaviour Isolated).
func (p *splitter) next(s string, i int) int {
	switch p.style {
	case styleWords:
		return scanWords(s, i, p.maxDigits)
	case styleGPT2:
		return scanGPT2(s, i)
	}
	loc := p.re.FindStringIndex(s[i:])
	switch {
	case loc == nil:
		return len(s)
	case loc[0] > 0:
		return i + loc[0] // the gap before the match
	case loc[1] == 0:
		// An empty match makes no piece: the gap runs to the next non-empty match.
		_, w := utf8.DecodeRuneInString(s[i:])
		j := i + w
		for j < len(s) {
			l := p.re.FindStringIndex(s[j:])
			if l == nil || l[1] > 0 {
				break
			}
			_, w = utf8.DecodeRuneInString(s[j:])
			j += w
		}
		return j
	}
	return i + loc[1]
}

// Character classes of the split patterns. \s is Unicode's White_Space property (as in
// Oniguruma and Rust's regex; JavaScript's \s differs on U+0085 and U+FEFF), \p{L} and
// \p{N} the general categories of Go's unicode tables.
const (
	clOther = iota // [^\s\p{L}\p{N}]
	clLetter
	clNumber
	clSpace
)

// asciiClass classifies the bytes below 0x80 without a table look-up per category.
var asciiClass = func() (t [128]uint8) {
	for c := 0; c < 128; c++ {
		switch {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z':
			t[c] = clLetter
		case '0' <= c && c <= '9':
			t[c] = clNumber
		case c == ' ', '\t' <= c && c <= '\r':
			t[c] = clSpace
		default:
			t[c] = clOther
		}
	}
	return t
}()

// classAt returns the class of the character at s[i] and its width in bytes.
func classAt(s string, i int) (uint8, int) {
	if c := s[i]; c < utf8.RuneSelf {
		return asciiClass[c], 1
	}
	r, w := utf8.DecodeRuneInString(s[i:])
	switch {
	case unicode.IsLetter(r):
		return clLetter, w
	case unicode.IsNumber(r):
		return clNumber, w
	case unicode.IsSpace(r):
		return clSpace, w
	}
	return clOther, w
}

// run returns the end of the run of class cl starting at i.
func run(s string, i int, cl uint8) int {
	for i < len(s) {
		c, w := classAt(s, i)
		if c != cl {
			break
		}
		i += w
	}
	return i
}

// contraction returns the length of the 's 't 're 've 'm 'll 'd suffix at s[i] (the
// apostrophe included), or 0. fold applies Unicode simple case folding as Oniguruma's
// (?i) does: S, T, ... and also U+017F (long s), which folds to s.
func contraction(s string, i int, fold bool) int {
	if s[i] != '\'' || i+1 >= len(s) {
		return 0
	}
	lower := func(c byte) byte {
		if fold && 'A' <= c && c <= 'Z' {
			return c + 'a' - 'A'
		}
		return c
	}
	c := lower(s[i+1])
	switch c {
	case 's', 't', 'm', 'd':
		return 2
	case 'r', 'v', 'l':
		if i+2 < len(s) {
			want := byte('e')
			if c == 'l' {
				want = 'l'
			}
			if lower(s[i+2]) == want {
				return 3
			}
		}
	case 0xC5: // U+017F is C5 BF
		if fold && i+2 < len(s) && s[i+2] == 0xBF {
			return 3
		}
	}
	return 0
}

// scanWords scans patternLlama3 (maxDigits 3) and patternQwen2 (maxDigits 1):
//
//	(?i:'s|'t|'re|'ve|'m|'ll|'d)  |  [^\r\n\p{L}\p{N}]?\p{L}+  |  \p{N}{1,maxDigits}  |
//	 ?[^\s\p{L}\p{N}]+[\r\n]*  |  \s*[\r\n]+  |  \s+(?!\S)  |  \s+
//
// trying the alternatives in order at i as a backtracking engine does. Every character is
// a letter, a number, a space or none of them, so some alternative always matches.
func scanWords(s string, i, maxDigits int) int {
	if n := contraction(s, i, true); n > 0 {
		return i + n
	}
	c, w := classAt(s, i)
	if c == clLetter {
		return run(s, i+w, clLetter)
	}
	if c != clNumber && s[i] != '\r' && s[i] != '\n' && i+w < len(s) {
		if c2, w2 := classAt(s, i+w); c2 == clLetter {
			return run(s, i+w+w2, clLetter)
		}
	}
	if c == clNumber {
		j := i + w
		for k := 1; k < maxDigits && j < len(s); k++ {
			c2, w2 := classAt(s, j)
			if c2 != clNumber {
				break
			}
			j += w2
		}
		return j
	}
	if j, ok := punctuation(s, i, c, w); ok {
		for j < len(s) && (s[j] == '\r' || s[j] == '\n') {
			j++
		}
		return j
	}
	return spaces(s, i, true)
}

// punctuation matches " ?[^\s\p{L}\p{N}]+" at i, whose character has class c and width w.
func punctuation(s string, i int, c uint8, w int) (int, bool) {
	if s[i] == ' ' && i+1 < len(s) {
		if c2, w2 := classAt(s, i+1); c2 == clOther {
			return run(s, i+1+w2, clOther), true
		}
	}
	if c == clOther {
		return run(s, i+w, clOther), true
	}
	return 0, false
}

// spaces matches the whitespace alternatives at i: (when newlines is set) \s*[\r\n]+,
// then \s+(?!\S), then \s+.
func spaces(s string, i int, newlines bool) int {
	end, last, lastNL := i, i, -1
	for end < len(s) {
		c, w := classAt(s, end)
		if c != clSpace {
			break
		}
		if s[end] == '\r' || s[end] == '\n' {
			lastNL = end
		}
		last = end
		end += w
	}
	switch {
	case newlines && lastNL >= 0:
		return lastNL + 1
	case end == len(s) || last == i:
		return end
	}
	return last // leave the last space to the word that follows
}

// scanGPT2 scans patternGPT2:
//
//	's|'t|'re|'ve|'m|'ll|'d  |   ?\p{L}+  |   ?\p{N}+  |   ?[^\s\p{L}\p{N}]+  |  \s+(?!\S)  |  \s+
func scanGPT2(s string, i int) int {
	if n := contraction(s, i, false); n > 0 {
		return i + n
	}
	c, w := classAt(s, i)
	if s[i] == ' ' && i+1 < len(s) {
		if c2, w2 := classAt(s, i+1); c2 != clSpace {
			return run(s, i+1+w2, c2)
		}
	}
	if c != clSpace {
		return run(s, i+w, c)
	}
	return spaces(s, i, false)
}
