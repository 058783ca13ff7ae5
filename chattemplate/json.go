package chattemplate

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"sort"
	"strconv"
	"strings"
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
		o.itemSep, o.keySep = toStr(seps[0]), toStr(seps[1])
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
		return fmt.Errorf("Object of type %s is not JSON serializable", typeName(v))
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
		if err := writeJSON(b, d.vals[k], o, depth+1, limit); err != nil {
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
// exponent become integers (others floats), and duplicate keys keep the last value in the
// first key's place. Nesting is bounded (100 levels).
func DecodeJSON(data []byte) (any, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	v, err := decodeValue(dec, 0)
	if err != nil {
		return nil, fmt.Errorf("chattemplate: decode JSON: %w", err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, errors.New("chattemplate: decode JSON: data after the value")
	}
	return v, nil
}

func decodeValue(dec *json.Decoder, depth int) (any, error) {
	if depth > maxValueDepth {
		return nil, fmt.Errorf("nesting deeper than %d", maxValueDepth)
	}
	t, err := dec.Token()
	if err != nil {
		return nil, err
	}
	switch x := t.(type) {
	case json.Delim:
		switch x {
		case '{':
			d := NewDict()
			for dec.More() {
				kt, err := dec.Token()
				if err != nil {
					return nil, err
				}
				v, err := decodeValue(dec, depth+1)
				if err != nil {
					return nil, err
				}
				d.Set(kt.(string), v)
			}
			_, err := dec.Token()
			return d, err
		case '[':
			out := []any{}
			for dec.More() {
				v, err := decodeValue(dec, depth+1)
				if err != nil {
					return nil, err
				}
				out = append(out, v)
			}
			_, err := dec.Token()
			return out, err
		}
		return nil, fmt.Errorf("unexpected %v", x)
	case json.Number:
		if !strings.ContainsAny(string(x), ".eE") {
			if i, err := x.Int64(); err == nil {
				return i, nil
			}
		}
		return x.Float64()
	}
	return t, nil // string, bool, nil
}
