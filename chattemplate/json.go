package chattemplate

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"sort"
	"strconv"
	"strings"
	"unicode/utf16"
	"unicode/utf8"
)

// jsonOpts are transformers' tojson arguments, passed on to Python's json.dumps.
type jsonOpts struct {
	ensureASCII bool
	indent      *string // nil: one line
	itemSep     string
	keySep      string
	sortKeys    bool
}

// filterToJSON is transformers' tojson filter:
//
//	json.dumps(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False)
//
// so ", " and ": " separate items and keys (",", ": " once indented), non-ASCII text is
// written as is, and keys keep the order the value has.
func filterToJSON(ev *evaluator, line int, x any, args []any, kw []kwval) (any, error) {
	p, err := ev.params(line, "tojson", args, kw, []string{"ensure_ascii", "indent", "separators", "sort_keys"}, []any{false, nil, nil, false})
	if err != nil {
		return nil, err
	}
	o := jsonOpts{ensureASCII: truthy(p[0]), itemSep: ", ", keySep: ": ", sortKeys: truthy(p[3])}
	switch ind := p[1].(type) {
	case nil:
	case string:
		o.indent = &ind
	default:
		_, n, isInt, ok := number(ind)
		if !ok || !isInt || n > 1024 {
			return nil, ev.errf(line, "tojson indent must be an integer up to 1024 or a string")
		}
		s := strings.Repeat(" ", max(int(n), 0))
		o.indent = &s
	}
	if o.indent != nil {
		o.itemSep = ","
	}
	if p[2] != nil {
		seps, ok := asSeq(p[2])
		if !ok || len(seps) != 2 {
			return nil, ev.errf(line, "tojson separators must be a pair of strings")
		}
		o.itemSep, o.keySep = ev.str(seps[0]), ev.str(seps[1])
	}
	var b strings.Builder
	if err := writeJSON(&b, x, &o, 0, ev.maxOutput); err != nil {
		return nil, ev.errf(line, "tojson: %v", err)
	}
	return b.String(), nil
}

var errTooBig = errors.New("value too large")

func writeJSON(b *strings.Builder, v any, o *jsonOpts, depth, limit int) error {
	if depth > maxValueDepth {
		return fmt.Errorf("nesting deeper than %d", maxValueDepth)
	}
	if b.Len() > limit {
		return errTooBig
	}
	switch x := v.(type) {
	case nil:
		b.WriteString("null")
	case bool:
		if x {
			b.WriteString("true")
		} else {
			b.WriteString("false")
		}
	case int64:
		b.WriteString(strconv.FormatInt(x, 10))
	case float64:
		switch {
		case math.IsNaN(x):
			b.WriteString("NaN")
		case math.IsInf(x, 1):
			b.WriteString("Infinity")
		case math.IsInf(x, -1):
			b.WriteString("-Infinity")
		default:
			b.WriteString(pyFloatRepr(x))
		}
	case string:
		writeJSONString(b, x, o.ensureASCII)
	case []any, tuple:
		items, _ := asSeq(x)
		if len(items) == 0 {
			b.WriteString("[]")
			return nil
		}
		b.WriteByte('[')
		for i, it := range items {
			if i > 0 {
				b.WriteString(o.itemSep)
			}
			writeIndent(b, o, depth+1)
			if err := writeJSON(b, it, o, depth+1, limit); err != nil {
				return err
			}
		}
		writeIndent(b, o, depth)
		b.WriteByte(']')
	case *Dict:
		return writeJSONObject(b, x, o, depth, limit)
	default:
		return fmt.Errorf("object of type %s is not JSON serializable", typeName(v))
	}
	return nil
}

func writeJSONObject(b *strings.Builder, d *Dict, o *jsonOpts, depth, limit int) error {
	if d.Len() == 0 {
		b.WriteString("{}")
		return nil
	}
	keys := d.keys
	if o.sortKeys {
		keys = append([]string(nil), keys...)
		sort.Strings(keys)
	}
	b.WriteByte('{')
	for i, k := range keys {
		if i > 0 {
			b.WriteString(o.itemSep)
		}
		writeIndent(b, o, depth+1)
		writeJSONString(b, k, o.ensureASCII)
		b.WriteString(o.keySep)
		v := d.vals[i] // keys is d.keys unless sorted
		if o.sortKeys {
			v, _ = d.Get(k)
		}
		if err := writeJSON(b, v, o, depth+1, limit); err != nil {
			return err
		}
	}
	writeIndent(b, o, depth)
	b.WriteByte('}')
	return nil
}

func writeIndent(b *strings.Builder, o *jsonOpts, depth int) {
	if o.indent == nil {
		return
	}
	b.WriteByte('\n')
	for range depth {
		b.WriteString(*o.indent)
	}
}

const hexDigits = "0123456789abcdef"

