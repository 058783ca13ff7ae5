package engine

import (
	"context"
	"encoding/binary"
	"fmt"
	"runtime"
	"slices"
	"sort"
	"sync/atomic"

	"github.com/kvindex/kvindex/engine/internal/chain"
	"github.com/kvindex/kvindex/engine/internal/predict"
	"github.com/kvindex/kvindex/engine/internal/worker"
	"github.com/kvindex/kvindex/shard"
)

// Match is one worker's answer to a query.
type Match struct {
	// Worker is the worker's id as given to the event calls.
	Worker string
	// Score is the number of leading query blocks the worker holds (at least 1).
	Score int
	// Size is the number of distinct engine hashes the worker holds.
	Size int
	// Predicted is the part of Score that comes from predictions (Predict): Score minus
	// the number of leading blocks the worker's events confirm. 0 when the engine holds
	// no prediction for the worker that reaches beyond its confirmed blocks.
	Predicted int
	// Tiers gives, per tier t, the number of leading query blocks the worker holds on
	// tier t or a faster one (Tiers[0]: device; Tiers[1]: device or host; Tiers[2]: any
	// tier), predictions counted as device blocks. Score == Tiers[NumTiers-1]; a worker
	// that publishes device events only has all three equal to Score. Weighted combines
	// them.
	Tiers [NumTiers]int
}

// probeAt says where a position's probe is: in q.sub[batch].Probes[idx], if gen is the
// query's stamp (q.gen); otherwise the position was not probed by this call. Stamps
// instead of a reset spare each call a write per hashed position (a first wave hashes
// up to firstWave of them).
type probeAt struct{ gen, batch, idx uint32 }

// candidate is a worker that holds position 0 of the query.
type candidate struct {
	wid   uint32
	w     *worker.Worker // the worker wid named when the query found it
	gappy bool
	alive bool // held every landing so far
	drop  int  // index of the first landing it missed
	score int  // 0 while unresolved
	// lo and hi bound the positions that decide the score (see scanRange).
	lo, hi int
}

// query is a pooled per-call workspace: nothing in it survives a call except capacity.
type query struct {
	done      chan struct{}
	ns        uint32
	pre       []uint64 // prefix hash per position
	sub       []shard.Batch
	at        []probeAt // per hashed position: where its probe is, if it was probed
	gen       uint32    // this call's stamp in at
	nshard    int       // the engine's shards: sub[s] and sub[nshard+s] go to shard s
	alt       int       // 0 or nshard: the half of sub that add fills
	wx, wstep int       // the landings so far end at wx; the next stride is wstep
	rounds    int       // rounds of probes answered (Stats.QueryRounds)
	asked     bool      // some batch went to a shard since the last gather
	landings  []int
	cands     []candidate
	seen      shard.IDSet      // the members of the last position read
	tgrp      []tierGroup      // collectTiers' scratch: per primary id, its components' scores
	tlist     []*worker.Worker // collectTiers' scratch: the multi-tier workers met, in order
	tpre      []uint64         // tierLengths' scratch: prefix hashes, as deep as it looked
	tstamp    uint32
	phits     []predict.Hit // addPredicted's scratch
	skeys     []matchKey    // sortByKeys' scratch
}

func (e *Engine) getQuery() *query {
	if q, _ := e.qpool.Get().(*query); q != nil {
		return q
	}
	// Two batches per shard: a round can send the next wave while the shards still
	// answer the one before (round).
	n := len(e.shards)
	q := &query{done: make(chan struct{}, 2*n), sub: make([]shard.Batch, 2*n), nshard: n}
	for i := range q.sub {
		q.sub[i].Done = q.done
	}
	return q
}

// FindMatches returns, appended to dst, every worker whose score for the query's
// content hashes is at least 1: the number of leading blocks it holds under exactly this
// prefix, and its size. Matches are ordered by score (highest first), then worker name.
// An empty query matches nothing. It returns ctx.Err() if ctx ends first, or ErrClosed.
func (e *Engine) FindMatches(ctx context.Context, content []uint64, dst []Match) ([]Match, error) {
	return e.findMatches(ctx, 0, content, dst)
}

// FindMatchesIn is FindMatches in a prefix namespace (see Event.Namespace); "" is the
// default namespace. A namespace nothing was ever stored into matches nothing.
func (e *Engine) FindMatchesIn(ctx context.Context, namespace string, content []uint64, dst []Match) ([]Match, error) {
	ns := uint32(0)
	if namespace != "" {
		if ns = e.namespaceID(namespace, nsFind); ns == 0 {
			if e.closed.Load() {
				return dst, e.err()
			}
			return dst, nil
		}
	}
	return e.findMatches(ctx, ns, content, dst)
}

