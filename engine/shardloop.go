package engine

import (
	"context"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"

	"github.com/kvindex/kvindex/internal/invariants"
	"github.com/kvindex/kvindex/ringbuf"
	"github.com/kvindex/kvindex/shard"
)

const (
	opAdd uint8 = iota + 1
	opRemove
	opBarrier
)

// delta is one message on a shard ring: a membership change of one worker at one key
// (named by its fingerprint, see shard.Hash), or a barrier token (op opBarrier; its id
// names the barrier in Engine.bars). It is 12 bytes, 4-byte aligned: the fingerprint in two
// words and the op in the top two bits of the id's word, so that a ring cell (the
// delta and its 4-byte sequence word) is 16 bytes, four deltas per cache line crossing
// the cores. A delta holds no pointer, so the rings hold nothing the garbage collector
// scans and storing a cell needs no write barrier.
type delta struct {
	lo, hi uint32 // fingerprint
	w      uint32 // op<<opShift | id
}

// opShift places a delta's op above its id; ids (worker ids and barrier ids) are at
// most maxID.
const (
	opShift = 30
	maxID   = 1<<opShift - 1
)

func newDelta(op uint8, fp uint64, id uint32) delta {
	return delta{lo: uint32(fp), hi: uint32(fp >> 32), w: uint32(op)<<opShift | id}
}

func (d *delta) op() uint8  { return uint8(d.w >> opShift) }
func (d *delta) id() uint32 { return d.w & maxID }
func (d *delta) fp() uint64 { return uint64(d.lo) | uint64(d.hi)<<32 }

// barrier is a token that every shard acknowledges once it has applied everything its
// ring held before the token.
type barrier struct {
	ack  chan struct{} // capacity = number of shards
	left int           // shards yet to acknowledge; guarded by barrierTable.mu
}

// barrierTable names the barrier tokens in the rings by id. A token's last
// acknowledgement removes it, so the table holds only barriers whose tokens are still
// in some ring (an abandoned Barrier's too, until the shards reach its tokens).
type barrierTable struct {
	mu   sync.Mutex
	next uint32
	live map[uint32]*barrier
}

// add registers b, to be acknowledged by shards shards, and returns its id.
func (t *barrierTable) add(b *barrier, shards int) uint32 {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.live == nil {
		t.live = make(map[uint32]*barrier)
	}
	for {
		t.next = (t.next + 1) & maxID // a barrier's id travels in a delta's id bits
		if _, taken := t.live[t.next]; !taken {
			break // (an id is taken only by a token stuck in a ring 2^30 barriers ago)
		}
	}
	b.left = shards
	t.live[t.next] = b
	return t.next
}

// ack takes one shard's acknowledgement of barrier id off the table and returns the
// barrier to signal, or nil if the table no longer has it (a Barrier whose pushes
// failed took it back). After the caller's signal the shard must not touch the
// barrier: once every shard has signalled, the Barrier call reuses it.
func (t *barrierTable) ack(id uint32) *barrier {
	t.mu.Lock()
	defer t.mu.Unlock()
	b := t.live[id]
	if b == nil {
		return nil
	}
	if b.left--; b.left == 0 {
		delete(t.live, id)
	}
	return b
}

// drop removes barrier id, whose tokens did not all reach their rings.
func (t *barrierTable) drop(id uint32) {
	t.mu.Lock()
	delete(t.live, id)
	t.mu.Unlock()
}

// eventBatch is the number of deltas a shard pops from its ring at once (it applies them
// in slices of letInEvery, answering queries between them). With the yield below, 64
// gave find-matches p99 under events at 2 shards of 22.5-37.2 us against 29.3-149 us for
// 128, when queries were answered between whole batches (three alternated rounds of the
// command at yieldBatches; 32 gave 21.0-35.0), event throughput within the rounds'
// spread.
const eventBatch = 64

