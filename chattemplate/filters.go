package chattemplate

import (
	"math"
	"sort"
	"strconv"
	"strings"
	"unicode/utf8"
)

// filterFunc is one Jinja filter: x is the filtered value.
type filterFunc func(ev *evaluator, line int, x any, args []any, kw []kwval) (any, error)

// filters holds Jinja's builtin filters that chat templates use, plus transformers'
// tojson. Names not here are an error naming the filter.
var filters map[string]filterFunc

func init() {
	filters = map[string]filterFunc{
		"trim":       filterTrim,
		"tojson":     filterToJSON,
		"length":     filterLength,
		"count":      filterLength,
		"string":     func(ev *evaluator, _ int, x any, _ []any, _ []kwval) (any, error) { return ev.str(x), nil },
		"upper":      strFilter(pyUpper),
		"lower":      strFilter(strings.ToLower),
		"capitalize": strFilter(pyCapitalize),
		"title":      strFilter(pyTitle),
		"safe":       func(_ *evaluator, _ int, x any, _ []any, _ []kwval) (any, error) { return x, nil },
		"e":          strFilter(htmlEscape),
		"escape":     strFilter(htmlEscape),
		"join":       filterJoin,
		"replace":    filterReplace,
		"first":      filterFirstLast,
		"last":       filterFirstLast,
		"list":       filterList,
		"map":        filterMap,
		"select":     filterSelect,
		"reject":     filterSelect,
		"selectattr": filterSelect,
		"rejectattr": filterSelect,
		"default":    filterDefault,
		"d":          filterDefault,
		"items":      filterItems,
		"dictsort":   filterDictsort,
		"sort":       filterSort,
		"unique":     filterUnique,
		"reverse":    filterReverse,
		"int":        filterInt,
		"float":      filterFloat,
		"abs":        filterAbs,
		"round":      filterRound,
		"indent":     filterIndent,
		"wordcount": func(ev *evaluator, _ int, x any, _ []any, _ []kwval) (any, error) {
			return int64(len(strings.Fields(ev.str(x)))), nil
		},
		"min":  filterMinMax,
		"max":  filterMinMax,
		"sum":  filterSum,
		"attr": filterAttr,
	}
}

func (ev *evaluator) applyFilter(f *filterExpr, x any, sc *scope) (any, error) {
	if err := ev.step(f.line); err != nil {
		return nil, err
	}
	fn, ok := filters[f.name]
	if !ok {
		return nil, ev.errf(f.line, "no filter named '%s'", f.name)
	}
	args, kw, err := ev.evalArgs(f.args, f.kwargs, sc)
	if err != nil {
		return nil, err
	}
	// The filter name travels in kw's zero-name slot only for the filters that share a
	// function (select/reject, first/last, min/max).
	return fn(ev, f.line, x, args, append(kw, kwval{name: "", v: f.name}))
}

// params binds positional and keyword arguments to named parameters with defaults;
// the trailing nameless kwval (the filter's own name) is skipped.
func (ev *evaluator) params(line int, fname string, args []any, kw []kwval, names []string, defaults []any) ([]any, error) {
	if len(args) > len(names) {
		return nil, ev.errf(line, "%s() takes at most %d arguments (%d given)", fname, len(names), len(args))
	}
	out := append([]any(nil), defaults...)
	copy(out, args)
	for _, k := range kw {
		if k.name == "" {
			continue
		}
		i := indexOf(names, k.name)
		if i < 0 {
			return nil, ev.errf(line, "%s() got an unexpected keyword argument '%s'", fname, k.name)
		}
		out[i] = k.v
	}
	return out, nil
}

func indexOf(list []string, s string) int {
	for i, v := range list {
		if v == s {
			return i
		}
	}
	return -1
}

// ownName is the name the filter was called by.
func ownName(kw []kwval) string {
	if len(kw) > 0 && kw[len(kw)-1].name == "" {
		return kw[len(kw)-1].v.(string)
	}
	return ""
}

func strFilter(f func(string) string) filterFunc {
	return func(ev *evaluator, _ int, x any, _ []any, _ []kwval) (any, error) { return f(ev.str(x)), nil }
}

var htmlReplacer = strings.NewReplacer("&", "&amp;", "<", "&lt;", ">", "&gt;", `"`, "&#34;", "'", "&#39;")