func (e *Engine) findMatches(ctx context.Context, ns uint32, content []uint64, dst []Match) ([]Match, error) {
	if e.closed.Load() {
		return dst, e.err()
	}
	if err := ctx.Err(); err != nil {
		return dst, err
	}
	if len(content) == 0 {
		return dst, nil
	}
	if len(content) >= MaxDepth {
		return dst, fmt.Errorf("%w: %d blocks (limit %d)", ErrQueryTooLong, len(content), MaxDepth-1)
	}
	e.queries.Add(1)
	q := e.getQuery()
	ok := false
	defer func() {
		if ok {
			e.qpool.Put(q)
		} else {
			e.abandoned.Add(1) // shards may still write into q: let the GC have it
		}
	}()
	q.ns = ns
	start := len(dst)
	if e.walks() {
		var done bool
		if dst, done = e.walk(q, content, dst); done {
			ok = true
			dst = e.withGroups(q, content, dst, start)
			return e.withPredictions(q, content, dst, start), nil
		}
	}
	q.reset(content[0])
	if err := e.landings(ctx, q, content); err != nil {
		return dst, err
	}
	if err := e.deciders(ctx, q, len(content)); err != nil {
		return dst, err
	}
	e.noteDense(q.nearDense())
	e.countWork(q)
	dst = e.collect(q, content, dst)
	ok = true
	dst = e.withGroups(q, content, dst, start)
	return e.withPredictions(q, content, dst, start), nil
}

// countWork adds q's round trips and probes to the engine's counters: two atomic adds
// per query, where the rest of a sharded query costs a microsecond or more.
func (e *Engine) countWork(q *query) {
	if e.cfg.LockedIndex {
		return // no round trips; its walk and gallop probe the index directly
	}
	probes := 0
	for i := range q.sub {
		probes += len(q.sub[i].Probes) + len(q.sub[i].SFPs)
	}
	e.queryRounds.Add(uint64(q.rounds))
	e.queryProbes.Add(uint64(probes))
}

// withPredictions adds the predictions to an answer while the engine holds any.
func (e *Engine) withPredictions(q *query, content []uint64, dst []Match, start int) []Match {
	if e.preds.Live() == 0 {
		return dst
	}
	return e.addPredicted(q, q.ns, content, dst, start)
}

// walkLimit is how deep the locked index's direct walk goes before it leaves a query to
// jump search.
const walkLimit = denseLandings