// shardLoop is one shard: the goroutine that owns a shard.Index.
//
// Ownership: on a sharded engine idx belongs to whoever holds own: run, which holds it
// while it applies deltas and answers the batches sent on queries, and lets it go
// between slices of letInEvery deltas when a querier waits for it (want), or a querying
// goroutine that took it between two slices to answer its own batch (serve), reading
// only. buf and the ring's consumer side are run's alone. On the locked index there is
// no run: idx belongs to e.locked (event appliers write it under the write lock,
// queries read it under the read lock, many at once), so fill and scan write nothing of
// the shard's but its atomic counters, and a scan's scratch lives in the probe batch.
// The counters are written by idx's holder and read by Stats.
type shardLoop struct {
	e       *Engine
	id      int
	idx     *shard.Index
	ring    *ringbuf.Ring[delta]
	queries chan *probeBatch
	buf     []delta

	// own is idx's token on a sharded engine (see Ownership); want counts the queriers
	// waiting for it, and runWants says that run waits for it (lock). behind is the
	// ring backlog past which queriers hand their batches over (serve).
	own      sync.Mutex
	owner    invariants.Owner // who holds own (or, locked, e.locked's write side): invariants builds
	want     atomic.Int32
	runWants atomic.Bool
	behind   int

	applied     atomic.Uint64
	probes      atomic.Uint64
	batches     atomic.Uint64
	entries     atomic.Int64
	memberships atomic.Int64
	bytes       atomic.Int64
}

func newShardLoop(e *Engine, id int, r *ringbuf.Ring[delta]) *shardLoop {
	return &shardLoop{
		e:       e,
		id:      id,
		idx:     shard.New(1024),
		ring:    r,
		queries: make(chan *probeBatch, e.cfg.QueryQueue),
		buf:     make([]delta, eventBatch),
		behind:  r.Cap() / 4,
	}
}

func (s *shardLoop) run() {
	defer s.e.wg.Done()
	defer func() {
		if r := recover(); r != nil {
			s.e.shutdown(fmt.Errorf("%w: shard %d: %v", ErrShardFailed, s.id, r))
		}
	}()
	busy := 0 // batches applied since the ring was last found empty or the shard yielded
	for {
		// TryPopBatch while busy: only the PopBatch right before parking tells the
		// producers that the shard may sleep (see ringbuf.Ring.TryPopBatch).
		s.lock()
		n := s.ring.TryPopBatch(s.buf)
		if n > 0 {
			s.applySliced(s.buf[:n])
		}
		answered := s.drainQueries()
		s.unlock()
		if n > 0 {
			s.letIn()
			if busy++; busy == yieldBatches {
				busy = 0
				runtime.Gosched()
			}
		} else {
			busy = 0
		}
		if n > 0 || answered {
			continue
		}
		if s.spin() {
			continue
		}
		s.lock()
		if n = s.ring.PopBatch(s.buf); n > 0 {
			s.applySliced(s.buf[:n])
		}
		s.unlock()
		if n > 0 {
			continue
		}
		select {
		case <-s.ring.Doorbell():
		case b := <-s.queries:
			s.lock()
			s.answer(b)
			s.unlock()
		case <-s.e.done:
			// Apply what is already queued so barrier tokens in it are acknowledged, then
			// stop; queries still queued are failed by their callers, who see done.
			s.lock()
			for n := s.ring.PopBatch(s.buf); n > 0; n = s.ring.PopBatch(s.buf) {
				s.apply(s.buf[:n])
			}
			s.unlock()
			return
		}
	}
}

// letInEvery is how many deltas run applies, at most, between two looks at whether a
// querier waits for the table's token.
const letInEvery = 16

// applySliced is apply for run, which holds own: every letInEvery deltas it answers the
// batches sent to it and lets a waiting querier in (letIn) before going on, so that a
// query waits behind at most that much event work (about a microsecond).
func (s *shardLoop) applySliced(ds []delta) {
	for len(ds) > letInEvery {
		s.apply(ds[:letInEvery])
		ds = ds[letInEvery:]
		if len(s.queries) > 0 {
			s.drainQueries()
		}
		if s.want.Load() != 0 {
			s.unlock()
			s.letIn()
			s.lock()
		}
	}
	s.apply(ds)
}