func htmlEscape(s string) string { return htmlReplacer.Replace(s) }

func filterTrim(ev *evaluator, line int, x any, args []any, kw []kwval) (any, error) {
	p, err := ev.params(line, "trim", args, kw, []string{"chars"}, []any{nil})
	if err != nil {
		return nil, err
	}
	if p[0] == nil {
		return strings.TrimFunc(ev.str(x), pyIsSpace), nil
	}
	return pyStrip(ev.str(x), "strip", []string{ev.str(p[0])}, []bool{true}), nil
}

func filterLength(ev *evaluator, line int, x any, _ []any, _ []kwval) (any, error) {
	switch v := x.(type) {
	case string:
		return int64(runeLen(v)), nil
	case []any:
		return int64(len(v)), nil
	case tuple:
		return int64(len(v)), nil
	case *Dict:
		return int64(v.Len()), nil
	case undefined:
		return int64(0), nil
	case *namespace:
		return int64(v.d.Len()), nil
	}
	return nil, ev.errf(line, "object of type '%s' has no len()", typeName(x))
}

func filterJoin(ev *evaluator, line int, x any, args []any, kw []kwval) (any, error) {
	p, err := ev.params(line, "join", args, kw, []string{"d", "attribute"}, []any{"", nil})
	if err != nil {
		return nil, err
	}
	items, err := ev.iterate(line, x)
	if err != nil {
		return nil, err
	}
	var b strings.Builder
	sep := ev.str(p[0])
	for i, it := range items {
		if p[1] != nil {
			if it, err = ev.getItem(line, it, p[1]); err != nil {
				return nil, err
			}
		}
		if i > 0 {
			b.WriteString(sep)
		}
		b.WriteString(ev.str(it))
		if err := ev.checkSize(line, b.Len()); err != nil {
			return nil, err
		}
	}
	return b.String(), nil
}

func filterReplace(ev *evaluator, line int, x any, args []any, kw []kwval) (any, error) {
	p, err := ev.params(line, "replace", args, kw, []string{"old", "new", "count"}, []any{undefined{}, undefined{}, nil})
	if err != nil {
		return nil, err
	}
	a := []any{ev.str(p[0]), ev.str(p[1])}
	if p[2] != nil {
		a = append(a, p[2])
	}
	return ev.pyReplace(line, ev.str(x), a)
}

func filterFirstLast(ev *evaluator, line int, x any, _ []any, kw []kwval) (any, error) {
	items, err := ev.iterate(line, x)
	if err != nil {
		return nil, err
	}
	if len(items) == 0 {
		return undefined{name: "no first item"}, nil
	}
	if ownName(kw) == "last" {
		return items[len(items)-1], nil
	}
	return items[0], nil
}

func filterList(ev *evaluator, line int, x any, _ []any, _ []kwval) (any, error) {
	items, err := ev.iterate(line, x)
	if err != nil {
		return nil, err
	}
	return append([]any(nil), items...), nil
}

// filterMap is map(attribute='a', default=d) or map('filter', args...).
func filterMap(ev *evaluator, line int, x any, args []any, kw []kwval) (any, error) {
	items, err := ev.iterate(line, x)
	if err != nil {
		return nil, err
	}
	var attr, def any
	hasAttr := false
	for _, k := range kw {
		switch k.name {
		case "attribute":
			attr, hasAttr = k.v, true
		case "default":
			def = k.v
		}
	}
	out := make([]any, len(items))
	for i, it := range items {
		if err := ev.step(line); err != nil {
			return nil, err
		}
		if hasAttr {
			v, err := ev.lookupPath(line, it, attr)
			if err != nil {
				return nil, err
			}
			if isUndefined(v) && def != nil {
				v = def
			}
			out[i] = v
			continue
		}
		if len(args) == 0 {
			return nil, ev.errf(line, "map() needs a filter name or attribute=")
		}
		name := ev.str(args[0])
		fn, ok := filters[name]
		if !ok {
			return nil, ev.errf(line, "no filter named '%s'", name)
		}
		v, err := fn(ev, line, it, args[1:], []kwval{{name: "", v: name}})
		if err != nil {
			return nil, err
		}
		out[i] = v
	}
	return out, nil
}

