package shard

import (
	"runtime"
	"sync"
	"sync/atomic"

	"github.com/kvindex/kvindex/internal/invariants"
	"github.com/kvindex/kvindex/ringbuf"
)

// eventBatch is the number of deltas a shard pops from its ring at once (it applies them
// in slices of letInEvery, answering queries between them). With the yield below, 64
// gave find-matches p99 under events at 2 shards of 22.5-37.2 us against 29.3-149 us for
// 128, when queries were answered between whole batches (three alternated rounds of the
// command at yieldBatches; 32 gave 21.0-35.0), event throughput within the rounds'
// spread.
const eventBatch = 64

// Env is what a Loop needs from its engine, given at NewLoop (pebble's commitEnv is
// the model): read-only after that, shared by every shard of the engine.
type Env struct {
	// Done is closed when the engine stops (Close, or a failed shard): Run applies what
	// its ring holds, so that the barrier tokens in it are acknowledged, and returns.
	// Queries still queued are failed by their callers, who see Done too.
	Done <-chan struct{}
	// Fail is called on Run's goroutine, once, with what a panic in it recovered (a
	// broken invariant: a duplicate add, the removal of an absent membership); Run then
	// returns. The engine stops itself there.
	Fail func(recovered any)
	// Barriers names the barrier tokens the ring carries (acknowledged by Run).
	Barriers *Barriers
	// SpinFor says whether a querier may spin for a busy shard's table (Serve): only
	// where the shard's goroutine can run meanwhile (GOMAXPROCS > 1).
	SpinFor bool
	// QueryQueue is the capacity of the shard's query channel.
	QueryQueue int
	// Locked says that the engine runs no shard goroutine: the table belongs to the
	// engine's RWMutex (ApplyLocked under its write lock, Index's readers under its read
	// lock).
	Locked bool
}

// Loop is one shard: its table and the goroutine that owns it (Run).
//
// Ownership: on a sharded engine idx belongs to whoever holds own: Run, which holds it
// while it applies deltas and answers the batches sent on Queries, and lets it go
// between slices of letInEvery deltas when a querier waits for it (want), or a querying
// goroutine that took it between two slices to answer its own batch (Serve) or to read
// the table directly until it lets it go (Hold, Let), reading only. buf and the ring's
// consumer side are Run's alone. On the locked index (Env.Locked) there is no Run: idx
// belongs to the engine's RWMutex (event appliers write it under the write lock with
// ApplyLocked, queries read it under the read lock through Index, many at once, and
// fill no batches). A fill writes nothing of the shard's but its atomic counters: a
// scan's scratch lives in the probe batch. The counters are written by idx's holder and
// read by anyone (Counters, Applied). In an invariants build owner records idx's holder
// and the methods that read or write idx check it.
type Loop struct {
	env     Env
	idx     *Index
	ring    *ringbuf.Ring[Delta]
	queries chan *Batch
	buf     []Delta

	// own is idx's token on a sharded engine (see Ownership); want counts the queriers
	// waiting for it, and runWants says that Run waits for it (lock). behind is the
	// ring backlog past which queriers hand their batches over (Serve).
	own      sync.Mutex
	owner    invariants.Owner // idx's holder (own's, or the locked engine's writer): invariants builds
	want     atomic.Int32
	runWants atomic.Bool
	behind   int

	applied atomic.Uint64
	probes  atomic.Uint64
	// lockedApplied and lockedBatches count the deltas and batches of a locked shard
	// (Env.Locked), written under the engine's write lock and read under its read lock
	// (Counters): a locked engine applies one batch per event, and the six atomic
	// writes per batch that a sharded one publishes its counters with were a tenth of
	// a one-seq removal's cost.
	lockedApplied, lockedBatches uint64
	batches                      atomic.Uint64
	entries                      atomic.Int64
	memberships                  atomic.Int64
	bytes                        atomic.Int64
}

// NewLoop returns a shard fed by ring r, with an empty table. A sharded engine runs
// its Run on a goroutine of its own.
func NewLoop(r *ringbuf.Ring[Delta], env Env) *Loop {
	return &Loop{
		env:     env,
		idx:     New(1024),
		ring:    r,
		queries: make(chan *Batch, env.QueryQueue),
		buf:     make([]Delta, eventBatch),
		behind:  r.Cap() / 4,
	}
}

// Ring is the shard's ring: producers (the event appliers, each under its worker's
// mutex, and Barrier callers) push to it; Run consumes it.
func (s *Loop) Ring() *ringbuf.Ring[Delta] { return s.ring }

