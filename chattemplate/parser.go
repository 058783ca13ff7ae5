package chattemplate

import (
	"fmt"
	"strconv"
)

// maxNesting bounds the parser's recursion (nested blocks plus nested expressions), so a
// hostile template cannot exhaust the goroutine stack.
const maxNesting = 200

type parser struct {
	toks  []token
	pos   int
	depth int
}

// parse turns tokens into a statement list.
func parse(toks []token) ([]node, error) {
	p := &parser{toks: toks}
	body, end, err := p.body()
	if err != nil {
		return nil, err
	}
	if end != "" {
		return nil, p.errf(p.peek().line, "unexpected '%s'", end)
	}
	return body, nil
}

func (p *parser) peek() token { return p.toks[p.pos] }

func (p *parser) next() token {
	t := p.toks[p.pos]
	if t.kind != tEOF {
		p.pos++
	}
	return t
}

func (p *parser) errf(line int, format string, args ...any) error {
	return &Error{Line: line, Msg: fmt.Sprintf(format, args...), Err: ErrSyntax}
}

func (p *parser) enter(line int) error {
	p.depth++
	if p.depth > maxNesting {
		return &Error{Line: line, Msg: fmt.Sprintf("template nests deeper than %d", maxNesting), Err: ErrLimit}
	}
	return nil
}

func (p *parser) leave() { p.depth-- }

func (p *parser) isOp(op string) bool {
	t := p.peek()
	return t.kind == tOp && t.val == op
}

func (p *parser) isName(name string) bool {
	t := p.peek()
	return t.kind == tName && t.val == name
}

func (p *parser) expectOp(op string) error {
	t := p.next()
	if t.kind != tOp || t.val != op {
		return p.errf(t.line, "expected '%s', got %s", op, describe(t))
	}
	return nil
}

func (p *parser) expectName() (token, error) {
	t := p.next()
	if t.kind != tName {
		return t, p.errf(t.line, "expected a name, got %s", describe(t))
	}
	return t, nil
}

func (p *parser) expectBlockEnd() error {
	t := p.next()
	if t.kind != tBlockEnd {
		return p.errf(t.line, "expected end of statement block, got %s", describe(t))
	}
	return nil
}

func describe(t token) string {
	switch t.kind {
	case tEOF:
		return "end of template"
	case tBlockEnd:
		return "'%}'"
	case tVarEnd:
		return "'}}'"
	case tString:
		return strconv.Quote(t.val)
	default:
		return "'" + t.val + "'"
	}
}

// body parses statements until EOF or a block tag whose keyword ends the enclosing block
// (endif, elif, else, endfor, ...). It returns that keyword with the parser positioned
// after it (inside the tag).
func (p *parser) body() ([]node, string, error) {
	var out []node
	for {
		t := p.next()
		switch t.kind {
		case tEOF:
			return out, "", nil
		case tText:
			out = append(out, &textNode{line: t.line, text: t.val})
		case tVarOpen:
			x, err := p.expr()
			if err != nil {
				return nil, "", err
			}
			if e := p.next(); e.kind != tVarEnd {
				return nil, "", p.errf(e.line, "expected '}}', got %s", describe(e))
			}
			out = append(out, &outputNode{line: t.line, x: x})
		case tBlockOpen:
			kw, err := p.expectName()
			if err != nil {
				return nil, "", err
			}
			if isEndKeyword(kw.val) {
				return out, kw.val, nil
			}
			n, err := p.statement(kw)
			if err != nil {
				return nil, "", err
			}
			if n != nil {
				out = append(out, n)
			}
		default:
			return nil, "", p.errf(t.line, "unexpected %s", describe(t))
		}
	}
}

func isEndKeyword(s string) bool {
	switch s {
	case "elif", "else", "endif", "endfor", "endset", "endmacro", "endcall", "endfilter", "endgeneration":
		return true
	}
	return false
}

