package tokenize

import "strings"

// preTokenizer cuts a normalized section into pieces. The supported pre-tokenizers of
// tokenizer.json map onto its fields:
//   - Split (behaviour Isolated) with a regex: split;
//   - ByteLevel: the model is byte-level; use_regex adds GPT-2's split; add_prefix_space
//     puts a space before the section (alone) or before each piece (after a Split);
//   - Metaspace: spaces become the replacement (▁), one is prepended per prepend_scheme,
//     and with split each piece starts at a replacement.
type preTokenizer struct {
	split    splitter
	hasSplit bool
	// prefixSection / prefixPiece: ByteLevel's add_prefix_space before or after a Split.
	prefixSection, prefixPiece bool

	meta        bool
	metaRepl    string
	metaPrepend int // prependAlways, prependFirst, prependNever
	metaSplit   bool
}

const (
	prependAlways = iota
	prependFirst
	prependNever
)

// prepare applies the whole-section steps (Metaspace's replacement and prefix,
// ByteLevel's prefix space); the result may alias sc.norm.
func (p *preTokenizer) prepare(s string, section int, sc *scratch) string {
	switch {
	case p.meta:
		prepend := p.metaPrepend == prependAlways || (p.metaPrepend == prependFirst && section == 0)
		if prepend && strings.HasPrefix(s, p.metaRepl) {
			prepend = false
		}
		if !prepend && !strings.Contains(s, " ") {
			return s
		}
		buf := sc.piece[:0]
		if prepend {
			buf = append(buf, p.metaRepl...)
		}
		buf = appendReplace(buf, s, " ", p.metaRepl)
		sc.piece = buf
		return bytesString(buf)
	case p.prefixSection && s[0] != ' ':
		buf := append(append(sc.piece[:0], ' '), s...)
		sc.piece = buf
		return bytesString(buf)
	}
	return s
}

// next returns the end of the piece starting at s[i].
func (p *preTokenizer) next(s string, i int) int {
	switch {
	case p.hasSplit:
		return p.split.next(s, i)
	case p.meta && p.metaSplit:
		// MergedWithNext: a piece runs up to (not including) the next replacement.
		if k := strings.Index(s[i+1:], p.metaRepl); k >= 0 {
			return i + 1 + k
		}
	}
	return len(s)
}

// piece applies the per-piece step (ByteLevel's prefix space after a Split).
func (p *preTokenizer) piece(s string, sc *scratch) string {
	if !p.prefixPiece || s[0] == ' ' {
		return s
	}
	buf := append(append(sc.word[:0], ' '), s...)
	sc.word = buf
	return bytesString(buf)
}