// writeJSONString is json.dumps' string encoder: \" \\ \n \r \t \b \f, other control
// characters as \u00XX, and with ensureASCII every non-ASCII character as \uXXXX
// (surrogate pairs above U+FFFF). Invalid UTF-8 bytes become U+FFFD.
func writeJSONString(b *strings.Builder, s string, ensureASCII bool) {
	b.WriteByte('"')
	start := 0
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			if c >= 0x20 && c != '"' && c != '\\' {
				i++
				continue
			}
			b.WriteString(s[start:i])
			writeJSONEscape(b, c)
			i++
			start = i
			continue
		}
		r, n := utf8.DecodeRuneInString(s[i:])
		bad := r == utf8.RuneError && n == 1
		if !bad && !ensureASCII {
			i += n
			continue
		}
		b.WriteString(s[start:i])
		switch {
		case !ensureASCII:
			b.WriteString("\ufffd")
		case r > 0xffff:
			r -= 0x10000
			writeU(b, 0xd800+(r>>10))
			writeU(b, 0xdc00+(r&0x3ff))
		default:
			writeU(b, r)
		}
		i += n
		start = i
	}
	b.WriteString(s[start:])
	b.WriteByte('"')
}

func writeJSONEscape(b *strings.Builder, c byte) {
	switch c {
	case '"':
		b.WriteString(`\"`)
	case '\\':
		b.WriteString(`\\`)
	case '\n':
		b.WriteString(`\n`)
	case '\r':
		b.WriteString(`\r`)
	case '\t':
		b.WriteString(`\t`)
	case '\b':
		b.WriteString(`\b`)
	case '\f':
		b.WriteString(`\f`)
	default:
		writeU(b, rune(c))
	}
}

func writeU(b *strings.Builder, r rune) {
	b.WriteString(`\u`)
	b.WriteByte(hexDigits[r>>12&0xf])
	b.WriteByte(hexDigits[r>>8&0xf])
	b.WriteByte(hexDigits[r>>4&0xf])
	b.WriteByte(hexDigits[r&0xf])
}

// DecodeJSON decodes JSON into the values templates see, keeping what Python's json.loads
// keeps: objects become *Dict in document order, numbers written without a fraction or
// exponent become integers (others floats), and a duplicate key keeps the last value in
// the first key's place. Invalid UTF-8 and lone surrogate escapes become U+FFFD (Go
// strings cannot hold surrogates). Nesting is bounded (100 levels).
func DecodeJSON(data []byte) (any, error) {
	d := jsonDecoder{data: data}
	v, err := d.value(0)
	if err == nil {
		d.skipSpace()
		if d.pos < len(d.data) {
			err = d.errorf("data after the value")
		}
	}
	if err != nil {
		return nil, fmt.Errorf("chattemplate: decode JSON: %w", err)
	}
	return v, nil
}

// jsonDecoder is a small recursive-descent JSON parser: encoding/json's token API
// allocates per token and was three quarters of a Qwen3 render from a request body.
type jsonDecoder struct {
	data []byte
	pos  int
}

func (d *jsonDecoder) errorf(format string, args ...any) error {
	return fmt.Errorf("offset %d: %s", d.pos, fmt.Sprintf(format, args...))
}

func (d *jsonDecoder) skipSpace() {
	for d.pos < len(d.data) {
		switch d.data[d.pos] {
		case ' ', '\t', '\n', '\r':
			d.pos++
		default:
			return
		}
	}
}

func (d *jsonDecoder) value(depth int) (any, error) {
	if depth > maxValueDepth {
		return nil, d.errorf("nesting deeper than %d", maxValueDepth)
	}
	d.skipSpace()
	if d.pos >= len(d.data) {
		return nil, d.errorf("unexpected end of input")
	}
	switch c := d.data[d.pos]; {
	case c == '{':
		return d.object(depth)
	case c == '[':
		return d.array(depth)
	case c == '"':
		return d.str()
	case c == '-' || c >= '0' && c <= '9':
		return d.number()
	}
	for _, lit := range []struct {
		text string
		v    any
	}{{"true", true}, {"false", false}, {"null", nil}} {
		if bytes.HasPrefix(d.data[d.pos:], []byte(lit.text)) {
			d.pos += len(lit.text)
			return lit.v, nil
		}
	}
	return nil, d.errorf("unexpected character %q", d.data[d.pos])
}

// expect consumes the next non-space byte if it is c.
func (d *jsonDecoder) expect(c byte) bool {
	d.skipSpace()
	if d.pos < len(d.data) && d.data[d.pos] == c {
		d.pos++
		return true
	}
	return false
}

func (d *jsonDecoder) object(depth int) (any, error) {
	d.pos++
	obj := NewDict()
	if d.expect('}') {
		return obj, nil
	}
	for {
		d.skipSpace()
		if d.pos >= len(d.data) || d.data[d.pos] != '"' {
			return nil, d.errorf("expected an object key")
		}
		k, err := d.str()
		if err != nil {
			return nil, err
		}
		if !d.expect(':') {
			return nil, d.errorf("expected ':'")
		}
		v, err := d.value(depth + 1)
		if err != nil {
			return nil, err
		}
		obj.Set(k, v)
		if d.expect('}') {
			return obj, nil
		}
		if !d.expect(',') {
			return nil, d.errorf("expected ',' or '}'")
		}
	}
}

