package engine

import (
	"encoding/binary"
	"slices"
)

// Answer assembly: the scored candidates become matches in answer order (collect,
// sortMatches).

// collect appends the scored candidates to dst as matches, in answer order. A worker
// removed while the query ran may have had its id taken by a new worker, whose
// memberships the shards then answered under the old worker's name: a candidate whose
// id no longer names the worker it named when the query found it is left out (the
// answer is then the one of a moment after the removal).
//
// Candidates that are tiers of one worker (tiers.go) become one match.
func (e *Engine) collect(q *query, content []uint64, dst []Match) []Match {
	now := e.workers()
	start := len(dst)
	tiered := false
	for i := range q.cands {
		c := &q.cands[i]
		if int(c.wid) >= len(now) || now[c.wid].Load() != c.w {
			continue
		}
		if c.w.HasTiers() {
			tiered = true
			continue
		}
		s := c.score
		dst = append(dst, Match{Worker: c.w.Name(), Score: s, Size: int(c.w.Size()), Tiers: [NumTiers]int{s, s, s}})
	}
	if tiered {
		dst = e.collectTiers(q, content, dst)
	}
	q.sortMatches(dst[start:])
	return dst
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

func keyOf(m *Match, i int) matchKey {
	var buf [16]byte
	copy(buf[:], m.Worker)
	return matchKey{score: m.Score, a: binary.BigEndian.Uint64(buf[:8]), b: binary.BigEndian.Uint64(buf[8:]), i: i}
}

// before reports whether k comes before l in answer order, m being the unsorted answer.
func (k *matchKey) before(l *matchKey, m []Match) bool {
	switch {
	case k.score != l.score:
		return k.score > l.score
	case k.a != l.a:
		return k.a < l.a
	case k.b != l.b:
		return k.b < l.b
	}
	return m[k.i].Worker < m[l.i].Worker
}

// sortByKeys sorts m through keys: one key per match, an insertion sort of the keys
// (slices.SortFunc past 64), then at most one move of each match. On the 16-worker
// trace log at rest, slices.SortFunc over fifteen matches took about 1 us of a 2.5 us
// locked query; go test -run '^$' -bench SortMatches ./engine/ (names like that log's,
// three runs): 15 matches 260-321 ns against 677-740, 64 matches 2.2-2.5 us against 3.7.
func (q *query) sortByKeys(m []Match) {
	keys := q.skeys[:0]
	for i := range m {
		keys = append(keys, keyOf(&m[i], i))
	}
	if len(keys) > 64 {
		slices.SortFunc(keys, func(k, l matchKey) int {
			if k.before(&l, m) {
				return -1
			}
			if l.before(&k, m) {
				return 1
			}
			return 0
		})
	} else {
		for i := 1; i < len(keys); i++ {
			x := keys[i]
			j := i
			for ; j > 0 && x.before(&keys[j-1], m); j-- {
				keys[j] = keys[j-1]
			}
			keys[j] = x
		}
	}
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

// matchBefore reports whether a comes before b in answer order.
func matchBefore(a, b *Match) bool {
	if a.Score != b.Score {
		return a.Score > b.Score
	}
	return a.Worker < b.Worker
}
