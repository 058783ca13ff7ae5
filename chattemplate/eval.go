package chattemplate

import (
	"errors"
	"fmt"
	"math"
	"strings"
	"time"
)

// evaluator runs one Render: it owns the output, the step budget and the scopes. It is
// created per call and never shared, so a *Template can render on many goroutines.
type evaluator struct {
	out       strings.Builder
	steps     int
	maxSteps  int
	work      meter // elements visited by comparisons; max is maxSteps*workPerStep
	maxOutput int
	callDepth int
	now       func() time.Time
	root      *scope
	opts      renderOpts
}

// renderOpts are test-only switches: jsStrip reproduces @huggingface/jinja's strip, which
// ignores its chars argument, so the JavaScript oracle can be compared byte for byte.
type renderOpts struct {
	jsStrip bool
}

// scope is one level of variables: the context, a for-loop body, a macro call.
type scope struct {
	vars   map[string]any
	parent *scope
	// captured: a macro closes over this scope, so a loop must not reuse its map.
	captured bool
}

func (s *scope) lookup(name string) (any, bool) {
	for ; s != nil; s = s.parent {
		if v, ok := s.vars[name]; ok {
			return v, true
		}
	}
	return nil, false
}

func (s *scope) set(name string, v any) {
	if s.vars == nil {
		s.vars = make(map[string]any, 4)
	}
	s.vars[name] = v
}

// ctl says how a statement list ended.
type ctl uint8

const (
	ctlNone ctl = iota
	ctlBreak
	ctlContinue
)

// maxCallDepth bounds macro recursion.
const maxCallDepth = 64

func (ev *evaluator) errf(line int, format string, args ...any) error {
	return &Error{Line: line, Msg: fmt.Sprintf(format, args...)}
}

// step charges one unit of work against MaxSteps.
func (ev *evaluator) step(line int) error {
	ev.steps++
	if ev.steps > ev.maxSteps || ev.work.exceeded() {
		return &Error{Line: line, Msg: fmt.Sprintf("template ran more than %d steps", ev.maxSteps), Err: ErrLimit}
	}
	return nil
}

// workPerStep is how many element visits (comparisons, membership tests, sort and unique
// passes) one step buys: a step may look at a whole list, but not at unbounded many.
const workPerStep = 64

// str is toStr bounded by the output limit.
func (ev *evaluator) str(v any) string { return toStr(v, ev.maxOutput) }

// checkSize bounds every string, list or repetition the template builds to MaxOutput
// (units: bytes for strings, items for lists), so no value can outgrow the output bound.
func (ev *evaluator) checkSize(line, n int) error {
	if n > ev.maxOutput {
		return &Error{Line: line, Msg: fmt.Sprintf("value of %d exceeds the output bound %d", n, ev.maxOutput), Err: ErrLimit}
	}
	return nil
}

func (ev *evaluator) write(line int, s string) error {
	if ev.out.Len()+len(s) > ev.maxOutput {
		return &Error{Line: line, Msg: fmt.Sprintf("output exceeds %d bytes", ev.maxOutput), Err: ErrLimit}
	}
	ev.out.WriteString(s)
	return nil
}

func (ev *evaluator) exec(nodes []node, sc *scope) (ctl, error) {
	for _, n := range nodes {
		if err := ev.step(n.stmtLine()); err != nil {
			return ctlNone, err
		}
		c, err := ev.execOne(n, sc)
		if err != nil || c != ctlNone {
			return c, err
		}
	}
	return ctlNone, nil
}

func (ev *evaluator) execOne(n node, sc *scope) (ctl, error) {
	switch n := n.(type) {
	case *textNode:
		return ctlNone, ev.write(n.line, n.text)
	case *outputNode:
		v, err := ev.eval(n.x, sc)
		if err != nil {
			return ctlNone, err
		}
		return ctlNone, ev.write(n.line, ev.str(v))
	case *ifNode:
		for i, c := range n.conds {
			v, err := ev.eval(c, sc)
			if err != nil {
				return ctlNone, err
			}
			if truthy(v) {
				return ev.exec(n.bodies[i], sc)
			}
		}
		return ev.exec(n.els, sc)
	case *forNode:
		return ctlNone, ev.execFor(n, sc)
	case *setNode:
		return ctlNone, ev.execSet(n, sc)
	case *setBlockNode:
		s, err := ev.capture(n.body, sc, n.filters)
		if err != nil {
			return ctlNone, err
		}
		sc.set(n.name, s)
		return ctlNone, nil
	case *filterBlockNode:
		s, err := ev.capture(n.body, sc, n.filters)
		if err != nil {
			return ctlNone, err
		}
		return ctlNone, ev.write(n.line, ev.str(s))
	case *macroNode:
		sc.captured = true
		sc.set(n.name, &macro{node: n, closure: sc})
		return ctlNone, nil
	case *callBlockNode:
		return ctlNone, ev.execCallBlock(n, sc)
	case *breakNode:
		return ctlBreak, nil
	case *continueNode:
		return ctlContinue, nil
	}
	return ctlNone, ev.errf(n.stmtLine(), "unknown statement %T", n)
}

