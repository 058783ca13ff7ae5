package chattemplate

import (
	"fmt"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"
)

// tokKind is the kind of a lexer token.
type tokKind uint8

const (
	tEOF       tokKind = iota
	tText              // template data between tags
	tBlockOpen         // {%
	tBlockEnd          // %}
	tVarOpen           // {{
	tVarEnd            // }}
	tName
	tInt
	tFloat
	tString
	tOp // operators and punctuation: + - * / // % ** ~ == != < > <= >= = ( ) [ ] { } , . : |
)

type token struct {
	kind tokKind
	val  string // text, name, operator, unescaped string literal, or number literal
	line int    // 1-based line of the token's first character
}

// lexer turns a template source into tokens with Jinja's lexing rules as Hugging Face
// configures them (trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=False).
// The whitespace rules follow jinja2/lexer.py's tokeniter:
//   - "{%-", "{{-", "{#-" strip all whitespace (str.isspace) before the tag;
//   - "-%}", "-}}", "-#}" strip all whitespace after it;
//   - trim_blocks drops the single "\n" that follows "%}" or "#}";
//   - lstrip_blocks drops spaces and tabs between a line start and "{%" or "{#"
//     ("{%+" opts out); a line starts after a "\n" in the text or when the previous tag's
//     end (with what it consumed) ended with "\n".
type lexer struct {
	src     string
	pos     int
	line    int
	toks    []token
	maxTok  int
	lineOff int // byte offset up to which newlines are counted in line
}

// tokenize lexes src. maxTokens bounds the token count (and so the parser's memory).
func tokenize(src string, maxTokens int) ([]token, error) {
	// Jinja normalizes "\r\n" and "\r" to "\n" in data and string literals; elsewhere a
	// newline is whitespace either way, so normalizing the whole source is equivalent.
	if strings.IndexByte(src, '\r') >= 0 {
		src = strings.ReplaceAll(src, "\r\n", "\n")
		src = strings.ReplaceAll(src, "\r", "\n")
	}
	// keep_trailing_newline=False: a single trailing newline of the template is dropped.
	src = strings.TrimSuffix(src, "\n")
	lx := &lexer{src: src, line: 1, maxTok: maxTokens}
	if err := lx.run(); err != nil {
		return nil, err
	}
	lx.toks = append(lx.toks, token{kind: tEOF, line: lx.line})
	return lx.toks, nil
}

func (lx *lexer) errorf(line int, format string, args ...any) error {
	return &Error{Line: line, Msg: fmt.Sprintf(format, args...), Err: ErrSyntax}
}

func (lx *lexer) emit(k tokKind, val string, line int) error {
	if len(lx.toks) >= lx.maxTok {
		return &Error{Line: line, Msg: fmt.Sprintf("template has more than %d tokens", lx.maxTok), Err: ErrLimit}
	}
	lx.toks = append(lx.toks, token{kind: k, val: val, line: line})
	return nil
}

// run is the root state: data up to the next tag opener, then the tag.
func (lx *lexer) run() error {
	lineStarting := true
	for lx.pos < len(lx.src) {
		start := lx.pos
		open := nextTagOpen(lx.src, lx.pos)
		if open < 0 {
			return lx.emitText(lx.src[start:], start)
		}
		text := lx.src[start:open]
		kind := lx.src[open+1]
		sign := byte(0)
		if open+2 < len(lx.src) && (lx.src[open+2] == '-' || lx.src[open+2] == '+') {
			sign = lx.src[open+2]
		}
		switch {
		case sign == '-':
			text = strings.TrimRightFunc(text, pyIsSpace)
		case sign != '+' && kind != '{':
			text = lstripBlock(text, lineStarting)
		}
		if err := lx.emitText(text, start); err != nil {
			return err
		}
		lx.advanceTo(open)
		tagLine := lx.line
		lx.pos = open + 2
		if sign != 0 {
			lx.pos++
		}
		var err error
		switch kind {
		case '#':
			err = lx.comment(tagLine)
		case '%':
			if raw, ok := lx.rawBlock(); ok {
				if err := lx.emitText(raw, lx.pos); err != nil {
					return err
				}
				lineStarting = false
				continue
			}
			err = lx.tag(tBlockOpen, tBlockEnd, tagLine)
		default:
			err = lx.tag(tVarOpen, tVarEnd, tagLine)
		}
		if err != nil {
			return err
		}
		lineStarting = lx.pos > 0 && lx.src[lx.pos-1] == '\n'
	}
	return nil
}