// walk answers a query on the locked index by reading the index directly, under one
// read lock, so that every probe sees the same state. When every candidate is gap-free
// (the common case), gallop answers it; otherwise walk reads position by position while
// some candidate has held every position so far: the score's definition, with no probe
// batches, no landings and no second round. Most queries are decided within walkLimit
// positions (the median best score on the trace-driven log is 8); when a candidate is
// still alive there, walk gives up (done false, dst untouched) and jump search, which is
// cheaper on long matches, answers the query instead.
//
// A one-shard engine walks too, holding its shard's table token (shard.Loop.Hold) where
// the locked index holds its read lock: the table is the whole index there, so the walk
// reads it as the locked one does, where jump search would batch its probes into one or
// two rounds. When the shard does not let the query in (far behind, or busy past
// serveSpins), the query goes by jump search, whose batches the shard answers itself.
func (e *Engine) walk(q *query, content []uint64, dst []Match) (_ []Match, done bool) {
	slots := e.workers()
	q.seen.Grow(len(slots))
	idx, ok := e.holdIndex()
	if !ok {
		e.walkFallbacks.Add(1)
		return dst, false
	}
	buf := idx.AppendMembers(q.sub[0].Out[:0], e.fingerprint(shard.Key{Prefix: content[0], NS: q.ns}))
	q.cands = q.cands[:0]
	gappy := false
	for _, wid := range buf {
		if int(wid) < len(slots) {
			if w := slots[wid].Load(); w != nil {
				g := w.Gappy()
				gappy = gappy || g
				q.cands = append(q.cands, candidate{wid: wid, w: w, gappy: g})
			}
		}
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
		h = e.env.Chain.Step(h, content[x], uint32(x))
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
	live := 0 // q.cands[live:] have held every landing so far; the others are scored
	prev, x, step := 0, 0, min(gallopFirst, J)
	for live < len(q.cands) && x < L-1 {
		x = min(x+step, L-1)
		step = min(2*step, gallopCap*J)
		// The prefix hashes grow with the depth hashed, never with the query's length:
		// a query of a billion blocks that its candidates leave early costs a few.
		pre := slices.Grow(q.pre, x+1-len(q.pre))[:x+1]
		e.env.Chain.Fill(pre, content, len(q.pre))
		h := pre[x]
		q.pre = pre
		buf = idx.AppendMembers(buf[:0], e.fingerprint(shard.Key{Prefix: h, Pos: uint32(x), NS: q.ns}))
		q.seen.SetTo(buf)
		// Move the candidates that missed x to the front of the live ones: they held
		// prev and missed x.
		out := live
		for i := live; i < len(q.cands); i++ {
			if !q.seen.Has(q.cands[i].wid) {
				if i != out { // (a swap reorders the answer, which collect then sorts)
					q.cands[i], q.cands[out] = q.cands[out], q.cands[i]
				}
				out++
			}
		}
		if out > live {
			buf = e.bisect(q, idx, q.cands[live:out], prev, x, buf)
			live = out
		}
		prev = x
	}
	for i := live; i < len(q.cands); i++ {
		q.cands[i].score = L // held the last position, so all of them
	}
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
// (lo < hi, both hashed in q.pre): each one's score is in (lo, hi]. Each probe of the
// middle position splits them into the members, whose score is above it, and the
// others; the recursion is at most log2(hi-lo) deep.
func (e *Engine) bisect(q *query, idx *shard.Index, cs []candidate, lo, hi int, buf []uint32) []uint32 {
	for hi-lo > 1 {
		mid := lo + (hi-lo)/2
		buf = idx.AppendMembers(buf[:0], e.fingerprint(shard.Key{Prefix: q.pre[mid], Pos: uint32(mid), NS: q.ns}))
		q.seen.SetTo(buf)
		// Missed mid: cs[:k], score in (lo, mid]; held it: cs[k:], score in (mid, hi].
		k := 0
		for i := range cs {
			if !q.seen.Has(cs[i].wid) {
				if i != k {
					cs[i], cs[k] = cs[k], cs[i]
				}
				k++
			}
		}
		switch {
		case k == 0:
			lo = mid
		case k == len(cs):
			hi = mid
		default:
			buf = e.bisect(q, idx, cs[k:], mid, hi, buf)
			cs, hi = cs[:k], mid
		}
	}
	for i := range cs {
		cs[i].score = hi
	}
	return buf
}

// landings is round 1: position 0 and the jump landings. The first denseLandings
// positions are all landings, then strides double up to JumpSize. The landings go out in
// waves (the first up to position firstWave or one stride, each next one four times as deep) and
// prefix hashes are computed only as deep as a wave needs: a long query whose workers
// all drop out early costs neither the hashing nor the probes of its tail, and a sharded
// query hashes the next wave while the shards answer the current one (round). The locked
// index pays no round trip per wave, so its first wave is position 0 alone (a query
// that matches nobody is answered by one probe) and its second stops at denseLandings:
// most queries are decided there (the median best score on the trace-driven log is 8),
// and hashing and probing deeper would be wasted on them. The candidates are the members of
// position 0; each leaves with the index of the first landing it missed (drop), or
// alive.
func (e *Engine) landings(ctx context.Context, q *query, content []uint64) error {
	L := len(content)
	J := e.cfg.JumpSize
	q.landings = append(q.landings[:0], 0)
	slots := e.workers()
	q.cands = q.cands[:0]
	q.seen.Grow(len(slots))
	dense := int(e.dense.Load())
	locked := e.cfg.LockedIndex
	hi := max(firstWave, J)
	if locked {
		hi = 0 // position 0 alone first: a query nobody matches costs one probe
	}
	q.wx, q.wstep = 0, 1
	q.add(e, 0)
	for wave := 0; ; wave++ {
		hi = min(L-1, hi)
		from := len(q.landings)
		e.queueWave(q, content, hi, dense)
		next := max(4*hi, dense)
		var err error
		if hi, err = e.round(ctx, q, content, hi, min(L-1, next), dense); err != nil {
			return err
		}
		if wave == 0 {
			q.admit(slots)
			if e.hooks.admitted != nil {
				e.hooks.admitted()
			}
		}
		if q.dropAt(from) == 0 || hi == L-1 {
			return nil
		}
		if hi >= next {
			next = 4 * hi // the round sent the next wave too
		}
		hi = next
	}
}

// queueWave adds the landings after the last one up to position hi (dense positions
// one by one, then strides doubling up to JumpSize) and queues their probes.
func (e *Engine) queueWave(q *query, content []uint64, hi, dense int) {
	J := e.cfg.JumpSize
	from := len(q.landings)
	for q.wx < hi {
		q.wx = min(q.wx+q.wstep, hi)
		if q.wx >= dense {
			q.wstep = min(max(2*q.wstep, dense), J)
		}
		q.landings = append(q.landings, q.wx)
	}
	q.extend(&e.env.Chain, content, hi)
	for _, lx := range q.landings[from:] {
		q.add(e, lx)
	}
}

// round sends the queued probes (landings up to hi) and waits for their answers; it
// returns the deepest landing answered. A sharded engine hashes ahead meanwhile,
// towards position ahead, for as long as answers are outstanding: the next wave needs
// those prefix hashes if any candidate is still alive, and computing them costs
// nothing while the query would only wait (1,024 positions are about 0.9 us of hashing,
// as long as a round trip). If the hashing reaches ahead before the answers are back,
// the next wave goes out at once, in the second half of the batches, so that a query
// whose candidates outlive this wave does not wait for two round trips in a row; when
// none does, the next wave's probes (one per JumpSize positions) were wasted.
func (e *Engine) round(ctx context.Context, q *query, content []uint64, hi, ahead, dense int) (int, error) {
	if e.cfg.LockedIndex {
		return hi, e.scatter(ctx, q)
	}
	sent, err := e.send(ctx, q)
	if err != nil {
		return hi, err
	}
	h := len(q.pre) - 1
	for h < ahead && q.answered() < sent {
		h = min(h+hashAheadChunk, ahead)
		q.extend(&e.env.Chain, content, h)
	}
	if ahead > hi && (e.hooks.speculate > 0 || e.hooks.speculate == 0 && q.answered() < sent) {
		q.alt = q.nshard
		e.queueWave(q, content, ahead, dense)
		q.alt = 0
		more, err := e.send(ctx, q)
		sent += more
		if err != nil {
			return hi, err
		}
		hi = ahead
	}
	return hi, e.gather(ctx, q, sent)
}

// hashAheadChunk is how many positions round hashes between two looks at the answers
// (about 0.1 us of hashing).
const hashAheadChunk = 128

// admit makes every worker that holds position 0 a candidate.
func (q *query) admit(slots []atomic.Pointer[worker.Worker]) {
	for _, wid := range q.members(0) {
		var w *worker.Worker
		if int(wid) < len(slots) {
			w = slots[wid].Load()
		}
		if w == nil {
			continue // an id registered after the query started
		}
		q.cands = append(q.cands, candidate{wid: wid, w: w, gappy: w.Gappy(), alive: true})
	}
}

// dropAt checks the candidates still alive against the landings from index from on,
// records where each drops out, and returns how many are still alive.
func (q *query) dropAt(from int) (alive int) {
	for i := range q.cands {
		if q.cands[i].alive {
			alive++
		}
	}
	// Once every candidate has dropped out, the later landings decide nothing (on the
	// trace-driven log most queries' candidates all drop out among the dense ones).
	for k := max(from, 1); k < len(q.landings) && alive > 0; k++ {
		q.stampMembers(q.landings[k])
		for i := range q.cands {
			c := &q.cands[i]
			if c.alive && !q.seen.Has(c.wid) {
				c.alive, c.drop = false, k
				alive--
			}
		}
	}
	return alive
}

// deciders is round 2: it scores what the landings cannot decide. A gap-free worker
// holds every ancestor of every key it holds, so holding a landing proves the whole
// stride before it, and a missed landing puts its score inside that one stride. A gappy
// worker proves nothing by a landing: every position up to its first missed landing is
// checked. A candidate's score is the first position of its range it misses. Candidates
// whose ranges overlap form one cluster (scanCluster): the positions round 1 probed are
// read here, and each shard scans its share of the others in position order, each
// candidate within its own range, stopping at every candidate's first miss, so that it
// neither copies member lists nor reads past a score. Every candidate leaves with its
// score.
func (e *Engine) deciders(ctx context.Context, q *query, L int) error {
	scan := false
	for i := range q.cands {
		c := &q.cands[i]
		c.lo, c.hi = q.scanRange(c, L)
		c.score = c.hi // until a miss in [lo, hi) says otherwise
		scan = scan || c.lo < c.hi
	}
	if !scan {
		return nil
	}
	if err := e.narrow(ctx, q); err != nil {
		return err
	}
	q.sortByRange()
	need := false
	for g := 0; g < len(q.cands); {
		h, hi := g+1, q.cands[g].hi
		for h < len(q.cands) && q.cands[h].lo < hi {
			hi = max(hi, q.cands[h].hi)
			h++
		}
		if q.cands[g].lo < hi {
			need = e.scanCluster(q, g, h, q.cands[g].lo, hi) || need
		}
		g = h
	}
	if !need {
		return nil
	}
	if err := e.scatter(ctx, q); err != nil {
		return err
	}
	for i := range q.sub {
		q.takeScans(&q.sub[i])
	}
	return nil
}

// scanCluster scores the candidates q.cands[g:h], whose ranges overlap and together
// cover [lo, hi), as far as the positions already probed tell (the first such position
// of its range each one misses), and queues, per shard, one scan of the others, in which
// each candidate's window is its own range: every position of the cluster is hashed and
// read once, however many ranges cover it (with many gappy workers, each scanned from
// position 1 to its own first missed landing, reading each range on its own costs a
// factor of their number). It reports whether it queued any.
func (e *Engine) scanCluster(q *query, g, h, lo, hi int) bool {
	cl := q.cands[g:h]
	var first [2 * MaxShards]int32 // each batch's sfps before the cluster's
	for i := range q.sub {
		first[i] = int32(len(q.sub[i].SFPs))
	}
	for x := lo; x < hi; x++ {
		if !q.probed(x) {
			fp := e.fingerprint(shard.Key{Prefix: q.pre[x], Pos: uint32(x), NS: q.ns})
			b := &q.sub[e.ownerOf(fp)]
			b.SFPs = append(b.SFPs, fp)
			b.SXs = append(b.SXs, int32(x))
			continue
		}
		q.stampMembers(x)
		for i := range cl {
			if c := &cl[i]; c.lo <= x && x < c.score && !q.seen.Has(c.wid) {
				c.score = x
			}
		}
	}
	queued := false
	for i := range q.sub {
		b := &q.sub[i]
		f0, f1 := first[i], int32(len(b.SFPs))
		if f0 == f1 {
			continue
		}
		xs := b.SXs[f0:f1]
		w0 := int32(len(b.SWids))
		for k := range cl {
			c := &cl[k]
			if c.lo >= c.hi {
				continue
			}
			a, z := f0+int32(sort.Search(len(xs), func(j int) bool { return int(xs[j]) >= c.lo })),
				f0+int32(sort.Search(len(xs), func(j int) bool { return int(xs[j]) >= c.score }))
			if a == z {
				continue // nothing of its range, before a miss already found, is here
			}
			b.SWids = append(b.SWids, c.wid)
			b.SWin = append(b.SWin, a, z)
			b.SMiss = append(b.SMiss, -1)
			b.SCand = append(b.SCand, int32(g+k))
		}
		if w1 := int32(len(b.SWids)); w1 > w0 {
			b.Scans = append(b.Scans, shard.Scan{F0: f0, F1: f1, W0: w0, W1: w1})
			queued = true
		}
	}
	return queued
}

// takeScans lowers each scanned candidate's score to the first miss a shard found.
func (q *query) takeScans(b *shard.Batch) {
	for k, m := range b.SMiss {
		if m >= 0 {
			c := &q.cands[b.SCand[k]]
			if x := int(b.SXs[m]); x < c.score {
				c.score = x
			}
		}
	}
}

// narrow shrinks the wide ranges of gap-free candidates before round 2 probes them:
// one round probes every narrowStep-th position of each range wider than narrowMin,
// and since a gap-free worker that holds a position holds every one before it, the
// first of those it misses bounds its score to the narrowStep positions before it. A
// candidate that dropped out in a stride of 64 then costs 7 probes here and at most 7
// in round 2 instead of 63 in round 2, for one more round trip. That pays where the
// probes of a round are not split over shards: the locked index, which pays no round
// trip, and an engine with one shard. go test -run '^$' -bench
// 'TraceQueriesAtRest/locked=false' -benchtime 20000x ./engine/, set=round2 (the queries
// it changes are among them), one shard, builds alternated three rounds: 3.49-3.75
// against 3.80-3.94 us on the conversation trace, 4.94-5.13 against 5.22-5.37 on
// trace16. With two shards, where each shard probes half of the 63 and the round trip
// waits for both, it does not pay: forced on, 4.30-4.74 against 4.47-4.60 us and
// 5.33-5.75 against 5.37-5.68. Over all the queries at rest, one shard, probes per query fall from 18.8
// to 17.4 (conversation trace) and 21.3 to 19.7 (trace16) for 0.034 and 0.040 more round
// trips (kvindex bench --impls engine --shards 1, its at-rest columns).
func (e *Engine) narrow(ctx context.Context, q *query) error {
	if !e.cfg.LockedIndex && len(e.shards) > 1 {
		return nil
	}
	// Candidates with one range (gap-free workers that dropped out in one stride) probe
	// the same positions: in range order, each group's member lists are read once
	// instead of once per candidate.
	q.sortByRange()
	need := false
	for g, h := 0, 0; g < len(q.cands); g = h {
		h = q.sameRange(g)
		if c := &q.cands[g]; q.narrowable(g, h) {
			for x := c.lo + narrowStep - 1; x < c.hi; x += narrowStep {
				if !q.probed(x) {
					q.add(e, x)
					need = true
				}
			}
		}
	}
	if need {
		if err := e.scatter(ctx, q); err != nil {
			return err
		}
	}
	for g, h := 0, 0; g < len(q.cands); g = h {
		h = q.sameRange(g)
		if !q.narrowable(g, h) {
			continue
		}
		lo, hi := q.cands[g].lo, q.cands[g].hi
		for x := lo + narrowStep - 1; x < hi; x += narrowStep {
			q.stampMembers(x)
			for i := g; i < h; i++ {
				// A gappy candidate is not narrowed; one whose hi is at most x has its
				// score bounded already.
				if c := &q.cands[i]; !c.gappy && c.hi > x {
					if q.seen.Has(c.wid) {
						c.lo = x + 1 // held x, so every position up to it
					} else {
						c.hi, c.score = x, x // its score is the first miss in [lo, x), or x
					}
				}
			}
		}
	}
	return nil
}

// sortByRange orders the candidates by deciding range (lo, then hi).
func (q *query) sortByRange() {
	slices.SortFunc(q.cands, func(a, b candidate) int {
		if a.lo != b.lo {
			return a.lo - b.lo
		}
		return a.hi - b.hi
	})
}

// sameRange returns the end of the run of candidates from g (sorted by range) whose
// range is q.cands[g]'s.
func (q *query) sameRange(g int) int {
	h := g + 1
	for h < len(q.cands) && q.cands[h].lo == q.cands[g].lo && q.cands[h].hi == q.cands[g].hi {
		h++
	}
	return h
}

// narrowMin and narrowStep shape narrow: ranges of more than 32 positions (those of the
// strides of 64) are probed every 8th position.
const (
	narrowMin  = 32
	narrowStep = 8
)

// narrowable reports whether narrow narrows the range of the candidates q.cands[g:h],
// which share it: it is wider than narrowMin and some of them are gap-free.
func (q *query) narrowable(g, h int) bool {
	if q.cands[g].hi-q.cands[g].lo <= narrowMin {
		return false
	}
	for i := g; i < h; i++ {
		if !q.cands[i].gappy {
			return true
		}
	}
	return false
}

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

// scanRange returns the positions [lo, hi) that decide c's score: the score is the first
// of them c is not a member of, or hi.
func (q *query) scanRange(c *candidate, L int) (lo, hi int) {
	end := L
	if !c.alive {
		end = q.landings[c.drop] // known missed
	}
	if c.gappy {
		return 1, end
	}
	if c.alive {
		return end, end // held the last position, so all of them
	}
	return q.landings[c.drop-1] + 1, end
}

// denseLandings is how many leading positions round 1 probes one by one, at most; the
// engine probes denseShort instead while the queries it answers let it (noteDense). Most
// queries' best score is a handful of blocks (on the trace-driven logs the median is 8),
// and a gap-free worker that drops out among positions that were all probed has its
// score without round 2: a few extra probes in a batch that goes out anyway cost less
// than a second round trip through the shards. Which few depends on the workload: on
// both trace logs (an 8-block system prompt) 8 against 16 takes probes per query at rest
// from 22.3 to 15.6 (conversation trace) and 22.5 to 15.9 (trace16) for 0.3% and 1%
// more round trips (go test -run '^$' -bench QueryWork -benchtime 3x ./engine/, one
// shard; when it was chosen, 23.7 to 17.0 and 24.1 to 17.5), and in four alternated runs of
// kvindex bench --impls engine --shards 1,2 --producers 1 --no-verify p50 at rest from
// 1.99-2.08 to 1.79-1.80 us at 1 shard and 2.30-2.35 to 1.97-2.02 at 2; but with a
// system prompt of 9 to 16 blocks 8 would cost most queries a round trip (about 1 us)
// to save 7 probes (about 0.2 us).
const (
	denseLandings = 16
	denseShort    = 8
)

// denseWindow and denseMaxNear drive noteDense: every denseWindow sharded queries the
// engine probes denseShort dense positions for the next window if at most denseMaxNear
// of them had a candidate scoring in (denseShort, denseLandings], the scores a short
// dense prefix sends to round 2 and a full one does not, and denseLandings otherwise.
// The break-even is near one query in six (7 probes against a round trip); 1 in 16
// keeps the short prefix to workloads that clearly do not pay for it.
const (
	denseWindow  = 256
	denseMaxNear = denseWindow / 16
)

// nearDense reports whether a scored candidate of q scored in (denseShort,
// denseLandings].
func (q *query) nearDense() bool {
	for i := range q.cands {
		if s := q.cands[i].score; s > denseShort && s <= denseLandings {
			return true
		}
	}
	return false
}

// noteDense counts one sharded query (near: nearDense) and, at the end of each window,
// sets how many dense landings the next window probes. The counter packs the window's
// queries (low 32 bits) and its near ones (high 32 bits) in one atomic add; the one
// caller whose add completes a window resets it (adds racing with the reset are lost,
// which only shortens the next window's count). Answers do not depend on the choice:
// jump search is exact for any landings.
func (e *Engine) noteDense(near bool) {
	if e.hooks.denseFixed {
		return
	}
	add := uint64(1)
	if near {
		add |= 1 << 32
	}
	v := e.denseStats.Add(add)
	if uint32(v) != denseWindow {
		return
	}
	e.denseStats.Store(0)
	d := int32(denseLandings)
	if v>>32 <= denseMaxNear {
		d = denseShort
	}
	e.dense.Store(d)
}

// firstWave is how deep the first wave of landings reaches (at least one stride). A
// deeper first wave saves round trips for long matches but hashes the prefix chain that
// deep for every query that long. With SPEC's chain (about 4 ns a position) 256 -> 64
// took p50 at rest from 2.05-2.29 to 1.65-2.00 us; with the keyed chain (0.9 ns) a
// round trip costs more than hashing a thousand positions. Counted at rest (round trips
// per query over all 750 queries of the conversation trace and 3,000 of trace16, one
// shard, no early waves: go test -run '^$' -bench QueryWork -benchtime 3x ./engine/ at
// commit 9b32e08, whose firstWave=64 variant set the depth through a test hook; hook and
// variant went once 1,024 was chosen): 64 gives 1.38 and 1.77 on average, 1,024
// gives 1.12 and 1.16, for 1-2 more probes per query (when it was chosen, with an
// instrumented build: 1.35 and 1.72 against 1.08 and 1.10, and 107 and 53 more
// positions hashed per query). kvindex bench --impls engine --shards 1,2 --no-verify, four runs
// of each alternated: p99 at rest 17.3-19.3 -> 13.2-15.2 us (1 shard) and 18.3-19.5 ->
// 13.5-15.0 (2 shards) on the conversation trace, 12.1-24.6 -> 10.3-11.7 at 2 shards on
// trace16; p50 unchanged or lower. An early wave of one stride, sent before the rest of
// the first wave is hashed (round then hashes it meanwhile), took the mean at rest at 1
// shard from 2.02-2.12 to 1.85-1.93 us on the conversation trace but from 3.18-3.57 to
// 3.51-3.70 on trace16, whose matches outlive one stride more often (BenchmarkTraceQueriesAtRest,
// six and five alternated runs): not kept.
const firstWave = 1024

// extend computes the prefix hashes of content up to position hi, each position not yet
// probed. Every position a query probes or scans has been extended to, so the
// per-position arrays cost only as much as the prefix the query actually hashes.
func (q *query) extend(c *chain.Chain, content []uint64, hi int) {
	from := len(q.pre)
	if hi < from {
		return
	}
	q.pre = slices.Grow(q.pre, hi+1-from)[:hi+1]
	// (at's entries past what this call stamped hold older stamps or zeros)
	q.at = slices.Grow(q.at, hi+1-len(q.at))[:hi+1]
	c.Fill(q.pre, content, from)
}

// reset starts a query whose first content hash is c0.
func (q *query) reset(c0 uint64) {
	q.pre = append(q.pre[:0], c0)
	if q.gen++; q.gen == 0 { // the stamps wrapped: start over
		clear(q.at[:cap(q.at)])
		q.gen = 1
	}
	q.at = append(q.at[:0], probeAt{})
	q.rounds = 0
	for i := range q.sub {
		b := &q.sub[i]
		b.Start, b.Probes, b.Out = 0, b.Probes[:0], b.Out[:0]
		b.SDone, b.Scans, b.SFPs, b.SWids, b.SWin, b.SMiss = 0, b.Scans[:0], b.SFPs[:0], b.SWids[:0], b.SWin[:0], b.SMiss[:0]
		b.SXs, b.SCand = b.SXs[:0], b.SCand[:0]
	}
}

// add queues a probe of position x with its owner shard.
func (q *query) add(e *Engine, x int) {
	fp := e.fingerprint(shard.Key{Prefix: q.pre[x], Pos: uint32(x), NS: q.ns})
	s := e.ownerOf(fp)
	bi := q.alt + s
	b := &q.sub[bi]
	q.at[x] = probeAt{gen: q.gen, batch: uint32(bi), idx: uint32(len(b.Probes))}
	b.Probes = append(b.Probes, shard.Probe{FP: fp})
}

// probed reports whether position x (hashed) was probed by this call.
func (q *query) probed(x int) bool { return q.at[x].gen == q.gen }

// members returns the answer for a probed position.
func (q *query) members(x int) []uint32 {
	a := &q.at[x]
	b := &q.sub[a.batch]
	p := &b.Probes[a.idx]
	return b.Out[p.Off : p.Off+p.N]
}

func (q *query) stampMembers(x int) { q.seen.SetTo(q.members(x)) }

// scatter sends every batch with unanswered probes to its shard and waits for all of
// them.
func (e *Engine) scatter(ctx context.Context, q *query) error {
	if e.cfg.LockedIndex {
		e.locked.RLock()
		e.shards[0].FillShared(&q.sub[0])
		e.locked.RUnlock()
		q.sub[0].Settle()
		return nil
	}
	sent, err := e.send(ctx, q)
	if err != nil {
		return err
	}
	return e.gather(ctx, q, sent)
}

// send answers every batch with unanswered probes (sharded engines only): on the
// caller's goroutine when it gets the shard's table between two of its slices (shard.Loop.Serve),
// else by sending it to the shard. It returns how many it sent. Until gather has
// received that many answers, the sent batches belong to the shards: the caller may
// hash (extend) but not add probes.
func (e *Engine) send(ctx context.Context, q *query) (sent int, err error) {
	for i := range q.sub {
		b := &q.sub[i]
		if b.Flying || b.Start == len(b.Probes) && b.SDone == len(b.Scans) {
			continue
		}
		sh := e.shards[i%q.nshard]
		q.asked = true
		if sh.Serve(b) {
			b.Settle()
			continue
		}
		b.Flying = true // (a failed send leaves it set: the query is abandoned then)
		// A send to a channel with room costs a fraction of a three-way select.
		select {
		case sh.Queries() <- b:
			sent++
			continue
		default:
		}
		select {
		case sh.Queries() <- b:
			sent++
		case <-ctx.Done():
			return sent, ctx.Err()
		case <-e.done:
			return sent, e.err()
		}
	}
	return sent, nil
}

// answered reports how many of the batches sent are answered, without waiting.
func (q *query) answered() int { return len(q.done) }

// gather waits for the answers to the sent batches sent.
func (e *Engine) gather(ctx context.Context, q *query, sent int) error {
	if q.asked {
		q.rounds++
		q.asked = false
	}
	// The answers usually arrive within a microsecond or two: poll for them before
	// parking, which would cost a thread wake-up on the way back.
	for spin := 0; sent > 0 && spin < spinPolls; spin++ {
		select {
		case <-q.done:
			sent--
		default:
			runtime.Gosched()
		}
	}
	for ; sent > 0; sent-- {
		select {
		case <-q.done:
		case <-ctx.Done():
			return ctx.Err()
		case <-e.done:
			return e.err()
		}
	}
	for i := range q.sub {
		q.sub[i].Settle()
	}
	return nil
}