// letInSpins bounds how long run, between two slices, waits for the queriers that want
// the token: a querier that is running takes it within a few loads of its own, and one
// that is not (descheduled) must not hold up the shard's events. The wait spins on the
// CPU, without the scheduler: the querier it waits for runs on another one.
const letInSpins = 64

// letIn waits, briefly, until no querier wants the token. Called without own.
func (s *shardLoop) letIn() {
	for i := 0; i < letInSpins && s.want.Load() != 0; i++ {
	}
}

// lock takes own for run. While run waits for it, queriers do not take it (serve checks
// runWants), so run gets it as soon as the querier holding it lets go: a stream of
// queries cannot starve the shard's events, which get a slice after each let-in.
func (s *shardLoop) lock() {
	s.runWants.Store(true)
	s.own.Lock()
	s.runWants.Store(false)
	s.owner.Acquire()
}

// unlock lets own go (run's or a serving querier's).
func (s *shardLoop) unlock() {
	s.owner.Release()
	s.own.Unlock()
}

// serveSpins bounds how many times serve tries the token while run holds it. run lets
// a waiting querier in within letInEvery deltas (a microsecond or so); a querier that
// does not get the token by then sends its batch on the channel instead.
const serveSpins = 1 << 12

// serve answers b on the caller's goroutine if it gets the table's token, and reports
// whether it did: the querier then reads the table as its owner, between two of run's
// slices, with no hand-off to the shard's goroutine and back (two wake-ups, each
// microseconds on a busy machine). It spins for the token only where the shard's
// goroutine can run meanwhile (GOMAXPROCS > 1). Sharded engines only.
//
// A shard more than behind deltas behind (a quarter of its ring) gets the batch on its
// channel instead, and the querier waits: queriers that never block would otherwise
// keep the CPUs from the shard's goroutine and the producers, and the events would
// fall behind (kvindex bench's find-matches under load, two queriers and a streamer on
// two CPUs: 17.5k events/s meanwhile at one shard without the rule, 839k with it, 778k
// with every batch sent; the queries 731k, 323k and 234k a second).
func (s *shardLoop) serve(b *probeBatch) bool {
	if s.ring.Len() > s.behind {
		return false
	}
	if s.runWants.Load() || !s.own.TryLock() {
		if !s.e.spinFor {
			return false
		}
		s.want.Add(1)
		got := false
		for i := 0; i < serveSpins && !got; i++ {
			got = !s.runWants.Load() && s.own.TryLock()
		}
		s.want.Add(-1)
		if !got {
			return false
		}
	}
	s.owner.Acquire()
	s.fill(b)
	s.unlock()
	return true
}

func (s *shardLoop) apply(ds []delta) {
	s.owner.Check("shard apply")
	counted := 0 // deltas of ds already added to applied
	for i := range ds {
		d := &ds[i]
		switch d.op() {
		case opAdd:
			if !s.idx.Add(d.fp(), d.id()) {
				panic("engine: duplicate membership add")
			}
		case opRemove:
			if !s.idx.Remove(d.fp(), d.id()) {
				panic("engine: removal of an absent membership")
			}
		case opBarrier:
			// Publish the counters first, so Stats after a Barrier is exact, and the
			// applied count up to the token: a Barrier that returns has every shard's
			// count cover what it waited for, as retired ids and caughtUp assume.
			s.publish()
			s.applied.Add(uint64(i + 1 - counted))
			counted = i + 1
			if b := s.e.bars.ack(d.id()); b != nil {
				b.ack <- struct{}{}
			}
		}
	}
	s.batches.Add(1)
	s.publish()
	// applied is stored last: a Barrier that sees it cover its target also sees the
	// counters Stats reads.
	s.applied.Add(uint64(len(ds) - counted))
}

