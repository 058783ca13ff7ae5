package engine

import (
	"slices"

	"github.com/kvindex/kvindex/engine/internal/worker"
	"github.com/kvindex/kvindex/shard"
)

// The direct walk: the locked index and a one-shard engine read the whole index under
// one hold (walk). A one-shard engine's index keeps every position: it scores gap-free
// candidates by galloping landings and bisection (gallop, bisect), and a query still
// undecided past walkLimit goes to jump search. The locked index keeps the head and the
// anchors only, and reads the rest from the candidates' tables (walkSparse): its
// queries always end here.

// walkLimit is how deep a one-shard engine's direct walk goes with a gappy candidate
// before it leaves the query to jump search.
const walkLimit = denseLandings

// walk answers a query by reading the index directly, under one hold (the locked
// index's read lock, or a one-shard engine's table token), so that every probe sees the
// same state. On the locked index walkSparse scores the candidates. On a one-shard
// engine, when every candidate is gap-free (the common case), gallop answers it;
// otherwise walk reads position by position while some candidate has held every
// position so far: the score's definition, with no probe batches, no landings and no
// second round. Most queries are decided within walkLimit positions (the median best
// score on the trace-driven log is 8); when a candidate is still alive there, walk
// gives up (done false, dst untouched) and jump search, which is cheaper on long
// matches, answers the query instead.
//
// A one-shard engine holds its shard's table token (shard.Loop.Hold) where the locked
// index holds its read lock: the table is the whole index there, where jump search
// would batch its probes into one or two rounds. When the shard does not let the query
// in (far behind, or busy past serveSpins), the query goes by jump search, whose
// batches the shard answers itself.
func (e *Engine) walk(q *query, content []uint64, dst []Match) (_ []Match, done bool) {
	slots := e.workers()
	q.seen.Grow(len(slots))
	idx, ok := e.holdIndex()
	if !ok {
		e.walkFallbacks.Add(1)
		return dst, false
	}
	buf := idx.AppendMembers(q.sub[0].Out[:0], e.fingerprint(shard.Key{Prefix: content[0], NS: q.ns}))
	// The candidates are written in place, as collect writes the matches.
	cs := slices.Grow(q.cands[:0], len(buf))[:len(buf)]
	n := 0
	gappy := false
	for _, wid := range buf {
		if int(wid) < len(slots) {
			if w := slots[wid].Load(); w != nil {
				g := w.Gappy()
				gappy = gappy || g
				c := &cs[n]
				c.wid, c.w, c.gappy, c.alive = wid, w, g, false
				c.drop, c.score, c.lo, c.hi = 0, 0, 0, 0
				n++
			}
		}
	}
	q.cands = cs[:n]
	if e.env.Locked {
		q.sub[0].Out = e.walkSparse(q, idx, content, buf)
		e.letIndex()
		return e.collect(q, content, dst), true
	}
	if !gappy {
		q.sub[0].Out = e.gallop(q, idx, content, buf)
		e.letIndex()
		return e.collect(q, content, dst), true
	}
	alive := len(q.cands)
	h := content[0]
	x := 1
	for ; alive > 0 && x < len(content); x++ {
		if x > walkLimit {
			e.letIndex()
			q.sub[0].Out = buf
			return dst, false
		}
		h = q.ch.Step(h, content[x], uint32(x))
		buf = idx.AppendMembers(buf[:0], e.fingerprint(shard.Key{Prefix: h, Pos: uint32(x), NS: q.ns}))
		q.seen.SetTo(buf)
		for i := range q.cands {
			if c := &q.cands[i]; c.score == 0 && !q.seen.Has(c.wid) {
				c.score = x
				alive--
			}
		}
	}
	e.letIndex()
	q.sub[0].Out = buf
	for i := range q.cands {
		if c := &q.cands[i]; c.score == 0 {
			c.score = x // held every position: x is the query's length
		}
	}
	return e.collect(q, content, dst), true
}