// nextTagOpen returns the index of the next "{{", "{%" or "{#" at or after i, or -1.
func nextTagOpen(s string, i int) int {
	for {
		j := strings.IndexByte(s[i:], '{')
		if j < 0 || i+j+1 >= len(s) {
			return -1
		}
		i += j
		if c := s[i+1]; c == '{' || c == '%' || c == '#' {
			return i
		}
		i++
	}
}

// lstripBlock removes the spaces and tabs between the start of the line and a block tag.
func lstripBlock(text string, lineStarting bool) string {
	lpos := strings.LastIndexByte(text, '\n') + 1
	if lpos == 0 && !lineStarting {
		return text
	}
	for i := lpos; i < len(text); i++ {
		if text[i] != ' ' && text[i] != '\t' {
			return text
		}
	}
	return text[:lpos]
}

func (lx *lexer) emitText(text string, at int) error {
	lx.advanceTo(at)
	line := lx.line
	if text == "" {
		return nil
	}
	return lx.emit(tText, text, line)
}

// advanceTo moves the line counter to byte offset to (never backwards).
func (lx *lexer) advanceTo(to int) {
	if to > lx.lineOff {
		lx.line += strings.Count(lx.src[lx.lineOff:to], "\n")
		lx.lineOff = to
	}
}

// comment skips "{# ... #}" and applies its whitespace control.
func (lx *lexer) comment(line int) error {
	end := strings.Index(lx.src[lx.pos:], "#}")
	if end < 0 {
		return lx.errorf(line, "missing end of comment tag")
	}
	end += lx.pos
	strip := end > lx.pos && lx.src[end-1] == '-'
	lx.pos = end + 2
	lx.afterTagEnd(strip, true)
	return nil
}

// afterTagEnd applies "-" (strip all whitespace) or trim_blocks (one "\n") after a tag.
func (lx *lexer) afterTagEnd(strip, trimBlocks bool) {
	switch {
	case strip:
		rest := strings.TrimLeftFunc(lx.src[lx.pos:], pyIsSpace)
		lx.pos = len(lx.src) - len(rest)
	case trimBlocks && lx.pos < len(lx.src) && lx.src[lx.pos] == '\n':
		lx.pos++
	}
}

// rawBlock handles "{% raw %}...{% endraw %}" right after a "{%" (or "{%-"): it returns the
// verbatim body and leaves pos after the end tag.
func (lx *lexer) rawBlock() (string, bool) {
	rest := lx.src[lx.pos:]
	trimmed := strings.TrimLeftFunc(rest, pyIsSpace)
	if !strings.HasPrefix(trimmed, "raw") {
		return "", false
	}
	after := strings.TrimLeftFunc(trimmed[3:], pyIsSpace)
	stripOpen := strings.HasPrefix(after, "-%}")
	if !stripOpen && !strings.HasPrefix(after, "%}") {
		return "", false
	}
	bodyStart := len(lx.src) - len(after) + 2
	if stripOpen {
		bodyStart++
	}
	for i := bodyStart; ; {
		j := strings.Index(lx.src[i:], "{%")
		if j < 0 {
			return "", false
		}
		k := i + j + 2
		stripEnd := k < len(lx.src) && lx.src[k] == '-'
		if stripEnd {
			k++
		}
		tail := strings.TrimLeftFunc(lx.src[k:], pyIsSpace)
		if strings.HasPrefix(tail, "endraw") {
			t2 := strings.TrimLeftFunc(tail[6:], pyIsSpace)
			closeStrip := strings.HasPrefix(t2, "-%}")
			if closeStrip || strings.HasPrefix(t2, "%}") {
				body := lx.src[bodyStart : i+j]
				if stripOpen {
					body = strings.TrimLeftFunc(body, pyIsSpace)
				}
				if stripEnd {
					body = strings.TrimRightFunc(body, pyIsSpace)
				}
				lx.pos = len(lx.src) - len(t2) + 2
				if closeStrip {
					lx.pos++
				}
				lx.afterTagEnd(closeStrip, true)
				return body, true
			}
		}
		i = k
	}
}