// Queries is the shard's query channel: a querier sends a batch it could not Serve and
// owns it again once the shard signals the batch's Done. Run is its only receiver.
func (s *Loop) Queries() chan<- *Batch { return s.queries }

// Applied is the number of ring items (deltas and barrier tokens) the shard has
// applied: a push that returned before a load of the ring's Pushes count is applied
// once Applied reaches that count. Safe from any goroutine. A locked shard has no ring
// and counts nothing here (Counters has its deltas).
func (s *Loop) Applied() uint64 { return s.applied.Load() }

// Counters are a shard's published figures (the engine's Stats).
type Counters struct {
	Applied, Batches, Probes    uint64
	Entries, Memberships, Bytes int64
}

// Counters returns the shard's figures as its table's holder last published them.
// Safe from any goroutine, except on a locked shard (Env.Locked), whose figures are
// read from the table itself: there the caller holds the engine's read lock.
func (s *Loop) Counters() Counters {
	if s.env.Locked {
		s.owner.CheckFree("locked counters")
		return Counters{
			Applied: s.lockedApplied, Batches: s.lockedBatches, Probes: s.probes.Load(),
			Entries: int64(s.idx.Len()), Memberships: int64(s.idx.Memberships()), Bytes: int64(s.idx.Bytes()),
		}
	}
	return Counters{
		Applied: s.applied.Load(), Batches: s.batches.Load(), Probes: s.probes.Load(),
		Entries: s.entries.Load(), Memberships: s.memberships.Load(), Bytes: s.bytes.Load(),
	}
}

// Index returns the shard's table, for a locked engine's reader under the engine's read
// lock (the locked walk): the caller must not write it, nor keep it past the lock.
func (s *Loop) Index() *Index {
	s.owner.CheckFree("locked read")
	return s.idx
}

// ApplyLocked applies ds on the caller's goroutine (a locked engine's event applier,
// under the engine's write lock) as one batch, or nothing when ds is empty.
func (s *Loop) ApplyLocked(ds []Delta) {
	if len(ds) == 0 {
		return // no batch: Counters' Batches counts the calls that changed the table
	}
	s.owner.Acquire()
	s.apply(ds)
	s.owner.Release()
}