func (d *jsonDecoder) array(depth int) (any, error) {
	d.pos++
	out := []any{}
	if d.expect(']') {
		return out, nil
	}
	for {
		v, err := d.value(depth + 1)
		if err != nil {
			return nil, err
		}
		out = append(out, v)
		if d.expect(']') {
			return out, nil
		}
		if !d.expect(',') {
			return nil, d.errorf("expected ',' or ']'")
		}
	}
}

// str decodes a string literal at d.pos.
func (d *jsonDecoder) str() (string, error) {
	d.pos++
	start := d.pos
	for d.pos < len(d.data) {
		switch c := d.data[d.pos]; {
		case c == '"':
			s := d.data[start:d.pos]
			d.pos++
			return validUTF8(s), nil
		case c == '\\':
			return d.escapedStr(start)
		case c < 0x20:
			return "", d.errorf("control character in string")
		}
		d.pos++
	}
	return "", d.errorf("unterminated string")
}

// validUTF8 is s with each invalid byte replaced by U+FFFD (as encoding/json does).
func validUTF8(s []byte) string {
	if utf8.Valid(s) {
		return string(s)
	}
	out := make([]byte, 0, len(s)+8)
	for len(s) > 0 {
		r, n := utf8.DecodeRune(s)
		out = utf8.AppendRune(out, r)
		s = s[n:]
	}
	return string(out)
}

var jsonEscapes = map[byte]byte{'"': '"', '\\': '\\', '/': '/', 'b': '\b', 'f': '\f', 'n': '\n', 'r': '\r', 't': '\t'}

// escapedStr finishes a string with escapes; d.pos is at the first backslash.
func (d *jsonDecoder) escapedStr(start int) (string, error) {
	b := append([]byte(nil), d.data[start:d.pos]...)
	for d.pos < len(d.data) {
		c := d.data[d.pos]
		switch {
		case c == '"':
			d.pos++
			return validUTF8(b), nil
		case c < 0x20:
			return "", d.errorf("control character in string")
		case c != '\\':
			b = append(b, c)
			d.pos++
			continue
		}
		if d.pos+1 >= len(d.data) {
			break
		}
		e := d.data[d.pos+1]
		d.pos += 2
		if r, ok := jsonEscapes[e]; ok {
			b = append(b, r)
			continue
		}
		if e != 'u' {
			return "", d.errorf("bad escape \\%c", e)
		}
		r0, err := d.hex4()
		if err != nil {
			return "", err
		}
		r := r0
		if utf16.IsSurrogate(r) {
			// As encoding/json: the next \u escape is taken only when it completes a
			// valid pair; otherwise this one is U+FFFD and the next is read on its own.
			r = utf8.RuneError
			if at := d.pos; bytes.HasPrefix(d.data[at:], []byte(`\u`)) {
				d.pos += 2
				if r2, err := d.hex4(); err == nil {
					if dec := utf16.DecodeRune(r0, r2); dec != utf8.RuneError {
						r = dec
						at = d.pos
					}
				}
				d.pos = at
			}
		}
		b = utf8.AppendRune(b, r)
	}
	return "", d.errorf("unterminated string")
}

func (d *jsonDecoder) hex4() (rune, error) {
	if d.pos+4 > len(d.data) {
		return 0, d.errorf("truncated \\u escape")
	}
	v, err := strconv.ParseUint(string(d.data[d.pos:d.pos+4]), 16, 32)
	if err != nil {
		return 0, d.errorf("bad \\u escape")
	}
	d.pos += 4
	return rune(v), nil
}

// number decodes a JSON number: an int64 when it has no fraction or exponent and fits,
// else a float64.
func (d *jsonDecoder) number() (any, error) {
	start := d.pos
	isFloat := false
	if d.data[d.pos] == '-' {
		d.pos++
	}
	digits := func() int {
		n := 0
		for d.pos < len(d.data) && d.data[d.pos] >= '0' && d.data[d.pos] <= '9' {
			d.pos++
			n++
		}
		return n
	}
	if n := digits(); n == 0 || n > 1 && d.data[d.pos-n] == '0' {
		return nil, d.errorf("bad number")
	}
	if d.pos < len(d.data) && d.data[d.pos] == '.' {
		d.pos++
		isFloat = true
		if digits() == 0 {
			return nil, d.errorf("bad number")
		}
	}
	if d.pos < len(d.data) && (d.data[d.pos] == 'e' || d.data[d.pos] == 'E') {
		d.pos++
		isFloat = true
		if d.pos < len(d.data) && (d.data[d.pos] == '+' || d.data[d.pos] == '-') {
			d.pos++
		}
		if digits() == 0 {
			return nil, d.errorf("bad number")
		}
	}
	text := string(d.data[start:d.pos])
	if !isFloat {
		if i, err := strconv.ParseInt(text, 10, 64); err == nil {
			return i, nil
		}
	}
	f, err := strconv.ParseFloat(text, 64)
	if err != nil && !errors.Is(err, strconv.ErrRange) {
		return nil, d.errorf("bad number %s", text)
	}
	return f, nil
}