// capture renders body into a string (set blocks, filter blocks, macro bodies) and applies
// filters to it.
func (ev *evaluator) capture(body []node, sc *scope, filters []*filterExpr) (any, error) {
	saved := ev.out
	ev.out = strings.Builder{}
	_, err := ev.exec(body, sc)
	s := ev.out.String()
	ev.out = saved
	if err != nil {
		return nil, err
	}
	var v any = s
	for _, f := range filters {
		if v, err = ev.applyFilter(f, v, sc); err != nil {
			return nil, err
		}
	}
	return v, nil
}

func (ev *evaluator) execSet(n *setNode, sc *scope) error {
	v, err := ev.eval(n.x, sc)
	if err != nil {
		return err
	}
	if n.attr != "" {
		target, _ := sc.lookup(n.targets[0])
		ns, ok := target.(*namespace)
		if !ok {
			return ev.errf(n.line, "cannot assign attribute on non-namespace object %s", typeName(target))
		}
		ns.d.Set(n.attr, v)
		return nil
	}
	if len(n.targets) == 1 {
		sc.set(n.targets[0], v)
		return nil
	}
	items, err := ev.unpack(n.line, v, len(n.targets))
	if err != nil {
		return err
	}
	for i, t := range n.targets {
		sc.set(t, items[i])
	}
	return nil
}

func (ev *evaluator) unpack(line int, v any, n int) ([]any, error) {
	items, err := ev.iterate(line, v)
	if err != nil {
		return nil, err
	}
	if len(items) != n {
		return nil, ev.errf(line, "cannot unpack %d values into %d names", len(items), n)
	}
	return items, nil
}

// iterate returns what a for loop over v visits: list and tuple items, dict keys, string
// characters; undefined iterates as empty (jinja2.Undefined's __iter__).
func (ev *evaluator) iterate(line int, v any) ([]any, error) {
	switch x := v.(type) {
	case []any:
		return x, nil
	case tuple:
		return x, nil
	case *Dict:
		out := make([]any, len(x.keys))
		for i, k := range x.keys {
			out[i] = k
		}
		return out, nil
	case string:
		out := make([]any, 0, len(x))
		for _, r := range x {
			out = append(out, string(r))
		}
		return out, nil
	case undefined:
		return nil, nil
	case *namespace:
		return nil, ev.errf(line, "'Namespace' object is not iterable")
	}
	return nil, ev.errf(line, "'%s' object is not iterable", typeName(v))
}

func (ev *evaluator) execFor(n *forNode, sc *scope) error {
	iv, err := ev.eval(n.iter, sc)
	if err != nil {
		return err
	}
	items, err := ev.iterate(n.line, iv)
	if err != nil {
		return err
	}
	body := &scope{parent: sc}
	if n.filter != nil {
		kept := make([]any, 0, len(items))
		for _, it := range items {
			if err := ev.bindTargets(n, body, it); err != nil {
				return err
			}
			c, err := ev.eval(n.filter, body)
			if err != nil {
				return err
			}
			if truthy(c) {
				kept = append(kept, it)
			}
		}
		items = kept
	}
	if len(items) == 0 {
		_, err := ev.exec(n.els, sc)
		return err
	}
	loop := &loopObj{items: items}
	body = &scope{parent: sc, vars: make(map[string]any, 4)}
	for i, it := range items {
		if err := ev.step(n.line); err != nil {
			return err
		}
		// Each iteration starts from an empty scope: a set inside the body is not seen by
		// the next iteration nor after the loop (jinja2's loop scoping). The map is reused
		// unless a macro defined in the body holds on to it.
		if body.captured {
			body = &scope{parent: sc, vars: make(map[string]any, 4)}
		} else {
			clear(body.vars)
		}
		loop.i = i
		body.vars["loop"] = loop
		if err := ev.bindTargets(n, body, it); err != nil {
			return err
		}
		c, err := ev.exec(n.body, body)
		if err != nil {
			return err
		}
		if c == ctlBreak {
			break
		}
	}
	return nil
}