// publish stores the index's counters where Stats reads them.
func (s *shardLoop) publish() {
	s.entries.Store(int64(s.idx.Len()))
	s.memberships.Store(int64(s.idx.Memberships()))
	s.bytes.Store(int64(s.idx.Bytes()))
}

// yieldBatches is how many event batches a busy shard applies before it yields its P
// (with eventBatch at 64: every 128 deltas).
// A producer that keeps the rings fed keeps its shards busy, and a busy goroutine keeps
// its P until it blocks or the runtime preempts it (every 10 ms): queriers and other
// shards readied on that P wait behind it. kvindex bench --ops
// ../shared/conformance/trace_conversation.jsonl --impls engine --shards 1,2 --producers
// 1,4 --no-verify, three rounds alternating 0 (no yield), 1, 2 and 4 (earlier, four
// rounds of 0, 2 and 8), when batches were 128 deltas: find-matches p99 under events at
// 2 shards 131-186 us without the yield against 26-64 us every 2 batches (145-162
// against 34-142 in the earlier rounds), p99.9 at 1 shard 160-212 against 83-109 us;
// event throughput with 1 and 4 producers within the rounds' spread. A yield costs
// about 0.1-0.2 us.
const yieldBatches = 2

// spinPolls bounds the polling a shard does before it parks. Waking a parked goroutine
// costs the OS a thread wake-up (tens of microseconds on a busy 2-core machine), which
// would dominate a query's latency; a short poll catches the next probe batch or delta
// while still on the CPU, and the shard parks once the poll comes up empty.
const spinPolls = 64

// spin polls the ring and the query channel for a short while and reports whether it
// found work (already handled, for queries). Called without own.
func (s *shardLoop) spin() bool {
	for i := 0; i < spinPolls; i++ {
		if s.ring.Len() > 0 {
			return true
		}
		if len(s.queries) > 0 {
			s.lock()
			s.drainQueries()
			s.unlock()
			return true
		}
		runtime.Gosched()
	}
	return false
}

// drainQueries answers every query batch waiting on the channel. The shard is the
// channel's only receiver, so a non-zero length means a receive does not block; the
// length is one load, where a select with a default case costs a call into the
// runtime's channel code: on the trace-driven replay at 2 shards, the loop polled an
// empty channel so often that its selects were 8% of the CPU profile.
func (s *shardLoop) drainQueries() bool {
	any := false
	for len(s.queries) > 0 {
		s.answer(<-s.queries)
		any = true
	}
	return any
}

// answer fills b and hands it back to the querying goroutine.
func (s *shardLoop) answer(b *probeBatch) {
	s.fill(b)
	b.q.done <- struct{}{}
}

// fill answers each probe of b with the members of its key, appended to b.out.
func (s *shardLoop) fill(b *probeBatch) {
	if s.e.cfg.LockedIndex {
		s.owner.CheckFree("locked query") // readers share idx under the read lock
	} else {
		s.owner.Check("shard fill")
	}
	out := b.out
	for i := b.start; i < len(b.probes); i++ {
		p := &b.probes[i]
		off := len(out)
		out = s.idx.AppendMembers(out, p.fp)
		p.off, p.n = uint32(off), uint32(len(out)-off)
	}
	b.out = out
	n := len(b.probes) - b.start
	for i := b.sdone; i < len(b.scans); i++ {
		n += s.scan(b, &b.scans[i])
	}
	s.probes.Add(uint64(n))
}

// stampMembers puts the members of fp's key in b's scan scratch (b.seen): a scan with
// many workers then tests each in O(1), as long member lists (a prefix every worker
// holds) would make a search per worker quadratic. b.seen covers the highest worker id
// met so far (4 bytes a worker id, per pooled query), as each query's own set does. The
// scratch is the batch's, not the shard's: in locked mode many querying goroutines run
// scan on one shard at once under the read lock, each with its own batch.
func (s *shardLoop) stampMembers(b *probeBatch, fp uint64) {
	b.members = s.idx.AppendMembers(b.members[:0], fp)
	b.seen.setTo(b.members)
}