// tag lexes the inside of "{% ... %}" or "{{ ... }}" up to and including its end.
func (lx *lexer) tag(open, close tokKind, line int) error {
	if err := lx.emit(open, "", line); err != nil {
		return err
	}
	endCh := byte('%')
	if close == tVarEnd {
		endCh = '}'
	}
	depth := 0 // bracket depth: "}}" inside a dict literal in {{ }} is not the end
	for {
		lx.skipSpace()
		if lx.pos >= len(lx.src) {
			return lx.errorf(line, "unexpected end of template: tag opened here is not closed")
		}
		c := lx.src[lx.pos]
		// Tag end, with optional "-" or "+" modifier.
		if depth == 0 {
			if strip, n := tagEndAt(lx.src, lx.pos, endCh); n > 0 {
				lx.pos += n
				if err := lx.emit(close, "", lx.line); err != nil {
					return err
				}
				lx.afterTagEnd(strip == '-', close == tBlockEnd && strip != '+')
				return nil
			}
		}
		tokLine := lx.line
		switch {
		case c == '"' || c == '\'':
			s, err := lx.stringLit()
			if err != nil {
				return err
			}
			if err := lx.emit(tString, s, tokLine); err != nil {
				return err
			}
		case c >= '0' && c <= '9':
			k, v := lx.number()
			if err := lx.emit(k, v, tokLine); err != nil {
				return err
			}
		case c == '_' || c >= 0x80 || unicode.IsLetter(rune(c)):
			start := lx.pos
			for lx.pos < len(lx.src) {
				r, n := utf8.DecodeRuneInString(lx.src[lx.pos:])
				if r != '_' && !unicode.IsLetter(r) && !unicode.IsDigit(r) {
					break
				}
				lx.pos += n
			}
			if lx.pos == start {
				return lx.errorf(tokLine, "unexpected character %q", lx.src[start:start+1])
			}
			if err := lx.emit(tName, lx.src[start:lx.pos], tokLine); err != nil {
				return err
			}
		default:
			op := operatorAt(lx.src[lx.pos:])
			if op == "" {
				return lx.errorf(tokLine, "unexpected character %q", rune(c))
			}
			switch op {
			case "(", "[", "{":
				depth++
			case ")", "]", "}":
				depth--
			}
			lx.pos += len(op)
			if err := lx.emit(tOp, op, tokLine); err != nil {
				return err
			}
		}
	}
}

// tagEndAt reports whether a tag end ("%}" or "}}", optionally preceded by "-" or "+")
// starts at i, returning the modifier and its length.
func tagEndAt(s string, i int, endCh byte) (mod byte, n int) {
	if i < len(s) && (s[i] == '-' || s[i] == '+') {
		mod = s[i]
		i++
		n = 1
	}
	if i+1 < len(s) && s[i] == endCh && s[i+1] == '}' {
		return mod, n + 2
	}
	return 0, 0
}

func (lx *lexer) skipSpace() {
	for lx.pos < len(lx.src) {
		r, n := utf8.DecodeRuneInString(lx.src[lx.pos:])
		if !pyIsSpace(r) {
			return
		}
		if r == '\n' {
			lx.line++
			lx.lineOff = lx.pos + 1
		}
		lx.pos += n
	}
}

var operators = []string{"//", "**", "==", "!=", "<=", ">=", "+", "-", "*", "/", "%", "~", "<", ">", "=", "(", ")", "[", "]", "{", "}", ",", ".", ":", "|"}

func operatorAt(s string) string {
	for _, op := range operators {
		if strings.HasPrefix(s, op) {
			return op
		}
	}
	return ""
}