// block parses a nested body that must end with one of the given keywords.
func (p *parser) block(line int, ends ...string) ([]node, string, error) {
	if err := p.enter(line); err != nil {
		return nil, "", err
	}
	defer p.leave()
	body, end, err := p.body()
	if err != nil {
		return nil, "", err
	}
	for _, e := range ends {
		if end == e {
			return body, end, nil
		}
	}
	if end == "" {
		return nil, "", p.errf(line, "block opened here is not closed (expected '%s')", ends[len(ends)-1])
	}
	return nil, "", p.errf(p.toks[p.pos-1].line, "unexpected '%s' (expected '%s')", end, ends[len(ends)-1])
}

func (p *parser) statement(kw token) (node, error) {
	switch kw.val {
	case "if":
		return p.ifStmt(kw.line)
	case "for":
		return p.forStmt(kw.line)
	case "set":
		return p.setStmt(kw.line)
	case "macro":
		return p.macroStmt(kw.line)
	case "call":
		return p.callStmt(kw.line)
	case "filter":
		return p.filterStmt(kw.line)
	case "break", "continue":
		if err := p.expectBlockEnd(); err != nil {
			return nil, err
		}
		if kw.val == "break" {
			return &breakNode{line: kw.line}, nil
		}
		return &continueNode{line: kw.line}, nil
	case "generation":
		// transformers' AssistantTracker extension: the body renders as is.
		if err := p.expectBlockEnd(); err != nil {
			return nil, err
		}
		body, _, err := p.block(kw.line, "endgeneration")
		if err != nil {
			return nil, err
		}
		if err := p.expectBlockEnd(); err != nil {
			return nil, err
		}
		return &filterBlockNode{line: kw.line, body: body}, nil
	}
	return nil, p.errf(kw.line, "unknown statement '%s'", kw.val)
}

func (p *parser) ifStmt(line int) (node, error) {
	n := &ifNode{line: line}
	for {
		cond, err := p.expr()
		if err != nil {
			return nil, err
		}
		if err := p.expectBlockEnd(); err != nil {
			return nil, err
		}
		body, end, err := p.block(line, "elif", "else", "endif")
		if err != nil {
			return nil, err
		}
		n.conds = append(n.conds, cond)
		n.bodies = append(n.bodies, body)
		switch end {
		case "elif":
			continue
		case "else":
			if err := p.expectBlockEnd(); err != nil {
				return nil, err
			}
			if n.els, _, err = p.block(line, "endif"); err != nil {
				return nil, err
			}
		}
		return n, p.expectBlockEnd()
	}
}

func (p *parser) forStmt(line int) (node, error) {
	n := &forNode{line: line}
	for {
		t, err := p.expectName()
		if err != nil {
			return nil, err
		}
		n.targets = append(n.targets, t.val)
		if !p.isOp(",") {
			break
		}
		p.next()
	}
	if t := p.next(); t.kind != tName || t.val != "in" {
		return nil, p.errf(t.line, "expected 'in' in for loop, got %s", describe(t))
	}
	var err error
	// The iterable is parsed without the conditional expression, so "if" starts a filter.
	if n.iter, err = p.orExpr(); err != nil {
		return nil, err
	}
	if p.isName("if") {
		p.next()
		if n.filter, err = p.expr(); err != nil {
			return nil, err
		}
	}
	if p.isName("recursive") {
		return nil, p.errf(line, "recursive for loops are not supported")
	}
	if err := p.expectBlockEnd(); err != nil {
		return nil, err
	}
	body, end, err := p.block(line, "else", "endfor")
	if err != nil {
		return nil, err
	}
	n.body = body
	if end == "else" {
		if err := p.expectBlockEnd(); err != nil {
			return nil, err
		}
		if n.els, _, err = p.block(line, "endfor"); err != nil {
			return nil, err
		}
	}
	return n, p.expectBlockEnd()
}

func (p *parser) setStmt(line int) (node, error) {
	t, err := p.expectName()
	if err != nil {
		return nil, err
	}
	n := &setNode{line: line, targets: []string{t.val}}
	switch {
	case p.isOp("."):
		p.next()
		a, err := p.expectName()
		if err != nil {
			return nil, err
		}
		n.attr = a.val
	case p.isOp(","):
		for p.isOp(",") {
			p.next()
			t, err := p.expectName()
			if err != nil {
				return nil, err
			}
			n.targets = append(n.targets, t.val)
		}
	case p.peek().kind == tBlockEnd || p.isOp("|"):
		return p.setBlock(line, t.val)
	}
	if err := p.expectOp("="); err != nil {
		return nil, err
	}
	if n.x, err = p.tupleOrExpr(); err != nil {
		return nil, err
	}
	return n, p.expectBlockEnd()
}