// scan answers one scan of b: for each of its workers, the index in b.sfps of the first
// position of its window whose members lack the worker, reading the positions in order
// and stopping once every worker has a miss or is past its window. It returns how many
// positions it read.
func (s *shardLoop) scan(b *probeBatch, sc *scanReq) int {
	wids, miss, win := b.swids[sc.w0:sc.w1], b.smiss[sc.w0:sc.w1], b.swin[2*sc.w0:2*sc.w1]
	if len(wids) == 1 {
		read := 0
		for i := win[0]; i < win[1]; i++ {
			read++
			if !s.idx.Has(b.sfps[i], wids[0]) {
				miss[0] = i
				break
			}
		}
		return read
	}
	// The workers come in window-start order (their candidates are sorted by range):
	// each joins the active ones when the scan reaches its window and leaves at its
	// miss or its window's end, so a position costs its member list and the workers
	// still undecided there, not every worker of the scan.
	active := b.active[:0]
	next, read := 0, 0
	for i := sc.f0; i < sc.f1 && (next < len(wids) || len(active) > 0); i++ {
		for next < len(wids) && win[2*next] <= i {
			if i < win[2*next+1] {
				active = append(active, int32(next))
			}
			next++
		}
		if len(active) == 0 {
			if next < len(wids) {
				i = win[2*next] - 1 // nothing to read before the next window starts
			}
			continue
		}
		s.stampMembers(b, b.sfps[i])
		read++
		keep := active[:0]
		for _, k := range active {
			switch {
			case !b.seen.has(wids[k]):
				miss[k] = i
			case i+1 < win[2*k+1]:
				keep = append(keep, k)
			}
		}
		active = keep
	}
	b.active = active
	return read
}

// Barrier returns once every event whose call returned before Barrier was called has
// been applied by every shard: a query that starts after Barrier returns sees all of
// them. It returns ctx.Err() if ctx ends first, or ErrClosed.
func (e *Engine) Barrier(ctx context.Context) error {
	if e.closed.Load() {
		return e.err()
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	if e.cfg.LockedIndex {
		return nil // events are applied before their calls return
	}
	if e.caughtUp() {
		return nil
	}
	b, _ := e.barriers.Get().(*barrier)
	if b == nil {
		b = &barrier{ack: make(chan struct{}, len(e.shards))}
	}
	id := e.bars.add(b, len(e.shards))
	for _, s := range e.shards {
		if err := s.ring.Push(newDelta(opBarrier, 0, id)); err != nil {
			e.bars.drop(id) // b is abandoned: a shard that has its token finds no barrier
			return e.err()
		}
	}
	for range e.shards {
		select {
		case <-b.ack:
		case <-ctx.Done():
			return ctx.Err() // b is abandoned: late acks land in its buffer
		case <-e.done:
			return e.err()
		}
	}
	e.barriers.Put(b)
	return nil
}

// caughtUp reports whether every shard has applied every item its ring held when
// caughtUp was called, polling briefly (as the shards do before they park). It is the
// barrier's fast path: when the shards keep up with the producers, a Barrier costs a
// few atomic loads instead of a token's round trip through every shard and the
// wake-ups of a parked caller. A push that returned before the call reserved a position
// below the ring's Pushes count, and positions are applied in order, so a shard whose
// applied count reaches that target has applied the push.
func (e *Engine) caughtUp() bool {
	var target [MaxShards]uint64
	for i, s := range e.shards {
		target[i] = s.ring.Stats().Pushes
	}
	for spin := 0; ; spin++ {
		done := true
		for i, s := range e.shards {
			if s.applied.Load() < target[i] {
				done = false
				break
			}
		}
		if done {
			return true
		}
		if spin == spinPolls {
			return false
		}
		runtime.Gosched()
	}
}