// walks says whether queries try the direct walk first: the locked index and a
// one-shard engine, whose one table is the whole index.
func (e *Engine) walks() bool { return e.cfg.LockedIndex || len(e.shards) == 1 }

// holdIndex makes the caller a reader of the whole index, for walk: the locked index's
// read lock, or a one-shard engine's table token if the shard lets the query in. letIndex
// ends it.
func (e *Engine) holdIndex() (*shard.Index, bool) {
	if e.cfg.LockedIndex {
		e.locked.RLock()
		return e.shards[0].Index(), true
	}
	return e.shards[0].Hold()
}

// letIndex ends what holdIndex began.
func (e *Engine) letIndex() {
	if e.cfg.LockedIndex {
		e.locked.RUnlock()
		return
	}
	e.shards[0].Let()
}

// gallop scores q.cands, every one of them gap-free and a member of position 0, on the
// whole index, which the caller holds (holdIndex). A gap-free worker holds every ancestor of
// every key it holds, so along a query its memberships are a prefix of the positions:
// a member of position x is a member of every position before x, and its score is the
// first position it is not a member of. gallop probes landings at strides that double
// from gallopFirst up to gallopCap x JumpSize (positions 8, 24, 56, 120, 248, 504, 760,
// ... with the default JumpSize), hashing the prefix chain only as deep as the next
// landing, until no candidate is left or the last position is held; the candidates that
// miss a landing have their score inside the stride before it, which a binary search
// (bisect) finds in log2(stride) probes. On the trace-driven log a typical query (seven
// workers holding the 8-block system prompt, one the whole conversation) takes about 10
// probes instead of the walk's 16 and jump search's 20-odd, and a query held 1,000
// blocks deep hashes no position past the landing after its score (at most 4 x JumpSize
// past it). buf is scratch holding position 0's members; gallop returns it, possibly
// grown.
func (e *Engine) gallop(q *query, idx *shard.Index, content []uint64, buf []uint32) []uint32 {
	L := len(content)
	J := e.cfg.JumpSize
	q.pre = append(q.pre[:0], content[0])
	q.hintN = 0
	live := 0 // q.cands[live:] have held every landing so far; the others are scored
	prev, x, step := 0, 0, min(gallopFirst, J)
	for live < len(q.cands) && x < L-1 {
		x = min(x+step, L-1)
		step = min(2*step, gallopCap*J)
		// The prefix hashes grow with the depth hashed, never with the query's length:
		// a query of a billion blocks that its candidates leave early costs a few.
		q.hashTo(content, x)
		// The candidates that missed x go to the front of the live ones: they held
		// prev and missed x.
		var k int
		k, buf = e.split(q, idx, q.cands[live:], x, buf)
		if k > 0 {
			buf = e.bisect(q, idx, q.cands[live:live+k], content, prev, x, 1, buf)
			live += k
		}
		prev = x
	}
	q.endGallop(live, L)
	return buf
}

// gallopFirst is gallop's first stride. Position 0's members are usually held several
// blocks deep (on the trace-driven logs, a system prompt of a few blocks that every
// worker holds), so a first landing at 8 decides them in one probe and a bisection of
// three instead of landings at 1, 3 and 7 first. Mean per query at rest on the locked
// index, first strides 1, 4, 8 and 16: 567-600, 505-534, 458-479, 491-496 ns on the
// conversation trace and 1.29-1.32, 1.26-1.33, 1.07-1.15, 1.16-1.31 us on the 16-worker
// trace log (go test -run '^$' -bench GallopFirst -count 3 ./engine/ at commit 545a46d,
// whose BenchmarkGallopFirst set the stride through a test hook; both went once 8 was
// chosen).
const gallopFirst = 8

