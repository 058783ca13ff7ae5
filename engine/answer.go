package engine

import (
	"encoding/binary"
	"slices"

	"github.com/kvindex/kvindex/engine/internal/worker"
)

// Answer assembly: the scored candidates become matches in answer order (collect,
// sortMatches).

// collect appends the scored candidates to dst as matches, in answer order. A worker
// removed while the query ran may have had its id taken by a new worker, whose
// memberships the shards then answered under the old worker's name: a candidate whose
// id no longer names the worker it named when the query found it is left out (the
// answer is then the one of a moment after the removal).
//
// The candidates are put in answer order as keys (matchKey, the workers' name keys
// cached per id in q.names) and appended in that order, so that no 64-byte match moves:
// on the 16-worker trace log, whose answers have fifteen matches, sorting the matches
// after appending them took 16-21% of a locked query's CPU at rest (-cpuprofile of
// BenchmarkTraceQueriesAtRest/locked=true//set=all with KVINDEX_OPS naming that log). Candidates that are tiers of
// one worker (tiers.go) become one match, merged into the sorted answer.
func (e *Engine) collect(q *query, content []uint64, dst []Match) []Match {
	now := e.workers()
	start := len(dst)
	tiered := false
	keys := q.skeys[:0]
	for i := range q.cands {
		c := &q.cands[i]
		if int(c.wid) >= len(now) || now[c.wid].Load() != c.w {
			continue
		}
		if c.w.HasTiers() {
			tiered = true
			continue
		}
		keys = append(keys, q.nameKey(c.wid, c.w, c.score, i))
	}
	sortKeys(keys, func(i int) string { return q.cands[i].w.Name() })
	// The matches are written in place, field by field: appending each as a composite
	// value built it on the stack and copied its 64 bytes, a tenth of a locked query's
	// time at rest on the conversation trace.
	at := len(dst)
	dst = slices.Grow(dst, len(keys))[:at+len(keys)]
	for j, k := range keys {
		c := &q.cands[k.i]
		s := c.score
		m := &dst[at+j]
		m.Worker, m.Score, m.Size, m.Predicted = c.w.Name(), s, int(c.w.Size()), 0
		m.Tiers[0], m.Tiers[1], m.Tiers[2] = s, s, s
	}
	q.skeys = keys
	if tiered {
		dst = e.collectTiers(q, content, dst)
		q.sortMatches(dst[start:])
	}
	return dst
}

// nameKey returns candidate i's key (its worker w, whose id is wid, with score s),
// taking the name's part from q.names while it holds w's, and caching it there
// otherwise: a name does not change, and the same few workers answer query after query.
// (A cached entry keeps its worker reachable until another worker takes its id, or the
// pool drops the workspace.)
func (q *query) nameKey(wid uint32, w *worker.Worker, s, i int) matchKey {
	if int(wid) >= len(q.names) {
		q.names = append(q.names, make([]nameKey, int(wid)+1-len(q.names)+len(q.names)/4)...)
	}
	n := &q.names[wid]
	if n.w != w {
		k := keyOf(w.Name(), 0, 0)
		*n = nameKey{w: w, a: k.a, b: k.b}
	}
	return matchKey{score: s, a: n.a, b: n.b, i: i}
}

// nameKey is a cached worker's name key (matchKey's a and b).
type nameKey struct {
	w    *worker.Worker
	a, b uint64
}

// sortMatches orders by score descending, then worker name. An answer has one match per
// candidate, usually a handful, and often arrives sorted or nearly so: an insertion sort
// with the comparison inlined costs a fraction of slices.SortFunc's calls through a
// function value (eight matches with one out of place, as the trace-driven log's
// queries answer: 41-42 against 105-112 ns, the copy of the input included; go test
// -run '^$' -bench SortMatches/.*/n=8 ./engine/). A longer answer is
// sorted by keys (sortByKeys): comparing names and moving 64-byte matches is what cost
// the time there.
func (q *query) sortMatches(m []Match) {
	if len(m) > 12 {
		q.sortByKeys(m)
		return
	}
	for i := 1; i < len(m); i++ {
		if !matchBefore(&m[i], &m[i-1]) {
			continue
		}
		x := m[i]
		j := i
		for ; j > 0 && matchBefore(&x, &m[j-1]); j-- {
			m[j] = m[j-1]
		}
		m[j] = x
	}
}