func (ev *evaluator) bindTargets(n *forNode, body *scope, it any) error {
	if len(n.targets) == 1 {
		body.set(n.targets[0], it)
		return nil
	}
	vals, err := ev.unpack(n.line, it, len(n.targets))
	if err != nil {
		return err
	}
	for i, t := range n.targets {
		body.set(t, vals[i])
	}
	return nil
}

// loopObj is the "loop" variable of a for body.
type loopObj struct {
	items []any
	i     int
}

func (l *loopObj) attr(name string) any {
	n := len(l.items)
	switch name {
	case "index":
		return int64(l.i + 1)
	case "index0":
		return int64(l.i)
	case "revindex":
		return int64(n - l.i)
	case "revindex0":
		return int64(n - l.i - 1)
	case "first":
		return l.i == 0
	case "last":
		return l.i == n-1
	case "length":
		return int64(n)
	case "depth":
		return int64(1)
	case "depth0":
		return int64(0)
	case "previtem":
		if l.i > 0 {
			return l.items[l.i-1]
		}
	case "nextitem":
		if l.i < n-1 {
			return l.items[l.i+1]
		}
	}
	return undefined{name: "loop." + name}
}

// macro is a {% macro %} bound to the scope it was defined in.
type macro struct {
	node    *macroNode
	closure *scope
}

func (ev *evaluator) callMacro(line int, m *macro, args []any, kw []kwval, caller any) (any, error) {
	n := m.node
	if len(args) > len(n.params) {
		return nil, ev.errf(line, "macro '%s' takes not more than %d argument(s)", n.name, len(n.params))
	}
	ev.callDepth++
	defer func() { ev.callDepth-- }()
	if ev.callDepth > maxCallDepth {
		return nil, &Error{Line: line, Msg: fmt.Sprintf("macro calls nest deeper than %d", maxCallDepth), Err: ErrLimit}
	}
	sc := &scope{parent: m.closure, vars: make(map[string]any, len(n.params)+1)}
	for i, p := range n.params {
		if i < len(args) {
			sc.vars[p] = args[i]
		}
	}
	for _, k := range kw {
		if !contains(n.params, k.name) {
			return nil, ev.errf(line, "macro '%s' has no argument '%s'", n.name, k.name)
		}
		sc.vars[k.name] = k.v
	}
	firstDefault := len(n.params) - len(n.defaults)
	for i, p := range n.params {
		if _, ok := sc.vars[p]; ok {
			continue
		}
		if i >= firstDefault {
			v, err := ev.eval(n.defaults[i-firstDefault], sc)
			if err != nil {
				return nil, err
			}
			sc.vars[p] = v
		} else {
			sc.vars[p] = undefined{name: p}
		}
	}
	if caller != nil {
		sc.vars["caller"] = caller
	}
	return ev.capture(n.body, sc, nil)
}

func (ev *evaluator) execCallBlock(n *callBlockNode, sc *scope) error {
	caller := &builtin{name: "caller", fn: func(ev *evaluator, line int, _ []any, _ []kwval) (any, error) {
		return ev.capture(n.body, sc, nil)
	}}
	fn, err := ev.eval(n.call.fn, sc)
	if err != nil {
		return err
	}
	m, ok := fn.(*macro)
	if !ok {
		return ev.errf(n.line, "call block needs a macro, got %s", typeName(fn))
	}
	args, kw, err := ev.evalArgs(n.call.args, n.call.kwargs, sc)
	if err != nil {
		return err
	}
	s, err := ev.callMacro(n.line, m, args, kw, caller)
	if err != nil {
		return err
	}
	return ev.write(n.line, ev.str(s))
}

// ---- expressions ----