// lookupPath is jinja2's make_attrgetter: "a.b.0" walks items.
func (ev *evaluator) lookupPath(line int, x, path any) (any, error) {
	ps, ok := path.(string)
	if !ok {
		return ev.getItem(line, x, path)
	}
	for _, part := range strings.Split(ps, ".") {
		var key any = part
		if n, err := strconv.ParseInt(part, 10, 64); err == nil {
			key = n
		}
		var err error
		if x, err = ev.getItem(line, x, key); err != nil {
			return nil, err
		}
	}
	return x, nil
}

// filterSelect is select/reject(test, args...) and selectattr/rejectattr(attr, test, args...).
func filterSelect(ev *evaluator, line int, x any, args []any, kw []kwval) (any, error) {
	name := ownName(kw)
	items, err := ev.iterate(line, x)
	if err != nil {
		return nil, err
	}
	byAttr := strings.HasSuffix(name, "attr")
	keep := strings.HasPrefix(name, "select")
	if byAttr {
		if len(args) == 0 {
			return nil, ev.errf(line, "%s() needs an attribute name", name)
		}
	}
	var attr any
	if byAttr {
		attr, args = args[0], args[1:]
	}
	var test testFunc
	if len(args) > 0 {
		tn := ev.str(args[0])
		if test = tests[tn]; test == nil {
			return nil, ev.errf(line, "no test named '%s'", tn)
		}
		args = args[1:]
	}
	var out []any
	for _, it := range items {
		if err := ev.step(line); err != nil {
			return nil, err
		}
		v := it
		if byAttr {
			if v, err = ev.lookupPath(line, it, attr); err != nil {
				return nil, err
			}
		}
		ok := truthy(v)
		if test != nil {
			if ok, err = test(ev, line, v, args); err != nil {
				return nil, err
			}
		}
		if ok == keep {
			out = append(out, it)
		}
	}
	return out, nil
}

func filterDefault(ev *evaluator, line int, x any, args []any, kw []kwval) (any, error) {
	p, err := ev.params(line, "default", args, kw, []string{"default_value", "boolean"}, []any{"", false})
	if err != nil {
		return nil, err
	}
	if isUndefined(x) || truthy(p[1]) && !truthy(x) {
		return p[0], nil
	}
	return x, nil
}

func filterItems(ev *evaluator, line int, x any, _ []any, _ []kwval) (any, error) {
	switch v := x.(type) {
	case undefined:
		return []any{}, nil
	case *Dict:
		return ev.dictMethod(line, v, "items", nil)
	}
	return nil, ev.errf(line, "can only get item pairs from a mapping, not %s", typeName(x))
}

func filterDictsort(ev *evaluator, line int, x any, args []any, kw []kwval) (any, error) {
	p, err := ev.params(line, "dictsort", args, kw, []string{"case_sensitive", "by", "reverse"}, []any{false, "key", false})
	if err != nil {
		return nil, err
	}
	d, ok := x.(*Dict)
	if !ok {
		return nil, ev.errf(line, "dictsort() needs a mapping, not %s", typeName(x))
	}
	pairs, _ := ev.dictMethod(line, d, "items", nil)
	items := pairs.([]any)
	pos := 0
	if ev.str(p[1]) == "value" {
		pos = 1
	}
	return items, ev.sortItems(line, items, truthy(p[0]), truthy(p[2]), func(v any) (any, error) { return v.(tuple)[pos], nil })
}

func filterSort(ev *evaluator, line int, x any, args []any, kw []kwval) (any, error) {
	p, err := ev.params(line, "sort", args, kw, []string{"reverse", "case_sensitive", "attribute"}, []any{false, false, nil})
	if err != nil {
		return nil, err
	}
	items, err := filterList(ev, line, x, nil, nil)
	if err != nil {
		return nil, err
	}
	list := items.([]any)
	key := func(v any) (any, error) { return v, nil }
	if p[2] != nil {
		key = func(v any) (any, error) { return ev.lookupPath(line, v, p[2]) }
	}
	return list, ev.sortItems(line, list, truthy(p[1]), truthy(p[0]), key)
}