func (p *parser) setBlock(line int, name string) (node, error) {
	var filters []*filterExpr
	if p.isOp("|") {
		var err error
		if filters, err = p.filterChain(); err != nil {
			return nil, err
		}
	}
	if err := p.expectBlockEnd(); err != nil {
		return nil, err
	}
	body, _, err := p.block(line, "endset")
	if err != nil {
		return nil, err
	}
	return &setBlockNode{line: line, name: name, filters: filters, body: body}, p.expectBlockEnd()
}

// filterChain parses "| f(args) | g" (set blocks) or "f(args) | g" (filter blocks).
func (p *parser) filterChain() ([]*filterExpr, error) {
	var out []*filterExpr
	first := !p.isOp("|")
	for first || p.isOp("|") {
		if !first {
			p.next()
		}
		first = false
		f, err := p.filterCall(nil)
		if err != nil {
			return nil, err
		}
		out = append(out, f)
	}
	return out, nil
}

func (p *parser) filterStmt(line int) (node, error) {
	filters, err := p.filterChain()
	if err != nil {
		return nil, err
	}
	if err := p.expectBlockEnd(); err != nil {
		return nil, err
	}
	body, _, err := p.block(line, "endfilter")
	if err != nil {
		return nil, err
	}
	return &filterBlockNode{line: line, filters: filters, body: body}, p.expectBlockEnd()
}

func (p *parser) macroStmt(line int) (node, error) {
	name, err := p.expectName()
	if err != nil {
		return nil, err
	}
	n := &macroNode{line: line, name: name.val}
	if err := p.expectOp("("); err != nil {
		return nil, err
	}
	for !p.isOp(")") {
		a, err := p.expectName()
		if err != nil {
			return nil, err
		}
		n.params = append(n.params, a.val)
		if p.isOp("=") {
			p.next()
			d, err := p.expr()
			if err != nil {
				return nil, err
			}
			n.defaults = append(n.defaults, d)
		} else if len(n.defaults) > 0 {
			return nil, p.errf(a.line, "non-default argument '%s' follows default argument", a.val)
		}
		if !p.isOp(",") {
			break
		}
		p.next()
	}
	if err := p.expectOp(")"); err != nil {
		return nil, err
	}
	if err := p.expectBlockEnd(); err != nil {
		return nil, err
	}
	if n.body, _, err = p.block(line, "endmacro"); err != nil {
		return nil, err
	}
	return n, p.expectBlockEnd()
}

func (p *parser) callStmt(line int) (node, error) {
	x, err := p.expr()
	if err != nil {
		return nil, err
	}
	call, ok := x.(*callExpr)
	if !ok {
		return nil, p.errf(line, "expected a macro call in call block")
	}
	if err := p.expectBlockEnd(); err != nil {
		return nil, err
	}
	body, _, err := p.block(line, "endcall")
	if err != nil {
		return nil, err
	}
	return &callBlockNode{line: line, call: call, body: body}, p.expectBlockEnd()
}

// ---- expressions, lowest precedence first (jinja2/parser.py) ----

// tupleOrExpr parses "a, b" as a tuple (set statements allow it without parentheses).
func (p *parser) tupleOrExpr() (expr, error) {
	x, err := p.expr()
	if err != nil || !p.isOp(",") {
		return x, err
	}
	t := &listExpr{line: x.exprLine(), items: []expr{x}, tuple: true}
	for p.isOp(",") {
		p.next()
		if p.peek().kind == tBlockEnd {
			break
		}
		y, err := p.expr()
		if err != nil {
			return nil, err
		}
		t.items = append(t.items, y)
	}
	return t, nil
}