// gallopCap x JumpSize is gallop's longest stride. A query held 1,500 blocks deep
// costs 26 landings and a bisection of 6 probes at strides up to 64, 10 landings and 8
// probes at strides up to 256, and hashes at most 192 more blocks (0.2 us at 0.9 ns a
// block). Measured at rest on the conversation trace, five alternating runs of
// kvindex bench --impls locked (p99, caps 1, 4, 8): 1.70-2.15, 1.57-1.72, 1.52-1.87 us.
const gallopCap = 4

// bisect scores gap-free candidates that are members of position lo and not of hi
// (lo < hi, both hashed in q.pre, step apart or a multiple of it): each one's score is
// in (lo, hi]. Each probe of a position splits them into the members, whose score is
// above it, and the others; the recursion is at most log2((hi-lo)/step) + 2 deep. With
// step 1 (every position indexed) a group's score is where its window closes; with
// step worker.SparseStride (the sparse locked index: anchors only) a group holds anchor
// lo and misses lo + step, and each candidate's score is lo plus the run its own
// tables hold from lo (heldFrom; content is the query, for hashing that run).
//
// With step 1 the probe is the middle position, except around the hint (q.hint): the
// score that the previous query on this workspace gave its largest group of
// candidates. A router's queries share their system prompt, which most workers hold
// and nothing more of, so most candidates of most queries score that prompt's length:
// probing hint-1 and hint first decides such a group in one or two probes instead of
// log2(hi-lo) (on both trace-driven logs almost every candidate scores 8, the first
// landing: one probe of position 7 instead of 4, 6 and 7). A wrong hint costs at most
// two probes more than halving would.
func (e *Engine) bisect(q *query, idx *shard.Index, cs []candidate, content []uint64, lo, hi, step int, buf []uint32) []uint32 {
	for hi-lo > step {
		mid := lo + (hi-lo)/step/2*step
		if h := q.hint; step == 1 && lo < h-1 && h-1 < hi {
			mid = h - 1
		} else if step == 1 && lo < h && h < hi {
			mid = h
		}
		// Missed mid: cs[:k], score in (lo, mid]; held it: cs[k:], score in (mid, hi].
		var k int
		k, buf = e.split(q, idx, cs, mid, buf)
		switch {
		case k == 0:
			lo = mid
		case k == len(cs):
			hi = mid
		default:
			buf = e.bisect(q, idx, cs[k:], content, mid, hi, step, buf)
			cs, hi = cs[:k], mid
		}
	}
	if step > 1 {
		for i := range cs {
			cs[i].score = e.heldFrom(q, cs[i].w, content, lo, hi, true)
		}
		return buf
	}
	for i := range cs {
		cs[i].score = hi
	}
	if len(cs) > q.hintN {
		q.hintN, q.nextHint = len(cs), hi
	}
	return buf
}

// The sparse walk: the locked index keeps keys only at the head positions (below
// worker.SparseHead) and at the stride anchors (multiples of worker.SparseStride), so a
// run of block changes inside a stride changes the index at most once (Env.Locked). A
// query probes the index where it has keys and reads the rest of a stride from each
// candidate's own tables (worker.HeldRun), under the same read lock: on the locked
// index a worker's tables change under the write lock (lockLive), so the walk sees the
// index, the gap flags and the tables of one moment.