// sortItems is a stable sort by key (strings folded to lower case unless caseSensitive).
func (ev *evaluator) sortItems(line int, items []any, caseSensitive, reverse bool, key func(any) (any, error)) error {
	keys := make([]any, len(items))
	for i, it := range items {
		k, err := key(it)
		if err != nil {
			return err
		}
		if s, ok := k.(string); ok && !caseSensitive {
			k = strings.ToLower(s)
		}
		keys[i] = k
	}
	var cmpErr error
	idx := make([]int, len(items))
	for i := range idx {
		idx[i] = i
	}
	sort.SliceStable(idx, func(a, b int) bool {
		c, ok := compare(keys[idx[a]], keys[idx[b]], &ev.work)
		if ev.work.exceeded() && cmpErr == nil {
			cmpErr = ev.step(line)
		}
		if !ok && cmpErr == nil {
			cmpErr = ev.errf(line, "'<' not supported between instances of '%s' and '%s'", typeName(keys[idx[a]]), typeName(keys[idx[b]]))
		}
		if reverse {
			return c > 0
		}
		return c < 0
	})
	sorted := make([]any, len(items))
	for i, j := range idx {
		sorted[i] = items[j]
	}
	copy(items, sorted)
	return cmpErr
}

func filterUnique(ev *evaluator, line int, x any, args []any, kw []kwval) (any, error) {
	p, err := ev.params(line, "unique", args, kw, []string{"case_sensitive", "attribute"}, []any{false, nil})
	if err != nil {
		return nil, err
	}
	items, err := ev.iterate(line, x)
	if err != nil {
		return nil, err
	}
	var out, seen []any
	for _, it := range items {
		if err := ev.step(line); err != nil {
			return nil, err
		}
		k := it
		if p[1] != nil {
			if k, err = ev.lookupPath(line, it, p[1]); err != nil {
				return nil, err
			}
		}
		if s, ok := k.(string); ok && !truthy(p[0]) {
			k = strings.ToLower(s)
		}
		dup := false
		for _, s := range seen {
			if equal(s, k, &ev.work) {
				dup = true
				break
			}
		}
		if !dup {
			seen = append(seen, k)
			out = append(out, it)
		}
	}
	return out, nil
}

func filterReverse(ev *evaluator, line int, x any, _ []any, _ []kwval) (any, error) {
	if s, ok := x.(string); ok {
		rs := []rune(s)
		for i, j := 0, len(rs)-1; i < j; i, j = i+1, j-1 {
			rs[i], rs[j] = rs[j], rs[i]
		}
		return string(rs), nil
	}
	items, err := ev.iterate(line, x)
	if err != nil {
		return nil, err
	}
	out := make([]any, len(items))
	for i, it := range items {
		out[len(items)-1-i] = it
	}
	return out, nil
}

func filterInt(ev *evaluator, line int, x any, args []any, kw []kwval) (any, error) {
	p, err := ev.params(line, "int", args, kw, []string{"default", "base"}, []any{int64(0), int64(10)})
	if err != nil {
		return nil, err
	}
	switch v := x.(type) {
	case int64:
		return v, nil
	case bool:
		if v {
			return int64(1), nil
		}
		return int64(0), nil
	case float64:
		if math.IsNaN(v) || math.IsInf(v, 0) || math.Abs(v) >= 1<<63 {
			return p[0], nil
		}
		return int64(v), nil
	case string:
		_, base, _, _ := number(p[1])
		s := strings.ReplaceAll(strings.TrimFunc(v, pyIsSpace), "_", "")
		if n, err := strconv.ParseInt(s, int(base), 64); err == nil {
			return n, nil
		}
		if f, err := strconv.ParseFloat(s, 64); err == nil && math.Abs(f) < 1<<63 {
			return int64(f), nil
		}
	}
	return p[0], nil
}

func filterFloat(ev *evaluator, line int, x any, args []any, kw []kwval) (any, error) {
	p, err := ev.params(line, "float", args, kw, []string{"default"}, []any{0.0})
	if err != nil {
		return nil, err
	}
	if f, _, _, ok := number(x); ok {
		return f, nil
	}
	if s, ok := x.(string); ok {
		if f, err := strconv.ParseFloat(strings.TrimFunc(s, pyIsSpace), 64); err == nil {
			return f, nil
		}
	}
	return p[0], nil
}