func (p *parser) expr() (expr, error) {
	line := p.peek().line
	if err := p.enter(line); err != nil {
		return nil, err
	}
	defer p.leave()
	x, err := p.orExpr()
	if err != nil {
		return nil, err
	}
	for p.isName("if") {
		p.next()
		cond, err := p.orExpr()
		if err != nil {
			return nil, err
		}
		c := &condExpr{line: line, cond: cond, yes: x}
		if p.isName("else") {
			p.next()
			if c.no, err = p.expr(); err != nil {
				return nil, err
			}
		}
		x = c
	}
	return x, nil
}

func (p *parser) orExpr() (expr, error) {
	return p.binaryLevel(p.andExpr, "or")
}

func (p *parser) andExpr() (expr, error) {
	return p.binaryLevel(p.notExpr, "and")
}

// binaryLevel parses a left-associative chain of keyword operators.
func (p *parser) binaryLevel(sub func() (expr, error), kw string) (expr, error) {
	x, err := sub()
	if err != nil {
		return nil, err
	}
	for p.isName(kw) {
		line := p.next().line
		y, err := sub()
		if err != nil {
			return nil, err
		}
		x = &binExpr{line: line, op: kw, l: x, r: y}
	}
	return x, nil
}

func (p *parser) notExpr() (expr, error) {
	if p.isName("not") {
		line := p.next().line
		if err := p.enter(line); err != nil {
			return nil, err
		}
		defer p.leave()
		x, err := p.notExpr()
		if err != nil {
			return nil, err
		}
		return &unaryExpr{line: line, op: "not", x: x}, nil
	}
	return p.compare()
}

func (p *parser) compare() (expr, error) {
	x, err := p.math1()
	if err != nil {
		return nil, err
	}
	var c *compareExpr
	for {
		t := p.peek()
		op := ""
		switch {
		case t.kind == tOp && (t.val == "==" || t.val == "!=" || t.val == "<" || t.val == ">" || t.val == "<=" || t.val == ">="):
			op = t.val
			p.next()
		case t.kind == tName && t.val == "in":
			op = "in"
			p.next()
		case t.kind == tName && t.val == "not" && p.toks[p.pos+1].kind == tName && p.toks[p.pos+1].val == "in":
			op = "not in"
			p.pos += 2
		default:
			if c != nil {
				return c, nil
			}
			return x, nil
		}
		y, err := p.math1()
		if err != nil {
			return nil, err
		}
		if c == nil {
			c = &compareExpr{line: t.line, first: x}
		}
		c.ops = append(c.ops, op)
		c.rest = append(c.rest, y)
	}
}

func (p *parser) math1() (expr, error) {
	return p.opLevel(p.concat, "+", "-")
}

func (p *parser) concat() (expr, error) {
	return p.opLevel(p.math2, "~")
}

func (p *parser) math2() (expr, error) {
	return p.opLevel(p.pow, "*", "/", "//", "%")
}

func (p *parser) pow() (expr, error) {
	return p.opLevel(p.unary, "**")
}

// opLevel parses a left-associative chain of symbolic operators.
func (p *parser) opLevel(sub func() (expr, error), ops ...string) (expr, error) {
	x, err := sub()
	if err != nil {
		return nil, err
	}
	for {
		t := p.peek()
		if t.kind != tOp || !contains(ops, t.val) {
			return x, nil
		}
		p.next()
		y, err := sub()
		if err != nil {
			return nil, err
		}
		x = &binExpr{line: t.line, op: t.val, l: x, r: y}
	}
}

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}

// unary follows jinja2's parse_unary: "-x|f" is f(-x); filters and tests bind after the
// unary operator and the postfix operators.
func (p *parser) unary() (expr, error) {
	return p.unaryWith(true)
}

func (p *parser) unaryWith(withFilter bool) (expr, error) {
	t := p.peek()
	var x expr
	var err error
	if t.kind == tOp && (t.val == "-" || t.val == "+") {
		p.next()
		if err := p.enter(t.line); err != nil {
			return nil, err
		}
		inner, err := p.unaryWith(false)
		p.leave()
		if err != nil {
			return nil, err
		}
		x = &unaryExpr{line: t.line, op: t.val, x: inner}
	} else if x, err = p.primary(); err != nil {
		return nil, err
	}
	if x, err = p.postfix(x); err != nil {
		return nil, err
	}
	if withFilter {
		return p.filtersAndTests(x)
	}
	return x, nil
}