// number lexes an integer or float literal (Jinja: digits with "_" separators, a fraction,
// an exponent).
func (lx *lexer) number() (tokKind, string) {
	start := lx.pos
	digits := func() {
		for lx.pos < len(lx.src) && (isDigit(lx.src[lx.pos]) || lx.src[lx.pos] == '_' && lx.pos+1 < len(lx.src) && isDigit(lx.src[lx.pos+1])) {
			lx.pos++
		}
	}
	digits()
	kind := tInt
	if lx.pos+1 < len(lx.src) && lx.src[lx.pos] == '.' && isDigit(lx.src[lx.pos+1]) {
		lx.pos++
		digits()
		kind = tFloat
	}
	if lx.pos < len(lx.src) && (lx.src[lx.pos] == 'e' || lx.src[lx.pos] == 'E') {
		j := lx.pos + 1
		if j < len(lx.src) && (lx.src[j] == '+' || lx.src[j] == '-') {
			j++
		}
		if j < len(lx.src) && isDigit(lx.src[j]) {
			lx.pos = j
			digits()
			kind = tFloat
		}
	}
	return kind, strings.ReplaceAll(lx.src[start:lx.pos], "_", "")
}

func isDigit(c byte) bool { return c >= '0' && c <= '9' }

// stringLit lexes a quoted literal and unescapes it as Python's "unicode-escape" codec
// does (what Jinja applies): \n \t \r \\ \' \" \a \b \f \v \ooo \xhh \uhhhh \Uhhhhhhhh;
// an unknown escape keeps its backslash.
func (lx *lexer) stringLit() (string, error) {
	line := lx.line
	quote := lx.src[lx.pos]
	lx.pos++
	var b strings.Builder
	for {
		if lx.pos >= len(lx.src) {
			return "", lx.errorf(line, "unterminated string literal")
		}
		c := lx.src[lx.pos]
		switch {
		case c == quote:
			lx.pos++
			return b.String(), nil
		case c == '\n':
			lx.line++
			lx.lineOff = lx.pos + 1
			b.WriteByte(c)
			lx.pos++
		case c != '\\':
			b.WriteByte(c)
			lx.pos++
		default:
			if err := lx.escape(&b, line); err != nil {
				return "", err
			}
		}
	}
}

var (
	simpleEscapes = map[byte]byte{'n': '\n', 't': '\t', 'r': '\r', '\\': '\\', '\'': '\'', '"': '"', 'a': 7, 'b': 8, 'f': 12, 'v': 11, '\n': 0}
	hexEscapes    = map[byte]int{'x': 2, 'u': 4, 'U': 8}
)

func (lx *lexer) escape(b *strings.Builder, line int) error {
	lx.pos++ // backslash
	if lx.pos >= len(lx.src) {
		return lx.errorf(line, "unterminated string literal")
	}
	c := lx.src[lx.pos]
	lx.pos++
	if r, ok := simpleEscapes[c]; ok {
		if c == '\n' { // backslash-newline is a line continuation
			lx.line++
			lx.lineOff = lx.pos
			return nil
		}
		b.WriteByte(r)
		return nil
	}
	hexLen := hexEscapes[c]
	switch {
	case hexLen > 0:
		if lx.pos+hexLen > len(lx.src) {
			return lx.errorf(line, "truncated \\%c escape in string literal", c)
		}
		v, err := strconv.ParseUint(lx.src[lx.pos:lx.pos+hexLen], 16, 32)
		if err != nil || v > unicode.MaxRune {
			return lx.errorf(line, "invalid \\%c escape in string literal", c)
		}
		lx.pos += hexLen
		b.WriteRune(rune(v))
	case c >= '0' && c <= '7':
		v := int(c - '0')
		for n := 1; n < 3 && lx.pos < len(lx.src) && lx.src[lx.pos] >= '0' && lx.src[lx.pos] <= '7'; n++ {
			v = v*8 + int(lx.src[lx.pos]-'0')
			lx.pos++
		}
		b.WriteRune(rune(v))
	default:
		b.WriteByte('\\')
		lx.pos-- // the character after the backslash is lexed as itself
	}
	return nil
}

// pyIsSpace is Python's str.isspace for one character: Go's unicode.IsSpace plus the
// four information separators U+001C..U+001F.
func pyIsSpace(r rune) bool {
	return unicode.IsSpace(r) || r >= 0x1c && r <= 0x1f
}