func filterAbs(ev *evaluator, line int, x any, _ []any, _ []kwval) (any, error) {
	f, i, isInt, ok := number(x)
	switch {
	case !ok:
		return nil, ev.errf(line, "bad operand type for abs(): '%s'", typeName(x))
	case isInt && i == math.MinInt64:
		return nil, ev.errf(line, "integer overflow")
	case isInt && i < 0:
		return -i, nil
	case isInt:
		return i, nil
	}
	return math.Abs(f), nil
}

func filterRound(ev *evaluator, line int, x any, args []any, kw []kwval) (any, error) {
	p, err := ev.params(line, "round", args, kw, []string{"precision", "method"}, []any{int64(0), "common"})
	if err != nil {
		return nil, err
	}
	f, _, _, ok := number(x)
	_, prec, _, okp := number(p[0])
	if !ok || !okp {
		return nil, ev.errf(line, "round() needs a number")
	}
	m := math.Pow(10, float64(prec))
	switch ev.str(p[1]) {
	case "ceil":
		return math.Ceil(f*m) / m, nil
	case "floor":
		return math.Floor(f*m) / m, nil
	}
	return math.RoundToEven(f*m) / m, nil // Python's round(): half to even
}

func filterIndent(ev *evaluator, line int, x any, args []any, kw []kwval) (any, error) {
	p, err := ev.params(line, "indent", args, kw, []string{"width", "first", "blank"}, []any{int64(4), false, false})
	if err != nil {
		return nil, err
	}
	ind, ok := p[0].(string)
	if !ok {
		_, w, _, _ := number(p[0])
		if w < 0 || w > int64(ev.maxOutput) {
			return nil, ev.errf(line, "indent width out of range")
		}
		ind = strings.Repeat(" ", int(w))
	}
	s := ev.str(x)
	lines := strings.Split(s, "\n")
	var b strings.Builder
	for i, l := range lines {
		if i > 0 {
			b.WriteByte('\n')
			if l != "" || truthy(p[2]) {
				b.WriteString(ind)
			}
		} else if truthy(p[1]) {
			b.WriteString(ind)
		}
		b.WriteString(l)
		if err := ev.checkSize(line, b.Len()); err != nil {
			return nil, err
		}
	}
	return b.String(), nil
}

func filterMinMax(ev *evaluator, line int, x any, args []any, kw []kwval) (any, error) {
	p, err := ev.params(line, "min", args, kw, []string{"case_sensitive", "attribute"}, []any{false, nil})
	if err != nil {
		return nil, err
	}
	items, err := filterSort(ev, line, x, nil, []kwval{{name: "case_sensitive", v: p[0]}, {name: "attribute", v: p[1]}})
	if err != nil {
		return nil, err
	}
	list := items.([]any)
	if len(list) == 0 {
		return undefined{name: "no items"}, nil
	}
	if ownName(kw) == "max" {
		return list[len(list)-1], nil
	}
	return list[0], nil
}

func filterSum(ev *evaluator, line int, x any, args []any, kw []kwval) (any, error) {
	p, err := ev.params(line, "sum", args, kw, []string{"attribute", "start"}, []any{nil, int64(0)})
	if err != nil {
		return nil, err
	}
	items, err := ev.iterate(line, x)
	if err != nil {
		return nil, err
	}
	total := p[1]
	for _, it := range items {
		if p[0] != nil {
			if it, err = ev.lookupPath(line, it, p[0]); err != nil {
				return nil, err
			}
		}
		if total, err = ev.arith(line, "+", total, it); err != nil {
			return nil, err
		}
	}
	return total, nil
}

func filterAttr(ev *evaluator, line int, x any, args []any, _ []kwval) (any, error) {
	if len(args) != 1 {
		return nil, ev.errf(line, "attr() takes one argument")
	}
	return ev.getAttr(line, x, ev.str(args[0]))
}

// ---- tests ----

type testFunc func(ev *evaluator, line int, x any, args []any) (bool, error)

var tests map[string]testFunc

