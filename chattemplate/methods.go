package chattemplate

import (
	"strings"
	"unicode"
	"unicode/utf8"
)

// method is a Python method bound to its receiver: "content.split" evaluates to one and a
// call runs it. Only methods that do not mutate are offered (the sandbox is immutable).
type method struct {
	recv any
	name string
}

func boundMethod(recv any, name string) *method { return &method{recv: recv, name: name} }

func isStrMethod(name string) bool {
	switch name {
	case "upper", "lower", "strip", "lstrip", "rstrip", "split", "rsplit", "splitlines",
		"startswith", "endswith", "replace", "title", "capitalize", "find", "rfind", "count",
		"join", "isdigit", "isalpha", "isalnum", "isspace", "isupper", "islower", "index",
		"removeprefix", "removesuffix", "zfill", "center", "ljust", "rjust", "swapcase", "casefold":
		return true
	}
	return false
}

func isDictMethod(name string) bool {
	switch name {
	case "items", "keys", "values", "get":
		return true
	}
	return false
}

func (ev *evaluator) callMethod(line int, m *method, args []any, kw []kwval) (any, error) {
	switch r := m.recv.(type) {
	case string:
		return ev.strMethod(line, r, m.name, args, kw)
	case *Dict:
		return ev.dictMethod(line, r, m.name, args)
	case []any, tuple:
		items, _ := asSeq(r)
		if len(args) != 1 {
			return nil, ev.errf(line, "%s() takes exactly one argument", m.name)
		}
		n := int64(0)
		for i, it := range items {
			if equal(it, args[0], &ev.work) {
				if m.name == "index" {
					return int64(i), nil
				}
				n++
			}
		}
		if m.name == "index" {
			return nil, ev.errf(line, "%s is not in list", ev.str(args[0]))
		}
		return n, nil
	}
	return nil, ev.errf(line, "'%s' object has no method '%s'", typeName(m.recv), m.name)
}

func (ev *evaluator) dictMethod(line int, d *Dict, name string, args []any) (any, error) {
	switch name {
	case "items":
		out := make([]any, len(d.keys))
		for i, k := range d.keys {
			out[i] = tuple{k, d.vals[i]}
		}
		return out, nil
	case "keys":
		out := make([]any, len(d.keys))
		for i, k := range d.keys {
			out[i] = k
		}
		return out, nil
	case "values":
		out := make([]any, len(d.keys))
		copy(out, d.vals)
		return out, nil
	case "get":
		if len(args) < 1 || len(args) > 2 {
			return nil, ev.errf(line, "get expected 1 or 2 arguments, got %d", len(args))
		}
		if k, ok := args[0].(string); ok {
			if v, ok := d.Get(k); ok {
				return v, nil
			}
		}
		if len(args) == 2 {
			return args[1], nil
		}
		return nil, nil
	}
	return nil, ev.errf(line, "'dict' object has no method '%s'", name)
}

// strArgs checks a string method's argument count and that the arguments are strings
// (None allowed where Python allows it: strip(None), split(None)).
func (ev *evaluator) strArgs(line int, name string, args []any, min, max int) ([]string, []bool, error) {
	if len(args) < min || len(args) > max {
		return nil, nil, ev.errf(line, "str.%s() takes %d to %d arguments (%d given)", name, min, max, len(args))
	}
	out := make([]string, len(args))
	present := make([]bool, len(args))
	for i, a := range args {
		switch v := a.(type) {
		case string:
			out[i], present[i] = v, true
		case nil:
		default:
			if i == 1 && (name == "split" || name == "rsplit" || name == "replace") {
				continue // maxsplit/count, read by the caller
			}
			return nil, nil, ev.errf(line, "str.%s() argument must be str or None, not %s", name, typeName(a))
		}
	}
	return out, present, nil
}