// Run is the shard goroutine (sharded engines only): it applies the ring's deltas in
// order and answers the batches sent on Queries, until Env.Done.
func (s *Loop) Run() {
	defer func() {
		if r := recover(); r != nil {
			s.env.Fail(r)
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
		case <-s.env.Done:
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
func (s *Loop) applySliced(ds []Delta) {
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
func (s *Loop) letIn() {
	for i := 0; i < letInSpins && s.want.Load() != 0; i++ {
	}
}

// lock takes own for run. While run waits for it, queriers do not take it (serve checks
// runWants), so run gets it as soon as the querier holding it lets go: a stream of
// queries cannot starve the shard's events, which get a slice after each let-in.
func (s *Loop) lock() {
	s.runWants.Store(true)
	s.own.Lock()
	s.runWants.Store(false)
	s.owner.Acquire()
}

// unlock lets own go (run's or a serving querier's).
func (s *Loop) unlock() {
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
func (s *Loop) Serve(b *Batch) bool {
	if !s.take() {
		return false
	}
	s.fill(b)
	s.unlock()
	return true
}

// Hold takes the table's token for the caller, as Serve does for one batch, and returns
// the table to read directly (a one-shard engine's walk: many probes under one token,
// with no batches): the caller reads it, never writes it, and gives the token back with
// Let before anything else. It fails (nil, false) where Serve would: the shard is more
// than a quarter of its ring behind, or its goroutine does not let the querier in within
// serveSpins tries. Sharded engines only.
func (s *Loop) Hold() (*Index, bool) {
	if !s.take() {
		return nil, false
	}
	return s.idx, true
}

// Let gives back the token Hold took.
func (s *Loop) Let() { s.unlock() }

// take gets the table's token for a querier (Serve, Hold) between two of run's slices,
// or reports that it should not wait for it.
func (s *Loop) take() bool {
	if s.ring.Len() > s.behind {
		return false
	}
	if s.runWants.Load() || !s.own.TryLock() {
		if !s.env.SpinFor {
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
	return true
}

func (s *Loop) apply(ds []Delta) {
	s.owner.Check("shard apply")
	counted := 0 // deltas of ds already added to applied
	for i := range ds {
		if i%touchGroup == 0 {
			s.idx.touch(ds[i:min(i+touchGroup, len(ds))])
		}
		d := &ds[i]
		switch d.Op() {
		case OpAdd:
			if !s.idx.Add(d.FP(), d.ID()) {
				panic("shard: duplicate membership add")
			}
		case OpRemove:
			if !s.idx.Remove(d.FP(), d.ID()) {
				panic("shard: removal of an absent membership")
			}
		case OpBarrier:
			// Publish the counters first, so Stats after a Barrier is exact, and the
			// applied count up to the token: a Barrier that returns has every shard's
			// count cover what it waited for, as retired ids and caughtUp assume.
			s.publish()
			s.applied.Add(uint64(i + 1 - counted))
			counted = i + 1
			if b := s.env.Barriers.Ack(d.ID()); b != nil {
				b.Ack <- struct{}{}
			}
		}
	}
	if s.env.Locked {
		// No barrier tokens, no readers without the lock: Counters reads the table.
		s.lockedApplied += uint64(len(ds))
		s.lockedBatches++
		return
	}
	s.batches.Add(1)
	s.publish()
	// applied is stored last: a Barrier that sees it cover its target also sees the
	// counters Stats reads.
	s.applied.Add(uint64(len(ds) - counted))
}

// publish stores the index's counters where Stats reads them.
func (s *Loop) publish() {
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
// while still on the CPU, and the shard parks once the poll comes up empty. An event
// caller hands its deltas over every 128 (engine's pendShards), a few microseconds of
// event work apart: at 64 polls a shard parked between most of them and each hand-off
// paid a wake-up; 256 polls (each a Gosched: the shard yields to whatever else is
// runnable, so it takes no CPU from work that wants it) bridge them. Conversation log,
// ordered replay, two shards: 7.0M block ops/s at 64 polls, 7.8M at 256.
const spinPolls = 256

// spin polls the ring and the query channel for a short while and reports whether it
// found work (already handled, for queries). Called without own.
func (s *Loop) spin() bool {
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
func (s *Loop) drainQueries() bool {
	any := false
	for len(s.queries) > 0 {
		s.answer(<-s.queries)
		any = true
	}
	return any
}

// answer fills b and hands it back to the querying goroutine.
func (s *Loop) answer(b *Batch) {
	s.fill(b)
	b.Done <- struct{}{}
}

// fill answers each probe of b with the members of its key, appended to b.Out.
func (s *Loop) fill(b *Batch) {
	s.owner.Check("shard fill") // (the locked index's queries read Index, never a batch)
	out := b.Out
	for i := b.Start; i < len(b.Probes); i++ {
		p := &b.Probes[i]
		off := len(out)
		out = s.idx.AppendMembers(out, p.FP)
		p.Off, p.N = uint32(off), uint32(len(out)-off)
	}
	b.Out = out
	n := len(b.Probes) - b.Start
	for i := b.SDone; i < len(b.Scans); i++ {
		n += s.scan(b, &b.Scans[i])
	}
	s.probes.Add(uint64(n))
}

// stampMembers puts the members of fp's key in b's scan scratch (b.seen): a scan with
// many workers then tests each in O(1), as long member lists (a prefix every worker
// holds) would make a search per worker quadratic. b.seen covers the highest worker id
// met so far (4 bytes a worker id, per pooled query), as each query's own set does. The
// scratch is the batch's, not the shard's: in locked mode many querying goroutines run
// scan on one shard at once under the read lock, each with its own batch.
func (s *Loop) stampMembers(b *Batch, fp uint64) {
	b.members = s.idx.AppendMembers(b.members[:0], fp)
	b.seen.SetTo(b.members)
}

// scan answers one scan of b: for each of its workers, the index in b.SFPs of the first
// position of its window whose members lack the worker, reading the positions in order
// and stopping once every worker has a miss or is past its window. It returns how many
// positions it read.
func (s *Loop) scan(b *Batch, sc *Scan) int {
	wids, miss, win := b.SWids[sc.W0:sc.W1], b.SMiss[sc.W0:sc.W1], b.SWin[2*sc.W0:2*sc.W1]
	if len(wids) == 1 {
		read := 0
		for i := win[0]; i < win[1]; i++ {
			read++
			if !s.idx.Has(b.SFPs[i], wids[0]) {
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
	for i := sc.F0; i < sc.F1 && (next < len(wids) || len(active) > 0); i++ {
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
		s.stampMembers(b, b.SFPs[i])
		read++
		keep := active[:0]
		for _, k := range active {
			switch {
			case !b.seen.Has(wids[k]):
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