// walkSparse scores q.cands, the members of position 0, on the sparse locked index,
// which the caller holds: gappy candidates by walking their own tables from position 0
// (the score's definition), gap-free ones by gallop's landings where the index has keys
// (the head's, then anchors at strides doubling up to gallopCap strides) and bisection,
// each candidate's last stride walked in its tables. buf is scratch holding position
// 0's members; walkSparse returns it, possibly grown.
func (e *Engine) walkSparse(q *query, idx *shard.Index, content []uint64, buf []uint32) []uint32 {
	const S = worker.SparseStride
	L := len(content)
	q.pre = append(q.pre[:0], content[0])
	q.hintN = 0
	live := 0 // q.cands[live:] are gap-free and have held every landing so far
	for i := range q.cands {
		if c := &q.cands[i]; c.gappy {
			c.score = e.heldFrom(q, c.w, content, 0, L, false)
			q.cands[i], q.cands[live] = q.cands[live], q.cands[i]
			live++
		}
	}
	last := (L - 1) / S * S // the deepest anchor of the query
	prev, x, step := 0, 0, S
	for live < len(q.cands) && x < L-1 {
		switch {
		case x < gallopFirst:
			x = min(gallopFirst, L-1)
		case x < worker.SparseHead-1:
			x = min(worker.SparseHead-1, L-1)
		case x < last:
			x = min(x-x%S+step, last)
			step = min(2*step, gallopCap*S)
		default:
			// The live candidates held x, the head's last position or the last
			// anchor; the index has no key between there and the query's end.
			from := x - x%S
			if x < worker.SparseHead {
				from = 0
			}
			for i := live; i < len(q.cands); i++ {
				q.cands[i].score = e.heldFrom(q, q.cands[i].w, content, from, L, true)
			}
			return buf
		}
		q.hashTo(content, x)
		var k int
		k, buf = e.split(q, idx, q.cands[live:], x, buf)
		if k > 0 {
			cs := q.cands[live : live+k]
			if x < worker.SparseHead {
				buf = e.bisect(q, idx, cs, content, prev, x, 1, buf) // every position there is indexed
			} else {
				lo := prev - prev%S // an anchor they held (0 for the head)
				if prev < worker.SparseHead {
					lo = 0
				}
				buf = e.bisect(q, idx, cs, content, lo, x, S, buf)
			}
			live += k
		}
		prev = x
	}
	q.endGallop(live, L)
	return buf
}

// heldFrom returns the position where w's run of held query positions from anchor x0
// ends, at most hi: the first position in [x0, hi) whose key w's tables do not hold,
// or hi. It reads w's tables one stride at a time, hashing the query only as deep as
// the run goes (and to the end of the stride it ends in); closed says that w is
// gap-free (worker.HeldRun).
func (e *Engine) heldFrom(q *query, w *worker.Worker, content []uint64, x0, hi int, closed bool) int {
	const S = worker.SparseStride
	x := x0
	for x < hi {
		end := min(hi, x+S)
		q.hashTo(content, end-1)
		n := w.HeldRun(&e.env, q.ns, x, q.pre[x:end], closed)
		if x += n; x < end {
			break
		}
	}
	return x
}

// endGallop ends a gallop (gallop, walkSparse): q.cands[live:] held the query's last
// position, so all of them (L); the score bisect found for its largest group becomes
// the next query's hint.
func (q *query) endGallop(live, L int) {
	for i := live; i < len(q.cands); i++ {
		q.cands[i].score = L
	}
	if q.hintN > 0 {
		q.hint = q.nextHint
	}
}

// split probes position x of the index (hashed in q.pre), which the caller holds, and
// moves the candidates of cs that are not its members to the front, returning how many
// they are and buf (the member list's scratch, possibly grown). A swap reorders the
// answer, which collect then sorts.
func (e *Engine) split(q *query, idx *shard.Index, cs []candidate, x int, buf []uint32) (int, []uint32) {
	buf = idx.AppendMembers(buf[:0], e.fingerprint(shard.Key{Prefix: q.pre[x], Pos: uint32(x), NS: q.ns}))
	q.seen.SetTo(buf)
	k := 0
	for i := range cs {
		if !q.seen.Has(cs[i].wid) {
			if i != k {
				cs[i], cs[k] = cs[k], cs[i]
			}
			k++
		}
	}
	return k, buf
}

// hashTo computes the walk's prefix hashes (q.pre) up to position x, from the last one
// computed.
func (q *query) hashTo(content []uint64, x int) {
	if from := len(q.pre); x >= from {
		q.pre = slices.Grow(q.pre, x+1-from)[:x+1]
		q.ch.Fill(q.pre, content, from)
	}
}