func (ev *evaluator) eval(e expr, sc *scope) (any, error) {
	switch e := e.(type) {
	case *constExpr:
		return e.v, nil
	case *nameExpr:
		if v, ok := sc.lookup(e.name); ok {
			return v, nil
		}
		if g, ok := globals[e.name]; ok {
			return g, nil
		}
		return undefined{name: e.name}, nil
	case *attrExpr:
		x, err := ev.eval(e.x, sc)
		if err != nil {
			return nil, err
		}
		return ev.getAttr(e.line, x, e.name)
	case *itemExpr:
		x, err := ev.eval(e.x, sc)
		if err != nil {
			return nil, err
		}
		k, err := ev.eval(e.key, sc)
		if err != nil {
			return nil, err
		}
		return ev.getItem(e.line, x, k)
	case *sliceExpr:
		return ev.evalSlice(e, sc)
	case *unaryExpr:
		return ev.evalUnary(e, sc)
	case *binExpr:
		return ev.evalBinary(e, sc)
	case *compareExpr:
		return ev.evalCompare(e, sc)
	case *condExpr:
		c, err := ev.eval(e.cond, sc)
		if err != nil {
			return nil, err
		}
		if truthy(c) {
			return ev.eval(e.yes, sc)
		}
		if e.no == nil {
			return undefined{}, nil
		}
		return ev.eval(e.no, sc)
	case *callExpr:
		return ev.evalCall(e, sc)
	case *filterExpr:
		x, err := ev.eval(e.x, sc)
		if err != nil {
			return nil, err
		}
		return ev.applyFilter(e, x, sc)
	case *testExpr:
		return ev.evalTest(e, sc)
	case *listExpr:
		items := make([]any, len(e.items))
		for i, it := range e.items {
			v, err := ev.eval(it, sc)
			if err != nil {
				return nil, err
			}
			items[i] = v
		}
		if e.tuple {
			return tuple(items), nil
		}
		return items, nil
	case *dictExpr:
		d := NewDict()
		for i := range e.keys {
			k, err := ev.eval(e.keys[i], sc)
			if err != nil {
				return nil, err
			}
			ks, ok := k.(string)
			if !ok {
				return nil, ev.errf(e.line, "dict keys must be strings here, got %s", typeName(k))
			}
			v, err := ev.eval(e.vals[i], sc)
			if err != nil {
				return nil, err
			}
			d.Set(ks, v)
		}
		return d, nil
	}
	return nil, ev.errf(e.exprLine(), "unknown expression %T", e)
}

// getAttr is jinja2's Environment.getattr under the sandbox: a Python attribute (a
// method) first, then the item; a missing one is undefined, but any attribute of an
// undefined value is an error ("'x' is undefined").
func (ev *evaluator) getAttr(line int, x any, name string) (any, error) {
	switch o := x.(type) {
	case undefined:
		return nil, ev.undefinedErr(line, o)
	case *Dict:
		if isDictMethod(name) {
			return boundMethod(x, name), nil
		}
		if v, ok := o.Get(name); ok {
			return v, nil
		}
	case *namespace:
		if v, ok := o.d.Get(name); ok {
			return v, nil
		}
	case *loopObj:
		if name == "cycle" {
			return &builtin{name: "loop.cycle", fn: func(ev *evaluator, line int, args []any, _ []kwval) (any, error) {
				if len(args) == 0 {
					return nil, ev.errf(line, "no items for cycling given")
				}
				return args[o.i%len(args)], nil
			}}, nil
		}
		return o.attr(name), nil
	case string:
		if isStrMethod(name) {
			return boundMethod(x, name), nil
		}
	case []any, tuple:
		if name == "index" || name == "count" {
			return boundMethod(x, name), nil
		}
	}
	return undefined{name: name}, nil
}

func (ev *evaluator) undefinedErr(line int, u undefined) error {
	if u.name == "" {
		return ev.errf(line, "undefined value has no attributes")
	}
	return ev.errf(line, "'%s' is undefined", u.name)
}

// getItem is x[k]: the item first, then the attribute (jinja2's getitem).
func (ev *evaluator) getItem(line int, x, k any) (any, error) {
	switch o := x.(type) {
	case undefined:
		return nil, ev.undefinedErr(line, o)
	case *Dict:
		if ks, ok := k.(string); ok {
			if v, ok := o.Get(ks); ok {
				return v, nil
			}
			return ev.getAttr(line, x, ks)
		}
	case []any, tuple, string:
		if _, i, isInt, ok := number(k); ok && isInt {
			return indexSeq(x, i), nil
		}
		if ks, ok := k.(string); ok {
			return ev.getAttr(line, x, ks)
		}
	case *namespace, *loopObj:
		if ks, ok := k.(string); ok {
			return ev.getAttr(line, x, ks)
		}
	}
	return undefined{name: ev.str(k)}, nil
}