// matchKey is a match's place in answer order as integers: the score, and the first 16
// bytes of the worker's name, big-endian and zero-padded, whose order is the names'
// order wherever two keys differ (a shorter name that is a prefix of a longer one pads
// with zeros, which sort first, as the shorter name does). Equal keys fall back to the
// names.
type matchKey struct {
	score int
	a, b  uint64
	i     int // index in the unsorted answer
}

func keyOf(name string, score, i int) matchKey {
	var buf [16]byte
	copy(buf[:], name)
	return matchKey{score: score, a: binary.BigEndian.Uint64(buf[:8]), b: binary.BigEndian.Uint64(buf[8:]), i: i}
}

// before reports whether k comes before l in answer order; name(i) is the worker name
// of the key whose index is i, read only when the keys are equal.
func (k *matchKey) before(l *matchKey, name func(int) string) bool {
	switch {
	case k.score != l.score:
		return k.score > l.score
	case k.a != l.a:
		return k.a < l.a
	case k.b != l.b:
		return k.b < l.b
	}
	return name(k.i) < name(l.i)
}

// sortByKeys sorts m through keys: one key per match, sorted (sortKeys), then at most
// one move of each match. On the 16-worker trace log at rest, slices.SortFunc over
// fifteen matches took about 1 us of a 2.5 us locked query; go test -run '^$' -bench
// SortMatches -count 3 ./engine/ (names like that log's): 15 matches 222-228 ns
// against 677-740, 64 matches 1.43 us against 3.7.
func (q *query) sortByKeys(m []Match) {
	keys := q.skeys[:0]
	for i := range m {
		keys = append(keys, keyOf(m[i].Worker, m[i].Score, i))
	}
	sortKeys(keys, func(i int) string { return m[i].Worker })
	// Place the matches by following the permutation's cycles: position j takes the
	// match at keys[j].i, a placed key is marked -1, and each cycle's first match waits
	// in x for the last position of its cycle.
	for i := range keys {
		if keys[i].i == i || keys[i].i < 0 {
			continue
		}
		x := m[i]
		for j := i; ; {
			src := keys[j].i
			keys[j].i = -1
			if src == i {
				m[j] = x
				break
			}
			m[j] = m[src]
			j = src
		}
	}
	q.skeys = keys
}

// sortKeys sorts keys into answer order: an insertion sort (answers are short, and often
// arrive sorted or nearly so) that finds a key's place by bisection and moves the keys
// after it in one copy (15 and 64 matches, BenchmarkSortMatches: 258-261 and
// 3,070-3,090 ns moving key by key, 222-228 and 1,425-1,433 ns so), slices.SortFunc past
// 64 keys. name(i) is the worker name
// of the key whose index is i (matchKey.before).
func sortKeys(keys []matchKey, name func(int) string) {
	if len(keys) > 64 {
		slices.SortFunc(keys, func(k, l matchKey) int {
			if k.before(&l, name) {
				return -1
			}
			if l.before(&k, name) {
				return 1
			}
			return 0
		})
		return
	}
	for i := 1; i < len(keys); i++ {
		x := keys[i]
		if !x.before(&keys[i-1], name) {
			continue // in order (an answer often is, or nearly)
		}
		// x goes before keys[i-1]: bisect keys[:i-1] for the first key x comes
		// before, and move the keys after it up in one copy.
		lo, hi := 0, i-1
		for lo < hi {
			if m := int(uint(lo+hi) >> 1); x.before(&keys[m], name) {
				hi = m
			} else {
				lo = m + 1
			}
		}
		copy(keys[lo+1:i+1], keys[lo:i])
		keys[lo] = x
	}
}

// matchBefore reports whether a comes before b in answer order.
func matchBefore(a, b *Match) bool {
	if a.Score != b.Score {
		return a.Score > b.Score
	}
	return a.Worker < b.Worker
}