func (ev *evaluator) strMethod(line int, s, name string, args []any, kw []kwval) (any, error) {
	for _, k := range kw {
		switch {
		case (name == "split" || name == "rsplit") && k.name == "sep":
			args = append([]any{k.v}, args...)
		case (name == "split" || name == "rsplit") && k.name == "maxsplit":
			if len(args) == 0 {
				args = append(args, nil)
			}
			args = append(args, k.v)
		default:
			return nil, ev.errf(line, "str.%s() got an unexpected keyword argument '%s'", name, k.name)
		}
	}
	switch name {
	case "upper":
		return pyUpper(s), nil
	case "lower":
		return strings.ToLower(s), nil
	case "title":
		return pyTitle(s), nil
	case "capitalize":
		return pyCapitalize(s), nil
	case "swapcase":
		return strings.Map(func(r rune) rune {
			if unicode.IsUpper(r) {
				return unicode.ToLower(r)
			}
			return unicode.ToUpper(r)
		}, s), nil
	case "casefold":
		return strings.ToLower(s), nil
	case "strip", "lstrip", "rstrip":
		a, present, err := ev.strArgs(line, name, args, 0, 1)
		if err != nil {
			return nil, err
		}
		if ev.opts.jsStrip {
			return jsStrip(s, name), nil
		}
		return pyStrip(s, name, a, present), nil
	case "split", "rsplit":
		return ev.pySplit(line, s, name, args)
	case "splitlines":
		lines := strings.Split(strings.TrimSuffix(s, "\n"), "\n")
		if s == "" {
			lines = nil
		}
		out := make([]any, len(lines))
		for i, l := range lines {
			out[i] = l
		}
		return out, nil
	case "startswith", "endswith":
		return ev.affix(line, s, name, args)
	case "replace":
		return ev.pyReplace(line, s, args)
	case "find", "rfind", "index", "count":
		a, _, err := ev.strArgs(line, name, args, 1, 1)
		if err != nil {
			return nil, err
		}
		return strSearch(s, name, a[0]), nil
	case "removeprefix", "removesuffix":
		a, _, err := ev.strArgs(line, name, args, 1, 1)
		if err != nil {
			return nil, err
		}
		if name == "removeprefix" {
			return strings.TrimPrefix(s, a[0]), nil
		}
		return strings.TrimSuffix(s, a[0]), nil
	case "join":
		if len(args) != 1 {
			return nil, ev.errf(line, "str.join() takes exactly one argument")
		}
		items, err := ev.iterate(line, args[0])
		if err != nil {
			return nil, err
		}
		parts := make([]string, len(items))
		for i, it := range items {
			p, ok := it.(string)
			if !ok {
				return nil, ev.errf(line, "sequence item %d: expected str instance, %s found", i, typeName(it))
			}
			parts[i] = p
		}
		out := strings.Join(parts, s)
		return out, ev.checkSize(line, len(out))
	case "isdigit", "isalpha", "isalnum", "isspace", "isupper", "islower":
		return strPredicate(s, name), nil
	}
	return nil, ev.errf(line, "str.%s() is not supported", name)
}

func strSearch(s, name, sub string) any {
	switch name {
	case "count":
		if sub == "" {
			return int64(runeLen(s) + 1)
		}
		return int64(strings.Count(s, sub))
	case "rfind":
		i := strings.LastIndex(s, sub)
		if i < 0 {
			return int64(-1)
		}
		return int64(runeLen(s[:i]))
	}
	i := strings.Index(s, sub)
	if i < 0 {
		return int64(-1)
	}
	return int64(runeLen(s[:i]))
}

func strPredicate(s, name string) bool {
	if s == "" {
		return false
	}
	cased := false
	for _, r := range s {
		switch name {
		case "isdigit":
			if !unicode.IsDigit(r) {
				return false
			}
		case "isalpha":
			if !unicode.IsLetter(r) {
				return false
			}
		case "isalnum":
			if !unicode.IsLetter(r) && !unicode.IsDigit(r) && !unicode.IsNumber(r) {
				return false
			}
		case "isspace":
			if !pyIsSpace(r) {
				return false
			}
		case "isupper":
			if unicode.IsLower(r) {
				return false
			}
			cased = cased || unicode.IsUpper(r)
		case "islower":
			if unicode.IsUpper(r) {
				return false
			}
			cased = cased || unicode.IsLower(r)
		}
	}
	if name == "isupper" || name == "islower" {
		return cased
	}
	return true
}