// indexSeq is seq[i] with Python's negative indexes; out of range is undefined.
func indexSeq(x any, i int64) any {
	if s, ok := x.(string); ok {
		rs := []rune(s)
		if i < 0 {
			i += int64(len(rs))
		}
		if i < 0 || i >= int64(len(rs)) {
			return undefined{}
		}
		return string(rs[i])
	}
	items, _ := asSeq(x)
	if i < 0 {
		i += int64(len(items))
	}
	if i < 0 || i >= int64(len(items)) {
		return undefined{}
	}
	return items[i]
}

func (ev *evaluator) evalSlice(e *sliceExpr, sc *scope) (any, error) {
	x, err := ev.eval(e.x, sc)
	if err != nil {
		return nil, err
	}
	var bounds [3]*int64
	for i, be := range []expr{e.start, e.stop, e.step} {
		if be == nil {
			continue
		}
		v, err := ev.eval(be, sc)
		if err != nil {
			return nil, err
		}
		if v == nil {
			continue
		}
		_, n, isInt, ok := number(v)
		if !ok || !isInt {
			return nil, ev.errf(e.line, "slice indices must be integers or None, got %s", typeName(v))
		}
		bounds[i] = &n
	}
	var items []any
	str, isStr := x.(string)
	switch {
	case isStr:
		rs := []rune(str)
		items = make([]any, len(rs))
		for i, r := range rs {
			items[i] = r
		}
	default:
		var ok bool
		if items, ok = asSeq(x); !ok {
			if u, isU := x.(undefined); isU {
				return nil, ev.undefinedErr(e.line, u)
			}
			return nil, ev.errf(e.line, "'%s' object is not subscriptable", typeName(x))
		}
	}
	idx, err := sliceIndexes(len(items), bounds)
	if err != nil {
		return nil, ev.errf(e.line, "%v", err)
	}
	if isStr {
		var b strings.Builder
		for _, i := range idx {
			b.WriteRune(items[i].(rune))
		}
		return b.String(), nil
	}
	out := make([]any, len(idx))
	for j, i := range idx {
		out[j] = items[i]
	}
	if _, ok := x.(tuple); ok {
		return tuple(out), nil
	}
	return out, nil
}

// sliceIndexes is Python's slice.indices expanded into the selected positions.
func sliceIndexes(n int, b [3]*int64) ([]int, error) {
	step := int64(1)
	if b[2] != nil {
		step = *b[2]
	}
	if step == 0 {
		return nil, errors.New("slice step cannot be zero")
	}
	clamp := func(p *int64, def, lo, hi int64) int64 {
		if p == nil {
			return def
		}
		v := *p
		if v < 0 {
			v += int64(n)
			if v < lo {
				v = lo
			}
		} else if v > hi {
			v = hi
		}
		return v
	}
	var start, stop int64
	if step > 0 {
		start = clamp(b[0], 0, 0, int64(n))
		stop = clamp(b[1], int64(n), 0, int64(n))
	} else {
		start = clamp(b[0], int64(n)-1, -1, int64(n)-1)
		stop = clamp(b[1], -1, -1, int64(n)-1)
	}
	var out []int
	for i := start; (step > 0 && i < stop) || (step < 0 && i > stop); i += step {
		out = append(out, int(i))
	}
	return out, nil
}

func (ev *evaluator) evalUnary(e *unaryExpr, sc *scope) (any, error) {
	x, err := ev.eval(e.x, sc)
	if err != nil {
		return nil, err
	}
	if e.op == "not" {
		return !truthy(x), nil
	}
	f, i, isInt, ok := number(x)
	if !ok {
		if u, isU := x.(undefined); isU {
			return nil, ev.undefinedErr(e.line, u)
		}
		return nil, ev.errf(e.line, "bad operand type for unary %s: '%s'", e.op, typeName(x))
	}
	if e.op == "+" {
		if isInt {
			return i, nil
		}
		return f, nil
	}
	if isInt {
		if i == math.MinInt64 {
			return nil, ev.errf(e.line, "integer overflow")
		}
		return -i, nil
	}
	return -f, nil
}