func (p *parser) primary() (expr, error) {
	t := p.next()
	switch t.kind {
	case tName:
		switch t.val {
		case "true", "True":
			return &constExpr{line: t.line, v: true}, nil
		case "false", "False":
			return &constExpr{line: t.line, v: false}, nil
		case "none", "None":
			return &constExpr{line: t.line, v: nil}, nil
		}
		return &nameExpr{line: t.line, name: t.val}, nil
	case tString:
		s := t.val
		for p.peek().kind == tString { // adjacent literals concatenate
			s += p.next().val
		}
		return &constExpr{line: t.line, v: s}, nil
	case tInt:
		v, err := strconv.ParseInt(t.val, 10, 64)
		if err != nil {
			return nil, p.errf(t.line, "integer literal %s out of range", t.val)
		}
		return &constExpr{line: t.line, v: v}, nil
	case tFloat:
		v, err := strconv.ParseFloat(t.val, 64)
		if err != nil {
			return nil, p.errf(t.line, "bad float literal %s", t.val)
		}
		return &constExpr{line: t.line, v: v}, nil
	case tOp:
		switch t.val {
		case "(":
			return p.parenthesized(t.line)
		case "[":
			items, err := p.exprList("]")
			return &listExpr{line: t.line, items: items}, err
		case "{":
			return p.dictLiteral(t.line)
		}
	}
	return nil, p.errf(t.line, "unexpected %s", describe(t))
}

func (p *parser) parenthesized(line int) (expr, error) {
	if p.isOp(")") {
		p.next()
		return &listExpr{line: line, tuple: true}, nil
	}
	x, err := p.expr()
	if err != nil {
		return nil, err
	}
	if p.isOp(")") {
		p.next()
		return x, nil
	}
	if !p.isOp(",") {
		return nil, p.errf(p.peek().line, "expected ')' or ',', got %s", describe(p.peek()))
	}
	p.next()
	rest, err := p.exprList(")")
	if err != nil {
		return nil, err
	}
	return &listExpr{line: line, items: append([]expr{x}, rest...), tuple: true}, nil
}

// exprList parses "a, b, c" up to the closing operator (a trailing comma is allowed).
func (p *parser) exprList(close string) ([]expr, error) {
	var items []expr
	for !p.isOp(close) {
		x, err := p.expr()
		if err != nil {
			return nil, err
		}
		items = append(items, x)
		if !p.isOp(",") {
			break
		}
		p.next()
	}
	return items, p.expectOp(close)
}

func (p *parser) dictLiteral(line int) (expr, error) {
	d := &dictExpr{line: line}
	for !p.isOp("}") {
		k, err := p.expr()
		if err != nil {
			return nil, err
		}
		if err := p.expectOp(":"); err != nil {
			return nil, err
		}
		v, err := p.expr()
		if err != nil {
			return nil, err
		}
		d.keys = append(d.keys, k)
		d.vals = append(d.vals, v)
		if !p.isOp(",") {
			break
		}
		p.next()
	}
	return d, p.expectOp("}")
}

// postfix parses attribute access, subscripts, slices and calls.
func (p *parser) postfix(x expr) (expr, error) {
	for {
		t := p.peek()
		if t.kind != tOp {
			return x, nil
		}
		var err error
		switch t.val {
		case ".":
			p.next()
			a := p.next()
			switch a.kind {
			case tName:
				x = &attrExpr{line: a.line, x: x, name: a.val}
			case tInt: // foo.0 is foo[0]
				n, _ := strconv.ParseInt(a.val, 10, 64)
				x = &itemExpr{line: a.line, x: x, key: &constExpr{line: a.line, v: n}}
			default:
				return nil, p.errf(a.line, "expected an attribute name after '.', got %s", describe(a))
			}
		case "[":
			p.next()
			x, err = p.subscript(x, t.line)
		case "(":
			p.next()
			x, err = p.call(x, t.line)
		default:
			return x, nil
		}
		if err != nil {
			return nil, err
		}
	}
}