// pyStrip is str.strip/lstrip/rstrip: whitespace by default, else any character of chars.
func pyStrip(s, name string, chars []string, present []bool) string {
	cut := pyIsSpace
	if len(chars) == 1 && present[0] {
		set := chars[0]
		cut = func(r rune) bool { return strings.ContainsRune(set, r) }
	}
	return trimBy(s, name, cut)
}

// trimBy trims the characters cut selects from the ends the method name says.
func trimBy(s, name string, cut func(rune) bool) string {
	switch name {
	case "lstrip":
		return strings.TrimLeftFunc(s, cut)
	case "rstrip":
		return strings.TrimRightFunc(s, cut)
	}
	return strings.TrimFunc(s, cut)
}

// jsStrip is @huggingface/jinja's (0.5.13) str.strip/lstrip/rstrip, which ignores its
// argument and trims JavaScript's whitespace; only the oracle test uses it (renderOpts).
func jsStrip(s, name string) string {
	return trimBy(s, name, func(r rune) bool {
		return r == '\ufeff' || r != 0x85 && unicode.IsSpace(r)
	})
}

// pySplit is str.split / str.rsplit with Python's two modes: by a separator (keeps empty
// fields), or by whitespace runs (sep None: drops empty fields).
func (ev *evaluator) pySplit(line int, s, name string, args []any) (any, error) {
	a, present, err := ev.strArgs(line, name, args, 0, 2)
	if err != nil {
		return nil, err
	}
	maxsplit := -1
	if len(args) == 2 {
		_, n, isInt, ok := number(args[1])
		if !ok || !isInt {
			return nil, ev.errf(line, "str.%s() maxsplit must be an integer", name)
		}
		maxsplit = int(n)
	}
	var parts []string
	if len(a) > 0 && present[0] {
		sep := a[0]
		if sep == "" {
			return nil, ev.errf(line, "empty separator")
		}
		switch {
		case maxsplit < 0:
			parts = strings.Split(s, sep)
		case name == "split":
			parts = strings.SplitN(s, sep, maxsplit+1)
		default:
			parts = rsplitN(s, sep, maxsplit)
		}
	} else {
		parts = splitWhitespace(s, maxsplit, name == "rsplit")
	}
	out := make([]any, len(parts))
	for i, p := range parts {
		out[i] = p
	}
	return out, nil
}

func rsplitN(s, sep string, maxsplit int) []string {
	var rev []string
	for maxsplit > 0 {
		i := strings.LastIndex(s, sep)
		if i < 0 {
			break
		}
		rev = append(rev, s[i+len(sep):])
		s = s[:i]
		maxsplit--
	}
	out := []string{s}
	for i := len(rev) - 1; i >= 0; i-- {
		out = append(out, rev[i])
	}
	return out
}

// splitWhitespace is str.split() without a separator.
func splitWhitespace(s string, maxsplit int, fromRight bool) []string {
	if maxsplit < 0 {
		return strings.FieldsFunc(s, pyIsSpace)
	}
	if fromRight {
		fields := strings.FieldsFunc(s, pyIsSpace)
		if len(fields) <= maxsplit+1 {
			return fields
		}
		// The head keeps its inner whitespace: cut the last maxsplit fields off the end.
		t := strings.TrimRightFunc(s, pyIsSpace)
		var tail []string
		for range maxsplit {
			i := strings.LastIndexFunc(t, pyIsSpace)
			tail = append([]string{t[i+utf8.RuneLen(lastRune(t[:i+1])):]}, tail...)
			t = strings.TrimRightFunc(t[:i+1], pyIsSpace)
		}
		return append([]string{strings.TrimLeftFunc(t, pyIsSpace)}, tail...)
	}
	var out []string
	t := strings.TrimLeftFunc(s, pyIsSpace)
	for t != "" {
		if len(out) == maxsplit {
			out = append(out, t)
			break
		}
		i := strings.IndexFunc(t, pyIsSpace)
		if i < 0 {
			out = append(out, t)
			break
		}
		out = append(out, t[:i])
		t = strings.TrimLeftFunc(t[i:], pyIsSpace)
	}
	return out
}