func (ev *evaluator) evalBinary(e *binExpr, sc *scope) (any, error) {
	if e.op == "+" {
		return ev.evalPlusChain(e, sc)
	}
	l, err := ev.eval(e.l, sc)
	if err != nil {
		return nil, err
	}
	switch e.op {
	case "and":
		if !truthy(l) {
			return l, nil
		}
		return ev.eval(e.r, sc)
	case "or":
		if truthy(l) {
			return l, nil
		}
		return ev.eval(e.r, sc)
	}
	r, err := ev.eval(e.r, sc)
	if err != nil {
		return nil, err
	}
	if e.op == "~" {
		s := ev.str(l) + ev.str(r)
		return s, ev.checkSize(e.line, len(s))
	}
	return ev.arith(e.line, e.op, l, r)
}

// evalPlusChain evaluates a + b + c + ... left to right as Python does, but joins a run
// of strings once instead of building every intermediate string (chat templates
// concatenate five or six pieces per message).
func (ev *evaluator) evalPlusChain(e *binExpr, sc *scope) (any, error) {
	var rights []*binExpr // the chain's "+" nodes, innermost first after reversing
	x := expr(e)
	for {
		b, ok := x.(*binExpr)
		if !ok || b.op != "+" {
			break
		}
		rights = append(rights, b)
		x = b.l
	}
	acc, err := ev.eval(x, sc)
	if err != nil {
		return nil, err
	}
	var buf [8]string
	parts := buf[:0] // strings waiting to be appended to acc (then a string)
	size := 0
	for i := len(rights) - 1; i >= 0; i-- {
		b := rights[i]
		r, err := ev.eval(b.r, sc)
		if err != nil {
			return nil, err
		}
		if as, ok := acc.(string); ok {
			if rs, ok := r.(string); ok {
				if len(parts) == 0 {
					size = len(as)
				}
				size += len(rs)
				if err := ev.checkSize(b.line, size); err != nil {
					return nil, err
				}
				parts = append(parts, rs)
				continue
			}
		}
		acc = joinParts(acc, parts)
		parts = parts[:0]
		if acc, err = ev.arith(b.line, "+", acc, r); err != nil {
			return nil, err
		}
	}
	return joinParts(acc, parts), nil
}

// joinParts appends the pending parts to acc, a string when there are any.
func joinParts(acc any, parts []string) any {
	if len(parts) == 0 {
		return acc
	}
	return acc.(string) + strings.Join(parts, "")
}

func (ev *evaluator) evalCompare(e *compareExpr, sc *scope) (any, error) {
	l, err := ev.eval(e.first, sc)
	if err != nil {
		return nil, err
	}
	for i, op := range e.ops {
		r, err := ev.eval(e.rest[i], sc)
		if err != nil {
			return nil, err
		}
		ok, err := ev.compareOp(e.line, op, l, r)
		if err != nil || !ok {
			return false, err
		}
		l = r
	}
	return true, nil
}

func (ev *evaluator) compareOp(line int, op string, l, r any) (bool, error) {
	switch op {
	case "==":
		return equal(l, r, &ev.work), nil
	case "!=":
		return !equal(l, r, &ev.work), nil
	case "in":
		return ev.contains(line, r, l)
	case "not in":
		ok, err := ev.contains(line, r, l)
		return !ok, err
	}
	c, ok := compare(l, r, &ev.work)
	if ev.work.exceeded() {
		return false, ev.step(line)
	}
	if !ok {
		for _, v := range []any{l, r} {
			if u, isU := v.(undefined); isU {
				return false, ev.undefinedErr(line, u)
			}
		}
		return false, ev.errf(line, "'%s' not supported between instances of '%s' and '%s'", op, typeName(l), typeName(r))
	}
	switch op {
	case "<":
		return c < 0, nil
	case ">":
		return c > 0, nil
	case "<=":
		return c <= 0, nil
	}
	return c >= 0, nil
}

