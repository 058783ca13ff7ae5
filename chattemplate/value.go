package chattemplate

import (
	"encoding/json"
	"fmt"
	"math"
	"reflect"
	"sort"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"
)

// The engine's values, mirroring the Python objects Jinja sees in vLLM:
//
//	nil        None
//	undefined  jinja2.Undefined (a missing variable, attribute or key)
//	bool, int64, float64, string
//	[]any      list (templates cannot mutate lists: transformers renders in an
//	           ImmutableSandboxedEnvironment, so sharing caller slices is safe)
//	tuple      tuple (prints with parentheses)
//	*Dict      dict with insertion order (Python 3.7+ order; tojson and items() show it)
//	*namespace jinja2's namespace(): the one mutable object templates can assign into
//	*macro, builtin: callables
type (
	undefined struct{ name string }
	tuple     []any
	namespace struct{ d *Dict }
	builtin   struct {
		name string
		fn   func(ev *evaluator, line int, args []any, kw []kwval) (any, error)
	}
	kwval struct {
		name string
		v    any
	}
)

// Dict is an ordered string-keyed mapping: the value a JSON object decodes to when key
// order must survive into the template (tojson, items(), for loops print keys in the
// order the request had them). Build one with NewDict and Set, or with DecodeJSON.
type Dict struct {
	keys []string
	vals []any // vals[i] is the value of keys[i]
	// index maps a key to its position once the Dict has more than dictIndexAt keys; a
	// small Dict (a chat message, a namespace) is searched linearly and costs no map.
	// Go maps are seeded per process, so hostile keys cannot flood it.
	index map[string]int
}

const dictIndexAt = 8

// NewDict returns an empty Dict.
func NewDict() *Dict { return &Dict{} }

func (d *Dict) find(k string) int {
	if d.index != nil {
		if i, ok := d.index[k]; ok {
			return i
		}
		return -1
	}
	for i, key := range d.keys {
		if key == k {
			return i
		}
	}
	return -1
}

// Set stores v under k, appending k to the key order when it is new.
func (d *Dict) Set(k string, v any) {
	if i := d.find(k); i >= 0 {
		d.vals[i] = v
		return
	}
	d.keys = append(d.keys, k)
	d.vals = append(d.vals, v)
	switch {
	case d.index != nil:
		d.index[k] = len(d.keys) - 1
	case len(d.keys) > dictIndexAt:
		d.index = make(map[string]int, 2*len(d.keys))
		for i, key := range d.keys {
			d.index[key] = i
		}
	}
}

// Get returns the value under k.
func (d *Dict) Get(k string) (any, bool) {
	if i := d.find(k); i >= 0 {
		return d.vals[i], true
	}
	return nil, false
}

// Keys returns the keys in insertion order (the caller must not modify the slice).
func (d *Dict) Keys() []string { return d.keys }

// Len returns the number of keys.
func (d *Dict) Len() int { return len(d.keys) }

// MarshalJSON writes the Dict in key order (json.dumps style is tojson's business; this is
// plain JSON for callers that log or forward a Dict).
func (d *Dict) MarshalJSON() ([]byte, error) {
	var b strings.Builder
	b.WriteByte('{')
	for i, k := range d.keys {
		if i > 0 {
			b.WriteByte(',')
		}
		kb, _ := json.Marshal(k)
		b.Write(kb)
		b.WriteByte(':')
		vb, err := json.Marshal(d.vals[i])
		if err != nil {
			return nil, err
		}
		b.Write(vb)
	}
	b.WriteByte('}')
	return []byte(b.String()), nil
}

func isUndefined(v any) bool {
	_, ok := v.(undefined)
	return ok
}

