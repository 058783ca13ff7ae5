package engine

import (
	"context"
	"runtime"
	"slices"
	"sort"
	"sync/atomic"

	"github.com/kvindex/kvindex/engine/internal/worker"
	"github.com/kvindex/kvindex/shard"
)

// Jump search: round 1 probes position 0 and the landings in waves (landings, round),
// round 2 scores what the landings leave undecided (narrow, deciders, scanCluster); the
// probe batches travel to the shards and back through scatter, send and gather.

// landings is round 1: position 0 and the jump landings. The first denseLandings
// positions are all landings, then strides double up to JumpSize. The landings go out in
// waves (the first up to position firstWave or one stride, each next one four times as deep) and
// prefix hashes are computed only as deep as a wave needs: a long query whose workers
// all drop out early costs neither the hashing nor the probes of its tail, and a sharded
// query hashes the next wave while the shards answer the current one (round). (The
// locked index never comes here: its queries walk, walkSparse.) The candidates are the
// members of position 0; each leaves with the index of the first landing it missed
// (drop), or alive.
func (e *Engine) landings(ctx context.Context, q *query, content []uint64) error {
	L := len(content)
	J := e.cfg.JumpSize
	q.landings = append(q.landings[:0], 0)
	slots := e.workers()
	q.cands = q.cands[:0]
	q.seen.Grow(len(slots))
	dense := int(e.dense.Load())
	hi := max(firstWave, J)
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
	q.extend(q.ch, content, hi)
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
	sent, err := e.send(ctx, q)
	if err != nil {
		return hi, err
	}
	h := len(q.pre) - 1
	for h < ahead && q.answered() < sent {
		h = min(h+hashAheadChunk, ahead)
		q.extend(q.ch, content, h)
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
// probes of a round are not split over shards: an engine with one shard (the locked
// index's queries never come here: walkSparse). go test -run '^$' -bench
// 'TraceQueriesAtRest/locked=false' -benchtime 20000x ./engine/, set=round2 (the queries
// it changes are among them), one shard, builds alternated three rounds: 3.49-3.75
// against 3.80-3.94 us on the conversation trace, 4.94-5.13 against 5.22-5.37 on
// trace16. With two shards, where each shard probes half of the 63 and the round trip
// waits for both, it does not pay: forced on, 4.30-4.74 against 4.47-4.60 us and
// 5.33-5.75 against 5.37-5.68. Over all the queries at rest, one shard, probes per query fall from 18.8
// to 17.4 (conversation trace) and 21.3 to 19.7 (trace16) for 0.034 and 0.040 more round
// trips (kvindex bench --impls engine --shards 1, its at-rest columns).
func (e *Engine) narrow(ctx context.Context, q *query) error {
	if len(e.shards) > 1 {
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

// scatter sends every batch with unanswered probes to its shard and waits for all of
// them.
func (e *Engine) scatter(ctx context.Context, q *query) error {
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