func (p *parser) subscript(x expr, line int) (expr, error) {
	var parts [3]expr
	n := 0
	for {
		if !p.isOp(":") && !p.isOp("]") {
			e, err := p.expr()
			if err != nil {
				return nil, err
			}
			parts[n] = e
		}
		if p.isOp(":") && n < 2 {
			p.next()
			n++
			continue
		}
		break
	}
	if err := p.expectOp("]"); err != nil {
		return nil, err
	}
	if n == 0 {
		if parts[0] == nil {
			return nil, p.errf(line, "empty subscript")
		}
		return &itemExpr{line: line, x: x, key: parts[0]}, nil
	}
	return &sliceExpr{line: line, x: x, start: parts[0], stop: parts[1], step: parts[2]}, nil
}

// args parses call arguments after "(" up to and including ")".
func (p *parser) args() ([]expr, []kwarg, error) {
	var args []expr
	var kwargs []kwarg
	for !p.isOp(")") {
		if p.peek().kind == tName && p.toks[p.pos+1].kind == tOp && p.toks[p.pos+1].val == "=" {
			name := p.next().val
			p.next()
			x, err := p.expr()
			if err != nil {
				return nil, nil, err
			}
			kwargs = append(kwargs, kwarg{name: name, x: x})
		} else {
			if len(kwargs) > 0 {
				return nil, nil, p.errf(p.peek().line, "positional argument follows keyword argument")
			}
			x, err := p.expr()
			if err != nil {
				return nil, nil, err
			}
			args = append(args, x)
		}
		if !p.isOp(",") {
			break
		}
		p.next()
	}
	return args, kwargs, p.expectOp(")")
}

func (p *parser) call(fn expr, line int) (expr, error) {
	args, kwargs, err := p.args()
	if err != nil {
		return nil, err
	}
	return &callExpr{line: line, fn: fn, args: args, kwargs: kwargs}, nil
}

// filterCall parses "name(args)" or "name.dotted" after a "|".
func (p *parser) filterCall(x expr) (*filterExpr, error) {
	t, err := p.expectName()
	if err != nil {
		return nil, err
	}
	f := &filterExpr{line: t.line, x: x, name: t.val}
	if p.isOp("(") {
		p.next()
		if f.args, f.kwargs, err = p.args(); err != nil {
			return nil, err
		}
	}
	return f, nil
}

func (p *parser) filtersAndTests(x expr) (expr, error) {
	for {
		switch {
		case p.isOp("|"):
			p.next()
			f, err := p.filterCall(x)
			if err != nil {
				return nil, err
			}
			x = f
		case p.isName("is"):
			line := p.next().line
			t := &testExpr{line: line, x: x}
			if p.isName("not") {
				p.next()
				t.negate = true
			}
			name := p.next()
			switch {
			case name.kind == tName:
				t.name = name.val
			case name.kind == tOp && (name.val == "==" || name.val == "!=" || name.val == "<" || name.val == ">" || name.val == "<=" || name.val == ">="):
				t.name = name.val
			default:
				return nil, p.errf(name.line, "expected a test name after 'is', got %s", describe(name))
			}
			var err error
			if p.isOp("(") {
				p.next()
				if t.args, _, err = p.args(); err != nil {
					return nil, err
				}
			} else if p.testArgFollows() {
				// "x is divisibleby 3", "x is sameas none": one argument without parentheses.
				arg, err := p.primary()
				if err == nil {
					arg, err = p.postfix(arg)
				}
				if err != nil {
					return nil, err
				}
				t.args = []expr{arg}
			}
			x = t
		default:
			return x, nil
		}
	}
}

// testArgFollows reports whether the token after a test name starts its single
// unparenthesized argument (jinja2's parse_test rule).
func (p *parser) testArgFollows() bool {
	t := p.peek()
	switch t.kind {
	case tString, tInt, tFloat:
		return true
	case tName:
		switch t.val {
		case "else", "or", "and", "is", "in", "if", "not":
			return false
		}
		return true
	case tOp:
		return t.val == "[" || t.val == "{"
	}
	return false
}