func lastRune(s string) rune {
	r, _ := utf8.DecodeLastRuneInString(s)
	return r
}

func (ev *evaluator) affix(line int, s, name string, args []any) (any, error) {
	if len(args) != 1 {
		return nil, ev.errf(line, "str.%s() takes one argument here", name)
	}
	var cands []any
	switch a := args[0].(type) {
	case string:
		cands = []any{a}
	case tuple:
		cands = a
	default:
		return nil, ev.errf(line, "%s first arg must be str or a tuple of str, not %s", name, typeName(args[0]))
	}
	for _, c := range cands {
		cs, ok := c.(string)
		if !ok {
			return nil, ev.errf(line, "tuple for %s must only contain str, not %s", name, typeName(c))
		}
		if name == "startswith" && strings.HasPrefix(s, cs) || name == "endswith" && strings.HasSuffix(s, cs) {
			return true, nil
		}
	}
	return false, nil
}

func (ev *evaluator) pyReplace(line int, s string, args []any) (any, error) {
	if len(args) < 2 || len(args) > 3 {
		return nil, ev.errf(line, "replace() takes 2 or 3 arguments (%d given)", len(args))
	}
	old, ok1 := args[0].(string)
	nw, ok2 := args[1].(string)
	if !ok1 || !ok2 {
		return nil, ev.errf(line, "replace() arguments must be str")
	}
	n := -1
	if len(args) == 3 {
		_, c, isInt, ok := number(args[2])
		if !ok || !isInt {
			return nil, ev.errf(line, "replace() count must be an integer")
		}
		n = int(c)
	}
	if old != "" && len(nw) > len(old) {
		if grow := strings.Count(s, old) * (len(nw) - len(old)); len(s)+grow > ev.maxOutput {
			return nil, ev.checkSize(line, len(s)+grow)
		}
	} else if old == "" && len(s)*(len(nw)+1) > ev.maxOutput {
		return nil, ev.checkSize(line, len(s)*(len(nw)+1))
	}
	return strings.Replace(s, old, nw, n), nil
}

// pyUpper is str.upper with the special casings Go's ToUpper lacks (ß -> SS, ligatures).
func pyUpper(s string) string {
	for _, r := range s {
		if r >= utf8.RuneSelf {
			return strings.Map(unicode.ToUpper, expandSpecialUpper(s))
		}
	}
	return strings.ToUpper(s)
}

var specialUpper = strings.NewReplacer("ß", "SS", "ﬀ", "FF", "ﬁ", "FI", "ﬂ", "FL", "ﬃ", "FFI", "ﬄ", "FFL", "ﬅ", "ST", "ﬆ", "ST", "ŉ", "ʼN")

func expandSpecialUpper(s string) string { return specialUpper.Replace(s) }

// pyTitle is str.title: a cased character after an uncased one is upper-cased, the
// rest lower-cased.
func pyTitle(s string) string {
	var b strings.Builder
	prevCased := false
	for _, r := range s {
		if prevCased {
			b.WriteRune(unicode.ToLower(r))
		} else {
			b.WriteRune(unicode.ToTitle(r))
		}
		prevCased = unicode.IsUpper(r) || unicode.IsLower(r) || unicode.IsTitle(r)
	}
	return b.String()
}

func pyCapitalize(s string) string {
	r, n := utf8.DecodeRuneInString(s)
	if n == 0 {
		return s
	}
	return string(unicode.ToTitle(r)) + strings.ToLower(s[n:])
}
