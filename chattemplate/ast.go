package chattemplate

// Statement nodes. A template body is a []node; the evaluator (eval.go) walks it.
type node interface{ stmtLine() int }

type (
	textNode struct {
		line int
		text string
	}
	outputNode struct {
		line int
		x    expr
	}
	ifNode struct {
		line   int
		conds  []expr
		bodies [][]node
		els    []node
	}
	forNode struct {
		line    int
		targets []string // one name, or several for tuple unpacking
		iter    expr
		filter  expr // "for x in xs if cond"; nil when absent
		body    []node
		els     []node
	}
	// setNode assigns x to a name, to ns.attr (attr != ""), or unpacks it into names.
	setNode struct {
		line    int
		targets []string
		attr    string
		x       expr
	}
	setBlockNode struct {
		line    int
		name    string
		filters []*filterExpr // applied to the captured body, innermost first
		body    []node
	}
	macroNode struct {
		line     int
		name     string
		params   []string
		defaults []expr // defaults[i] belongs to params[len(params)-len(defaults)+i]
		body     []node
	}
	callBlockNode struct {
		line int
		call *callExpr
		body []node // rendered by caller()
	}
	filterBlockNode struct {
		line    int
		filters []*filterExpr
		body    []node
	}
	breakNode    struct{ line int }
	continueNode struct{ line int }
)

func (n *textNode) stmtLine() int        { return n.line }
func (n *outputNode) stmtLine() int      { return n.line }
func (n *ifNode) stmtLine() int          { return n.line }
func (n *forNode) stmtLine() int         { return n.line }
func (n *setNode) stmtLine() int         { return n.line }
func (n *setBlockNode) stmtLine() int    { return n.line }
func (n *macroNode) stmtLine() int       { return n.line }
func (n *callBlockNode) stmtLine() int   { return n.line }
func (n *filterBlockNode) stmtLine() int { return n.line }
func (n *breakNode) stmtLine() int       { return n.line }
func (n *continueNode) stmtLine() int    { return n.line }

// Expression nodes; each knows its line so errors name it.
type expr interface{ exprLine() int }

type (
	constExpr struct {
		line int
		v    any
	}
	nameExpr struct {
		line int
		name string
	}
	attrExpr struct {
		line int
		x    expr
		name string
	}
	itemExpr struct {
		line int
		x    expr
		key  expr
	}
	sliceExpr struct {
		line              int
		x                 expr
		start, stop, step expr // nil when omitted
	}
	unaryExpr struct {
		line int
		op   string // "-", "+", "not"
		x    expr
	}
	binExpr struct {
		line int
		op   string // + - * / // % ** ~ and or in "not in"
		l, r expr
	}
	// compareExpr is a Python comparison chain: a < b <= c.
	compareExpr struct {
		line  int
		first expr
		ops   []string
		rest  []expr
	}
	condExpr struct {
		line          int
		cond, yes, no expr // no may be nil (undefined)
	}
	callExpr struct {
		line   int
		fn     expr
		args   []expr
		kwargs []kwarg
	}
	filterExpr struct {
		line   int
		x      expr // nil inside filter blocks and set blocks
		name   string
		args   []expr
		kwargs []kwarg
	}
	testExpr struct {
		line   int
		x      expr
		name   string
		args   []expr
		negate bool
	}
	listExpr struct {
		line  int
		items []expr
		tuple bool
	}
	dictExpr struct {
		line int
		keys []expr
		vals []expr
	}
)

type kwarg struct {
	name string
	x    expr
}

func (e *constExpr) exprLine() int   { return e.line }
func (e *nameExpr) exprLine() int    { return e.line }
func (e *attrExpr) exprLine() int    { return e.line }
func (e *itemExpr) exprLine() int    { return e.line }
func (e *sliceExpr) exprLine() int   { return e.line }
func (e *unaryExpr) exprLine() int   { return e.line }
func (e *binExpr) exprLine() int     { return e.line }
func (e *compareExpr) exprLine() int { return e.line }
func (e *condExpr) exprLine() int    { return e.line }
func (e *callExpr) exprLine() int    { return e.line }
func (e *filterExpr) exprLine() int  { return e.line }
func (e *testExpr) exprLine() int    { return e.line }
func (e *listExpr) exprLine() int    { return e.line }
func (e *dictExpr) exprLine() int    { return e.line }