func init() {
	cmp := func(ops ...string) testFunc {
		return func(ev *evaluator, line int, x any, args []any) (bool, error) {
			if len(args) != 1 {
				return false, ev.errf(line, "comparison test takes one argument")
			}
			return ev.compareOp(line, ops[0], x, args[0])
		}
	}
	kind := func(f func(any) bool) testFunc {
		return func(_ *evaluator, _ int, x any, _ []any) (bool, error) { return f(x), nil }
	}
	tests = map[string]testFunc{
		"defined":   kind(func(x any) bool { return !isUndefined(x) }),
		"undefined": kind(isUndefined),
		"none":      kind(func(x any) bool { return x == nil }),
		"boolean":   kind(func(x any) bool { _, ok := x.(bool); return ok }),
		"true":      kind(func(x any) bool { b, ok := x.(bool); return ok && b }),
		"false":     kind(func(x any) bool { b, ok := x.(bool); return ok && !b }),
		"integer":   kind(func(x any) bool { _, ok := x.(int64); return ok }),
		"float":     kind(func(x any) bool { _, ok := x.(float64); return ok }),
		"number":    kind(func(x any) bool { _, _, _, ok := number(x); return ok }),
		"string":    kind(func(x any) bool { _, ok := x.(string); return ok }),
		"mapping":   kind(func(x any) bool { _, ok := x.(*Dict); return ok }),
		"sequence":  kind(isSequence),
		"iterable":  kind(func(x any) bool { _, d := x.(*Dict); return isSequence(x) || d }),
		"callable": kind(func(x any) bool {
			switch x.(type) {
			case *macro, *builtin, *method:
				return true
			}
			return false
		}),
		"lower":   kind(func(x any) bool { s, ok := x.(string); return ok && strings.ToLower(s) == s }),
		"upper":   kind(func(x any) bool { s, ok := x.(string); return ok && pyUpper(s) == s }),
		"escaped": kind(func(any) bool { return false }),
		"odd":     intTest(func(n int64) bool { return n%2 != 0 }),
		"even":    intTest(func(n int64) bool { return n%2 == 0 }),
		"divisibleby": func(ev *evaluator, line int, x any, args []any) (bool, error) {
			_, n, _, ok1 := number(x)
			var d int64
			ok2 := len(args) == 1
			if ok2 {
				_, d, _, ok2 = number(args[0])
			}
			if !ok1 || !ok2 || d == 0 {
				return false, ev.errf(line, "divisibleby needs a nonzero number")
			}
			return n%d == 0, nil
		},
		"eq": cmp("=="), "equalto": cmp("=="), "==": cmp("=="),
		"ne": cmp("!="), "!=": cmp("!="),
		"lt": cmp("<"), "lessthan": cmp("<"), "<": cmp("<"),
		"le": cmp("<="), "<=": cmp("<="),
		"gt": cmp(">"), "greaterthan": cmp(">"), ">": cmp(">"),
		"ge": cmp(">="), ">=": cmp(">="),
		"in": cmp("in"),
		"sameas": func(ev *evaluator, line int, x any, args []any) (bool, error) {
			if len(args) != 1 {
				return false, ev.errf(line, "sameas takes one argument")
			}
			switch x.(type) {
			case nil, bool:
				return x == args[0], nil
			}
			return false, nil
		},
	}
}

func isSequence(x any) bool {
	switch x.(type) {
	case string, []any, tuple, *Dict:
		return true
	}
	return false
}

func intTest(f func(int64) bool) testFunc {
	return func(ev *evaluator, line int, x any, _ []any) (bool, error) {
		_, n, isInt, ok := number(x)
		if !ok || !isInt {
			return false, ev.errf(line, "test needs an integer, got %s", typeName(x))
		}
		return f(n), nil
	}
}

func (ev *evaluator) evalTest(e *testExpr, sc *scope) (any, error) {
	x, err := ev.eval(e.x, sc)
	if err != nil {
		return nil, err
	}
	t, ok := tests[e.name]
	if !ok {
		return nil, ev.errf(e.line, "no test named '%s'", e.name)
	}
	args, _, err := ev.evalArgs(e.args, nil, sc)
	if err != nil {
		return nil, err
	}
	r, err := t(ev, e.line, x, args)
	if err != nil {
		return nil, err
	}
	return r != e.negate, nil
}

// utf8Valid reports whether s is valid UTF-8 (templates and context strings must be).
func utf8Valid(s string) bool { return utf8.ValidString(s) }