// contains is Python's "needle in haystack".
func (ev *evaluator) contains(line int, haystack, needle any) (bool, error) {
	switch h := haystack.(type) {
	case string:
		n, ok := needle.(string)
		if !ok {
			return false, ev.errf(line, "'in <string>' requires string as left operand, not %s", typeName(needle))
		}
		return strings.Contains(h, n), nil
	case []any, tuple:
		items, _ := asSeq(h)
		for _, it := range items {
			if equal(it, needle, &ev.work) {
				return true, nil
			}
		}
		return false, nil
	case *Dict:
		k, ok := needle.(string)
		if !ok {
			return false, nil
		}
		_, found := h.Get(k)
		return found, nil
	case undefined:
		return false, nil
	}
	return false, ev.errf(line, "argument of type '%s' is not iterable", typeName(haystack))
}

// arith implements + - * / // % ** with Python's rules for ints, floats, strings and lists.
func (ev *evaluator) arith(line int, op string, l, r any) (any, error) {
	lf, li, lInt, lNum := number(l)
	rf, ri, rInt, rNum := number(r)
	if lNum && rNum {
		if lInt && rInt {
			return ev.intArith(line, op, li, ri)
		}
		return ev.floatArith(line, op, lf, rf)
	}
	switch op {
	case "+":
		if ls, ok := l.(string); ok {
			if rs, ok := r.(string); ok {
				return ls + rs, ev.checkSize(line, len(ls)+len(rs))
			}
		}
		if lseq, ok := asSeq(l); ok {
			if rseq, ok := asSeq(r); ok && sameSeqType(l, r) {
				if err := ev.checkSize(line, len(lseq)+len(rseq)); err != nil {
					return nil, err
				}
				out := append(append(make([]any, 0, len(lseq)+len(rseq)), lseq...), rseq...)
				if _, isT := l.(tuple); isT {
					return tuple(out), nil
				}
				return out, nil
			}
		}
	case "*":
		if lNum && lInt {
			l, r, li = r, l, ri
		}
		if _, n, isInt, ok := number(r); ok && isInt {
			return ev.repeat(line, l, n)
		}
		_ = li
	}
	for _, v := range []any{l, r} {
		if u, isU := v.(undefined); isU {
			return nil, ev.undefinedErr(line, u)
		}
	}
	return nil, ev.errf(line, "unsupported operand type(s) for %s: '%s' and '%s'", op, typeName(l), typeName(r))
}

func sameSeqType(a, b any) bool {
	_, at := a.(tuple)
	_, bt := b.(tuple)
	return at == bt
}

// repeat is str * n and list * n, bounded by the output size.
func (ev *evaluator) repeat(line int, x any, n int64) (any, error) {
	if n < 0 {
		n = 0
	}
	switch v := x.(type) {
	case string:
		if len(v) > 0 && n > int64(ev.maxOutput/len(v)) {
			return nil, ev.checkSize(line, ev.maxOutput+1)
		}
		return strings.Repeat(v, int(n)), nil
	case []any, tuple:
		items, _ := asSeq(v)
		if len(items) == 0 {
			n = 0
		} else if n > int64(ev.maxOutput/len(items)) {
			return nil, ev.checkSize(line, ev.maxOutput+1)
		}
		out := make([]any, 0, len(items)*int(n))
		for range n {
			out = append(out, items...)
		}
		if _, isT := v.(tuple); isT {
			return tuple(out), nil
		}
		return out, nil
	}
	return nil, ev.errf(line, "can't multiply sequence of type '%s'", typeName(x))
}

func (ev *evaluator) intArith(line int, op string, a, b int64) (any, error) {
	overflow := func() (any, error) { return nil, ev.errf(line, "integer overflow in %d %s %d", a, op, b) }
	switch op {
	case "+":
		s := a + b
		if (s > a) != (b > 0) {
			return overflow()
		}
		return s, nil
	case "-":
		s := a - b
		if (s < a) != (b > 0) {
			return overflow()
		}
		return s, nil
	case "*":
		if a != 0 && b != 0 {
			p := a * b
			if p/b != a || (a == -1 && b == math.MinInt64) || (b == -1 && a == math.MinInt64) {
				return overflow()
			}
			return p, nil
		}
		return int64(0), nil
	case "/":
		if b == 0 {
			return nil, ev.errf(line, "division by zero")
		}
		return float64(a) / float64(b), nil
	case "//", "%":
		if b == 0 {
			return nil, ev.errf(line, "integer division or modulo by zero")
		}
		q, m := a/b, a%b
		if m != 0 && (m < 0) != (b < 0) { // Python floors toward negative infinity
			q--
			m += b
		}
		if op == "//" {
			return q, nil
		}
		return m, nil
	case "**":
		if b < 0 {
			return math.Pow(float64(a), float64(b)), nil
		}
		return intPow(a, b, overflow)
	}
	return nil, ev.errf(line, "unknown operator %s", op)
}

