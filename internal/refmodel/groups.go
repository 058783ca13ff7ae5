package refmodel

import "github.com/kvindex/kvindex/internal/oplog"

// Hybrid models (SPEC, "Hybrid models: KV-cache groups"), the obvious way: each group
// keeps its own blocks, and a query tries every cut from the longest down and keeps the
// first that every group accepts.

// groupRule is one declared group: its kind, its span (block size in units) and, for a
// sliding window, its lookback in its own blocks.
type groupRule struct {
	kind     string
	span     int
	lookback int
}

// Groups applies a groups declaration: the worker is known, all its blocks are dropped
// and its groups are the list's. A malformed list (empty, an unknown kind, a block
// size that is not a positive multiple of unit, a window missing on sliding_window or
// present on another kind, a window below 1, a unit below 1) is ErrInvalidEvent and
// changes nothing.
func (m *Model) Groups(name string, unit int, specs []oplog.GroupSpec) error {
	rules, err := groupRules(unit, specs)
	if err != nil {
		return err
	}
	m.endPredictions(name, func(prediction) bool { return true })
	m.workers[name] = newWorker(rules)
	return nil
}

// groupRules validates a declaration and returns its rules.
func groupRules(unit int, specs []oplog.GroupSpec) ([]groupRule, error) {
	if unit < 1 || len(specs) == 0 {
		return nil, ErrInvalidEvent
	}
	rules := make([]groupRule, len(specs))
	for i, g := range specs {
		if g.BlockSize < 1 || g.BlockSize%unit != 0 {
			return nil, ErrInvalidEvent
		}
		r := groupRule{kind: g.Kind, span: g.BlockSize / unit}
		switch g.Kind {
		case oplog.KindFull, oplog.KindMamba:
			if g.HasWindow {
				return nil, ErrInvalidEvent
			}
		case oplog.KindSlidingWindow:
			if !g.HasWindow || g.Window < 1 {
				return nil, ErrInvalidEvent
			}
			// n_g = max(1, ceil((W-1) / b_g)) of the group's own blocks.
			r.lookback = max(1, (g.Window-1+g.BlockSize-1)/g.BlockSize)
		default:
			return nil, ErrInvalidEvent
		}
		rules[i] = r
	}
	return rules, nil
}

// score is the worker's score for a query whose trie path is path (path[e-1] is the
// node of the query's first e units, as far as the trie has them), counting the blocks
// held on tier t or a faster one: the largest cut every group accepts.
func (w *worker) score(path []uint32, t int) int {
	held := make([]map[uint32]bool, len(w.groups))
	for g := range w.groups {
		held[g] = map[uint32]bool{}
		for tt := 0; tt <= t; tt++ {
			for _, n := range w.groups[g][tt] {
				held[g][n] = true
			}
		}
	}
	if w.rules == nil { // one full group of span 1: the leading run
		score := 0
		for score < len(path) && held[0][path[score]] {
			score++
		}
		return score
	}
	a := 1
	for _, r := range w.rules {
		a = lcm(a, r.span)
	}
	// holds reports whether group g holds end e (a block whose prefix is q[0..e)).
	holds := func(g, e int) bool { return e >= 1 && e <= len(path) && held[g][path[e-1]] }
	for k := len(path) / a * a; k >= a; k -= a {
		if w.accepts(k, holds) {
			return k
		}
	}
	return 0
}

// accepts reports whether every group accepts cut k.
func (w *worker) accepts(k int, holds func(g, e int) bool) bool {
	for g, r := range w.rules {
		n := k / r.span // the group's blocks before the cut
		switch r.kind {
		case oplog.KindFull:
			for j := 1; j <= n; j++ {
				if !holds(g, j*r.span) {
					return false
				}
			}
		case oplog.KindSlidingWindow:
			for j := max(1, n-r.lookback+1); j <= n; j++ {
				if !holds(g, j*r.span) {
					return false
				}
			}
		case oplog.KindMamba:
			if !holds(g, k) {
				return false
			}
		}
	}
	return true
}

func gcd(a, b int) int {
	for b != 0 {
		a, b = b, a%b
	}
	return a
}

func lcm(a, b int) int { return a / gcd(a, b) * b }