// fromGo converts a caller's Go value into an engine value. Maps become Dicts with
// sorted keys (a Go map has no order; pass a *Dict, or JSON through DecodeJSON, to keep
// one, or a json.RawMessage, which is decoded by DecodeJSON). A float64 with an integral
// value becomes an int, as JSON "2" decoded by encoding/json would otherwise print as
// "2.0"; json.Number keeps the distinction exact.
func fromGo(v any, depth int) (any, error) {
	if depth > maxValueDepth {
		return nil, fmt.Errorf("context nests deeper than %d levels", maxValueDepth)
	}
	switch x := v.(type) {
	case nil, bool, int64, string, *Dict, undefined, tuple, *namespace:
		return x, nil
	case int:
		return int64(x), nil
	case int32:
		return int64(x), nil
	case uint32:
		return int64(x), nil
	case float64:
		if x == math.Trunc(x) && math.Abs(x) < 1<<53 {
			return int64(x), nil
		}
		return x, nil
	case float32:
		return fromGo(float64(x), depth)
	case json.RawMessage:
		return DecodeJSON(x)
	case json.Number:
		if i, err := x.Int64(); err == nil {
			return i, nil
		}
		f, err := x.Float64()
		if err != nil {
			return nil, fmt.Errorf("bad number %q", string(x))
		}
		return f, nil
	case []any:
		out := make([]any, len(x))
		for i, e := range x {
			c, err := fromGo(e, depth+1)
			if err != nil {
				return nil, err
			}
			out[i] = c
		}
		return out, nil
	case map[string]any:
		keys := make([]string, 0, len(x))
		for k := range x {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		d := NewDict()
		for _, k := range keys {
			c, err := fromGo(x[k], depth+1)
			if err != nil {
				return nil, err
			}
			d.Set(k, c)
		}
		return d, nil
	}
	return fromReflect(v, depth)
}

// fromReflect handles the remaining slices, maps and numbers ([]string,
// []map[string]any, map[string]string, uint, ...).
func fromReflect(v any, depth int) (any, error) {
	rv := reflect.ValueOf(v)
	switch rv.Kind() {
	case reflect.Slice, reflect.Array:
		out := make([]any, rv.Len())
		for i := range out {
			c, err := fromGo(rv.Index(i).Interface(), depth+1)
			if err != nil {
				return nil, err
			}
			out[i] = c
		}
		return out, nil
	case reflect.Map:
		if rv.Type().Key().Kind() != reflect.String {
			return nil, fmt.Errorf("map keys must be strings, got %s", rv.Type().Key())
		}
		m := make(map[string]any, rv.Len())
		for it := rv.MapRange(); it.Next(); {
			m[it.Key().String()] = it.Value().Interface()
		}
		return fromGo(m, depth)
	case reflect.Int, reflect.Int8, reflect.Int16:
		return rv.Int(), nil
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint64:
		if rv.Uint() > math.MaxInt64 {
			return nil, fmt.Errorf("integer %d out of range", rv.Uint())
		}
		return int64(rv.Uint()), nil
	case reflect.Pointer:
		if rv.IsNil() {
			return nil, nil
		}
		return fromGo(rv.Elem().Interface(), depth)
	}
	return nil, fmt.Errorf("unsupported context value of type %T", v)
}

// maxValueDepth bounds nesting of context values and of tojson/repr output.
const maxValueDepth = 100

// truthy is Python's bool().
func truthy(v any) bool {
	switch x := v.(type) {
	case nil, undefined:
		return false
	case bool:
		return x
	case int64:
		return x != 0
	case float64:
		return x != 0
	case string:
		return x != ""
	case []any:
		return len(x) > 0
	case tuple:
		return len(x) > 0
	case *Dict:
		return x.Len() > 0
	}
	return true
}

// toStr is Python's str() as Jinja prints values, cut off after limit bytes (a list can
// hold one sublist many times over, so its repr can be exponentially long; callers treat
// a result longer than their bound as exceeding it).
func toStr(v any, limit int) string {
	switch x := v.(type) {
	case string:
		return x
	case undefined:
		return ""
	}
	var b strings.Builder
	writeRepr(&b, v, 0, limit)
	return b.String()
}

// writeRepr writes Python's repr() of v (str() for containers prints reprs of items).
func writeRepr(b *strings.Builder, v any, depth, limit int) {
	if depth > maxValueDepth || b.Len() > limit {
		b.WriteString("...")
		return
	}
	switch x := v.(type) {
	case nil:
		b.WriteString("None")
	case undefined:
		b.WriteString("Undefined")
	case bool:
		if x {
			b.WriteString("True")
		} else {
			b.WriteString("False")
		}
	case int64:
		b.WriteString(strconv.FormatInt(x, 10))
	case float64:
		b.WriteString(pyFloatRepr(x))
	case string:
		writePyStrRepr(b, x)
	case []any:
		writeSeqRepr(b, x, "[", "]", depth, limit)
	case tuple:
		if len(x) == 1 {
			b.WriteByte('(')
			writeRepr(b, x[0], depth+1, limit)
			b.WriteString(",)")
			return
		}
		writeSeqRepr(b, x, "(", ")", depth, limit)
	case *Dict:
		b.WriteByte('{')
		for i, k := range x.keys {
			if i > 0 {
				b.WriteString(", ")
			}
			writePyStrRepr(b, k)
			b.WriteString(": ")
			writeRepr(b, x.vals[i], depth+1, limit)
		}
		b.WriteByte('}')
	case *namespace:
		b.WriteString("<Namespace ")
		writeRepr(b, x.d, depth+1, limit)
		b.WriteByte('>')
	case *macro:
		b.WriteString("<Macro '" + x.node.name + "'>")
	case *builtin:
		b.WriteString("<built-in function " + x.name + ">")
	default:
		fmt.Fprintf(b, "%v", x)
	}
}

func writeSeqRepr(b *strings.Builder, items []any, open, close string, depth, limit int) {
	b.WriteString(open)
	for i, e := range items {
		if i > 0 {
			b.WriteString(", ")
		}
		writeRepr(b, e, depth+1, limit)
	}
	b.WriteString(close)
}

// writePyStrRepr writes Python's repr of a str: single quotes unless the text has a
// single quote and no double quote; escapes for backslash, the quote, \n \r \t, other
// non-printable characters as \xhh, \uhhhh or \Uhhhhhhhh.
func writePyStrRepr(b *strings.Builder, s string) {
	q := byte('\'')
	if strings.IndexByte(s, '\'') >= 0 && strings.IndexByte(s, '"') < 0 {
		q = '"'
	}
	b.WriteByte(q)
	for _, r := range s {
		switch {
		case r == rune(q) || r == '\\':
			b.WriteByte('\\')
			b.WriteRune(r)
		case r == '\n':
			b.WriteString(`\n`)
		case r == '\r':
			b.WriteString(`\r`)
		case r == '\t':
			b.WriteString(`\t`)
		case r < 0x20 || r == 0x7f || (r >= 0x80 && r < 0xa0):
			fmt.Fprintf(b, `\x%02x`, r)
		case r >= 0x80 && !pyIsPrintable(r):
			if r <= 0xffff {
				fmt.Fprintf(b, `\u%04x`, r)
			} else {
				fmt.Fprintf(b, `\U%08x`, r)
			}
		default:
			b.WriteRune(r)
		}
	}
	b.WriteByte(q)
}

// pyIsPrintable approximates Python's str.isprintable for non-ASCII: printable unless
// in categories Cc, Cf, Cs, Co, Cn, Zl, Zp, Zs (except the ASCII space).
func pyIsPrintable(r rune) bool {
	if r == utf8.RuneError {
		return true
	}
	return unicode.IsPrint(r) && !unicode.Is(unicode.Zs, r)
}

// pyFloatRepr is Python's repr(float): the shortest round-trip digits, in positional form
// when the exponent is in [-4, 16), with ".0" for integral values.
func pyFloatRepr(f float64) string {
	switch {
	case math.IsInf(f, 1):
		return "inf"
	case math.IsInf(f, -1):
		return "-inf"
	case math.IsNaN(f):
		return "nan"
	}
	s := strconv.FormatFloat(f, 'e', -1, 64) // d.ddde±XX
	mant, expStr, _ := strings.Cut(s, "e")
	exp, _ := strconv.Atoi(expStr)
	neg := strings.HasPrefix(mant, "-")
	mant = strings.TrimPrefix(mant, "-")
	digits := strings.Replace(mant, ".", "", 1)
	sign := ""
	if neg {
		sign = "-"
	}
	if exp < -4 || exp >= 16 {
		m := digits[:1]
		if len(digits) > 1 {
			m += "." + digits[1:]
		}
		es := "+"
		if exp < 0 {
			es = "-"
			exp = -exp
		}
		return fmt.Sprintf("%s%se%s%02d", sign, m, es, exp)
	}
	if exp < 0 {
		return sign + "0." + strings.Repeat("0", -exp-1) + digits
	}
	if len(digits) <= exp+1 {
		return sign + digits + strings.Repeat("0", exp+1-len(digits)) + ".0"
	}
	return sign + digits[:exp+1] + "." + digits[exp+1:]
}

// typeName is Python's type name of v, for error messages.
func typeName(v any) string {
	switch v.(type) {
	case nil:
		return "NoneType"
	case undefined:
		return "Undefined"
	case bool:
		return "bool"
	case int64:
		return "int"
	case float64:
		return "float"
	case string:
		return "str"
	case []any:
		return "list"
	case tuple:
		return "tuple"
	case *Dict:
		return "dict"
	case *namespace:
		return "Namespace"
	case *macro:
		return "Macro"
	case *builtin:
		return "builtin_function_or_method"
	}
	return fmt.Sprintf("%T", v)
}

// asSeq returns the items of a list or tuple.
func asSeq(v any) ([]any, bool) {
	switch x := v.(type) {
	case []any:
		return x, true
	case tuple:
		return x, true
	}
	return nil, false
}

// number returns v as a float and whether it is an int (bools count as ints, as in Python).
func number(v any) (f float64, i int64, isInt, ok bool) {
	switch x := v.(type) {
	case int64:
		return float64(x), x, true, true
	case bool:
		if x {
			return 1, 1, true, true
		}
		return 0, 0, true, true
	case float64:
		return x, 0, false, true
	}
	return 0, 0, false, false
}

// meter counts the elements deep comparisons visit; past max every comparison gives up
// (the evaluator then reports ErrLimit at its next step).
type meter struct{ n, max int }

func (m *meter) tick() bool {
	m.n++
	return m.n <= m.max
}

func (m *meter) exceeded() bool { return m.n > m.max }

// equal is Python's ==. Each call adds one to *work: a list can hold one sublist many
// times over, so the total is bounded (see meter).
func equal(a, b any, work *meter) bool {
	if !work.tick() {
		return false
	}
	if fa, ia, aInt, ok := number(a); ok {
		fb, ib, bInt, ok := number(b)
		if !ok {
			return false
		}
		if aInt && bInt {
			return ia == ib
		}
		return fa == fb
	}
	switch x := a.(type) {
	case nil:
		return b == nil
	case undefined:
		return isUndefined(b)
	case string:
		y, ok := b.(string)
		return ok && x == y
	case []any, tuple:
		xs, _ := asSeq(x)
		ys, ok := asSeq(b)
		if !ok || reflect.TypeOf(a) != reflect.TypeOf(b) || len(xs) != len(ys) {
			return false
		}
		for i := range xs {
			if !equal(xs[i], ys[i], work) {
				return false
			}
		}
		return true
	case *Dict:
		y, ok := b.(*Dict)
		if !ok || x.Len() != y.Len() {
			return false
		}
		for i, k := range x.keys {
			yv, ok := y.Get(k)
			if !ok || !equal(x.vals[i], yv, work) {
				return false
			}
		}
		return true
	}
	return a == b
}

// compare is Python's ordering for numbers, strings and sequences; ok is false when the
// types are not orderable. Work is counted as in equal.
func compare(a, b any, work *meter) (int, bool) {
	if !work.tick() {
		return 0, false
	}
	if fa, ia, aInt, ok := number(a); ok {
		fb, ib, bInt, ok := number(b)
		if !ok {
			return 0, false
		}
		if aInt && bInt {
			return cmpOrdered(ia, ib), true
		}
		return cmpOrdered(fa, fb), true
	}
	if sa, ok := a.(string); ok {
		sb, ok := b.(string)
		if !ok {
			return 0, false
		}
		return strings.Compare(sa, sb), true
	}
	xs, ok1 := asSeq(a)
	ys, ok2 := asSeq(b)
	if !ok1 || !ok2 {
		return 0, false
	}
	for i := 0; i < len(xs) && i < len(ys); i++ {
		if equal(xs[i], ys[i], work) {
			continue
		}
		return compare(xs[i], ys[i], work)
	}
	return cmpOrdered(len(xs), len(ys)), true
}

func cmpOrdered[T int | int64 | float64](a, b T) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// runeLen is len() of a Python str: code points.
func runeLen(s string) int {
	for i := 0; i < len(s); i++ {
		if s[i] >= utf8.RuneSelf {
			return utf8.RuneCountInString(s)
		}
	}
	return len(s)
}