// intPow is a**b for b >= 0 by squaring, failing on overflow.
func intPow(a, b int64, overflow func() (any, error)) (any, error) {
	mul := func(x, y int64) (int64, bool) {
		if x == 0 || y == 0 {
			return 0, true
		}
		p := x * y
		return p, p/y == x && !(x == -1 && y == math.MinInt64) && !(y == -1 && x == math.MinInt64)
	}
	r := int64(1)
	for ok := true; b > 0; b >>= 1 {
		if b&1 == 1 {
			if r, ok = mul(r, a); !ok {
				return overflow()
			}
		}
		if b > 1 {
			if a, ok = mul(a, a); !ok {
				return overflow()
			}
		}
	}
	return r, nil
}

func (ev *evaluator) floatArith(line int, op string, a, b float64) (any, error) {
	switch op {
	case "+":
		return a + b, nil
	case "-":
		return a - b, nil
	case "*":
		return a * b, nil
	case "/":
		if b == 0 {
			return nil, ev.errf(line, "float division by zero")
		}
		return a / b, nil
	case "//", "%":
		if b == 0 {
			return nil, ev.errf(line, "float modulo")
		}
		m := math.Mod(a, b)
		if m != 0 && (m < 0) != (b < 0) {
			m += b
		}
		if op == "%" {
			return m, nil
		}
		return math.Floor((a - m) / b), nil
	case "**":
		return math.Pow(a, b), nil
	}
	return nil, ev.errf(line, "unknown operator %s", op)
}

func (ev *evaluator) evalArgs(args []expr, kwargs []kwarg, sc *scope) ([]any, []kwval, error) {
	var av []any
	if len(args) > 0 {
		av = make([]any, len(args))
		for i, a := range args {
			v, err := ev.eval(a, sc)
			if err != nil {
				return nil, nil, err
			}
			av[i] = v
		}
	}
	var kv []kwval
	for _, k := range kwargs {
		v, err := ev.eval(k.x, sc)
		if err != nil {
			return nil, nil, err
		}
		kv = append(kv, kwval{name: k.name, v: v})
	}
	return av, kv, nil
}

func (ev *evaluator) evalCall(e *callExpr, sc *scope) (any, error) {
	if err := ev.step(e.line); err != nil {
		return nil, err
	}
	// recv.method(...) on a string or dict runs the method without binding it first.
	if a, ok := e.fn.(*attrExpr); ok {
		recv, err := ev.eval(a.x, sc)
		if err != nil {
			return nil, err
		}
		if s, isStr := recv.(string); isStr && isStrMethod(a.name) || isDictRecvMethod(recv, a.name) {
			args, kw, err := ev.evalArgs(e.args, e.kwargs, sc)
			if err != nil {
				return nil, err
			}
			if isStr {
				return ev.strMethod(e.line, s, a.name, args, kw)
			}
			return ev.dictMethod(e.line, recv.(*Dict), a.name, args)
		}
		fn, err := ev.getAttr(a.line, recv, a.name)
		if err != nil {
			return nil, err
		}
		return ev.callValue(e, fn, sc)
	}
	fn, err := ev.eval(e.fn, sc)
	if err != nil {
		return nil, err
	}
	return ev.callValue(e, fn, sc)
}

func isDictRecvMethod(recv any, name string) bool {
	_, ok := recv.(*Dict)
	return ok && isDictMethod(name)
}

// callValue calls fn, the value of e.fn, with e's arguments.
func (ev *evaluator) callValue(e *callExpr, fn any, sc *scope) (any, error) {
	args, kw, err := ev.evalArgs(e.args, e.kwargs, sc)
	if err != nil {
		return nil, err
	}
	switch f := fn.(type) {
	case *macro:
		return ev.callMacro(e.line, f, args, kw, nil)
	case *builtin:
		return f.fn(ev, e.line, args, kw)
	case *method:
		return ev.callMethod(e.line, f, args, kw)
	case undefined:
		return nil, ev.undefinedErr(e.line, f)
	}
	return nil, ev.errf(e.line, "'%s' object is not callable", typeName(fn))
}
