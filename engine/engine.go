package engine

import (
	"fmt"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/kvindex/kvindex/engine/internal/chain"
	"github.com/kvindex/kvindex/engine/internal/predict"
	"github.com/kvindex/kvindex/engine/internal/worker"
	"github.com/kvindex/kvindex/internal/rwlock"
	"github.com/kvindex/kvindex/internal/table"
	"github.com/kvindex/kvindex/ringbuf"
	"github.com/kvindex/kvindex/shard"
)

// Block is one stored block: its content hash (see package hash) and the engine's opaque
// hash for it (vLLM's and SGLang's block hash, called seq in the op log).
type Block struct {
	Content uint64
	Seq     uint64
}

// testHooks are the engine's test seams, in one place: each is zero in production and
// set only by tests and benchmarks of this package (export_test.go, the ceiling and
// partition measurements), before the engine's first call.
type testHooks struct {
	// admitted runs once per sharded query, after round 1 has made position 0's
	// members candidates and before any later wave is answered: the seam through which
	// TestQueryDropsWorkerReplacedMidQuery removes a candidate mid-query.
	admitted func()
	// dropDeltas discards index deltas at flush: the engine then does only its
	// per-worker bookkeeping (the ceiling benchmark).
	dropDeltas bool
	// denseFixed keeps dense where a test put it (noteDense does not change it), so
	// that the differential tests hold both dense prefixes to the model.
	denseFixed bool
	// speculate fixes whether a round sends the next wave before its answers are back
	// (round): 0 when its hashing wins the race (production), 1 always, -1 never, so
	// that the differential tests take both ways whatever the timing.
	speculate int8
}

// Engine is the index. All methods are safe for concurrent use.
//
// Events of one worker must be applied in the order the worker emitted them; the engine
// applies each worker's events under that worker's mutex, so calls for one worker from
// several goroutines are serialised in whatever order they arrive. Events of different
// workers proceed in parallel (on the locked index they take turns: Config.LockedIndex).
//
// Visibility: an event whose call has returned is visible to every query that starts
// after a Barrier that started after that return. Queries that overlap event traffic see
// each shard's state at some moment during the query, so a worker whose event is still
// on its way through the shards may be scored from a mix of its states before and after
// it (the package documentation says how far).
type Engine struct {
	// Set at New, read-only after (any goroutine): the configuration, the shards' spin
	// policy, and the test seams (set by tests before the first call).
	cfg     Config
	spinFor bool      // a querier may spin for a busy shard's table (shard.Loop.Serve): GOMAXPROCS > 1 at New
	hooks   testHooks // zero in production

	// env is the workers' environment (package engine/internal/worker): set at New, its
	// table seed (keys every table hash of this engine, see table.Seed), prefix chain
	// (package engine/internal/chain; its key read from a snapshot by Restore before any
	// event) and shard count are read-only after; its block counters are written by
	// event appliers at their flush (atomics, or on the locked index plain words under
	// its write lock: worker.Env.Locked); Register is the registry's, for tier
	// components.
	env worker.Env

	// Owned by package shard (see its doc): each shard's table belongs to the holder of
	// its token. On the locked index (cfg.LockedIndex) locked is shards[0]'s token:
	// event appliers hold it to write, queries to read. bars names the barrier tokens
	// in the rings (its own mutex; barrier.go); barriers pools the Barrier calls' acks.
	shards   []*shard.Loop
	locked   rwlock.RWMutex
	bars     shard.Barriers
	barriers sync.Pool

	// Lifecycle, any goroutine: closed and done say the engine stopped (Close, or a
	// failed shard, whose reason failed keeps); once makes shutdown run once; wg
	// counts the shard goroutines.
	closed atomic.Bool
	done   chan struct{}
	once   sync.Once
	failed atomic.Pointer[error]
	wg     sync.WaitGroup

	// The worker registry, owned by the holder of regMu: byName maps a name to its
	// *worker; slots maps a worker id to its *worker (nil for a free id). slots grows by
	// doubling under regMu (the old array is copied once, then abandoned to readers
	// that still hold it) and its cells are atomics written in place, so creating or
	// removing a worker is O(1) amortised and queries read it without a lock. nextID is
	// the first id never given out; free the ids given up, oldest first. hybrids lists
	// the workers that declared KV-cache groups (groups.go), copied on write under regMu
	// and read by queries with one load. Each worker's own state belongs to the holder
	// of its mutex (package engine/internal/worker).
	byName  nameTable
	regMu   sync.Mutex
	slots   atomic.Pointer[[]atomic.Pointer[worker.Worker]]
	nextID  uint32
	free    []freeID
	nlive   atomic.Int64
	hybrids atomic.Pointer[[]*worker.Worker]

	// The namespace table (namespaces.go), owned by its mutexes; "" is id 0 and never
	// stored.
	ns nsTable

	// The prediction table (package engine/internal/predict), owned by the holder of
	// its mutex; taken after a worker's mutex, never before.
	preds predict.Table

	// Pools of per-call workspaces: a query (and its probe batches) belongs to the
	// calling goroutine; an outbox to whoever holds the worker it is lent to.
	qpool    sync.Pool
	outboxes sync.Pool // of *worker.Outbox

	// The query tuning, any goroutine (atomics): dense is how many leading positions a
	// query's first wave probes one by one, denseShort or denseLandings; noteDense sets
	// it from denseStats.
	dense      atomic.Int32
	denseStats atomic.Uint64

	// Counters (Stats), atomics: each written by the owner of what it counts (an event
	// applier at its flush, a querier at its end), read by anyone. The block counts
	// are env's.
	events          atomic.Uint64
	rejParent       atomic.Uint64
	rejInvalid      atomic.Uint64
	skippedRemovals atomic.Uint64
	skippedCopies   atomic.Uint64
	queries         atomic.Uint64
	queryRounds     atomic.Uint64 // see Stats.QueryRounds
	queryProbes     atomic.Uint64
	walkFallbacks   atomic.Uint64 // see Stats.WalkFallbacks
	abandoned       atomic.Uint64
	// lockedEvents and lockedSkipped are events and skippedRemovals on the locked index,
	// whose flush runs under its write lock: plain words, read under its read lock
	// (Stats), as the block counts are (worker.Env.LockedBlocks).
	lockedEvents, lockedSkipped uint64
}

// New validates cfg, starts the shard goroutines and returns the engine.
func New(cfg Config) (*Engine, error) {
	return newEngine(cfg, table.NewSeed(), chain.New(cfg.SpecChain, table.NewSeed()))
}

// testChainKey is the chain key of the engines tests start with newSeeded, so that
// their snapshots depend on nothing but their state.
var testChainKey = table.SeedFrom(0x6b767065)

// newSeeded is New with a given table seed (and a fixed chain key), for tests that need
// to know it.
func newSeeded(cfg Config, seed table.Seed) (*Engine, error) {
	return newEngine(cfg, seed, chain.New(cfg.SpecChain, testChainKey))
}

// newEngine starts an engine with table seed seed and prefix chain ch.
func newEngine(cfg Config, seed table.Seed, ch chain.Chain) (*Engine, error) {
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	e := &Engine{cfg: cfg, done: make(chan struct{}), spinFor: runtime.GOMAXPROCS(0) > 1}
	e.env.Seed, e.env.Chain, e.env.Shards = seed, ch, cfg.Shards
	e.env.Locked = cfg.LockedIndex
	e.env.Register = e.registerComponent
	e.dense.Store(denseLandings)
	e.byName.init()
	e.ns.init(cfg.NamespaceBytes)
	empty := []atomic.Pointer[worker.Worker]{}
	e.slots.Store(&empty)
	e.shards = make([]*shard.Loop, cfg.Shards)
	ringCells := cfg.QueueSize
	if cfg.LockedIndex {
		// The locked baseline applies deltas on the caller's goroutine and never pushes
		// to its ring, so it keeps the smallest one (QueueSize cells are 128 KiB by default).
		ringCells = 2
	}
	for i := range e.shards {
		r, err := ringbuf.New[shard.Delta](ringCells)
		if err != nil {
			return nil, fmt.Errorf("%w: %v", ErrInvalidConfig, err)
		}
		e.shards[i] = shard.NewLoop(r, shard.Env{
			Done: e.done,
			Fail: func(r any) {
				e.shutdown(fmt.Errorf("%w: shard %d: %v", ErrShardFailed, i, r))
			},
			Barriers:   &e.bars,
			SpinFor:    e.spinFor,
			QueryQueue: cfg.QueryQueue,
			Locked:     cfg.LockedIndex,
		})
	}
	if cfg.LockedIndex {
		return e, nil
	}
	for _, s := range e.shards {
		e.wg.Add(1)
		go func() {
			defer e.wg.Done()
			s.Run()
		}()
	}
	return e, nil
}

// Config returns the effective configuration, defaults filled in.
func (e *Engine) Config() Config { return e.cfg }

func (e *Engine) err() error {
	if p := e.failed.Load(); p != nil {
		return *p
	}
	return ErrClosed
}

// Close stops the engine: later calls return ErrClosed, calls waiting on a shard return
// ErrClosed, and every goroutine the engine started has exited when Close returns.
// Close is idempotent.
func (e *Engine) Close() error {
	e.shutdown(nil)
	e.wg.Wait()
	return nil
}

func (e *Engine) shutdown(cause error) {
	e.once.Do(func() {
		if cause != nil {
			e.failed.Store(&cause)
		}
		e.closed.Store(true)
		// Rings close first: a push either lands before its ring closes (and the shard
		// applies it while draining after done) or fails with ErrClosed.
		for _, s := range e.shards {
			s.Ring().Close()
		}
		close(e.done)
	})
}

// WorkerSize returns the number of distinct engine hashes a worker holds, and whether it
// is known.
func (e *Engine) WorkerSize(worker string) (int, bool) {
	w := e.lookup(worker)
	if w == nil {
		return 0, false
	}
	return w.TotalSize(), true
}

// lookup returns the live worker named name, or nil.
func (e *Engine) lookup(name string) *worker.Worker {
	return e.byName.load(name)
}

// workers returns the registry's id -> worker cells; a nil cell is a free id.
func (e *Engine) workers() []atomic.Pointer[worker.Worker] { return *e.slots.Load() }

// eachLiveWorker calls f for every registered worker that is not a tier component and
// not removed, with the worker's mutex held (f may not take it again). Workers
// registered or removed meanwhile may be seen or not; each one f sees is consistent.
// Concurrent: any goroutine, no engine lock needed.
func (e *Engine) eachLiveWorker(f func(wk *worker.Worker)) {
	for ws, i := e.workers(), 0; i < len(ws); i++ {
		wk := ws[i].Load()
		if wk == nil || wk.IsComponent() {
			continue
		}
		e.lockWorker(wk)
		if !wk.Dead() {
			f(wk)
		}
		e.unlockWorker(wk)
	}
}

// lookupOrCreate returns the live worker named name, registering it if needed.
func (e *Engine) lookupOrCreate(name string) *worker.Worker {
	if w := e.lookup(name); w != nil {
		return w
	}
	e.regMu.Lock()
	defer e.regMu.Unlock()
	if w := e.lookup(name); w != nil {
		return w
	}
	// The registry keeps its own copy of the name: a caller's string (often a field of
	// an Event) must not outlive the call, or escape analysis makes every event's slices
	// escape with it, and Remove(worker, seqs...) would allocate.
	own := strings.Clone(name)
	w := worker.New(own, e.allocIDLocked())
	(*e.slots.Load())[w.ID()].Store(w)
	e.byName.store(own, w)
	e.nlive.Add(1)
	return w
}

// allocIDLocked returns a free worker id (a retired one, oldest first, or the next never
// given out), growing the id array to cover it. Called with regMu held.
func (e *Engine) allocIDLocked() uint32 {
	wid := e.nextID
	if len(e.free) > 0 && e.retired(e.free[0]) {
		wid = e.free[0].wid
		e.free = e.free[1:]
	} else {
		if wid > shard.MaxID {
			// A worker id travels in a delta's 30 id bits. Ids are reused once retired, so
			// this takes over a billion workers (and tier components) alive at once, each
			// with hundreds of bytes of state: memory runs out long before.
			panic("engine: more than 2^30 worker ids in use")
		}
		e.nextID++
	}
	slots := *e.slots.Load()
	if int(wid) >= len(slots) {
		grown := make([]atomic.Pointer[worker.Worker], max(64, 2*len(slots)))
		for i := range slots {
			grown[i].Store(slots[i].Load())
		}
		e.slots.Store(&grown)
	}
	return wid
}

// freeID is a worker id given up by RemoveWorker, and how many items each shard's ring
// had been given when it was: the id's removal deltas are among them.
type freeID struct {
	wid   uint32
	after []uint64
}

// retired reports whether every shard has applied f's removal deltas. Only then may the
// id name another worker: until then a shard still holds memberships under it, and a
// query would credit them to the new worker.
func (e *Engine) retired(f freeID) bool {
	for i, s := range e.shards {
		if s.Applied() < f.after[i] {
			return false
		}
	}
	return true
}

// unregister forgets w. Its id is reused (oldest first) once its removal deltas, already
// in the rings, have been applied.
// A primary's tier components go with it.
func (e *Engine) unregister(w *worker.Worker) {
	e.regMu.Lock()
	defer e.regMu.Unlock()
	e.byName.deleteIf(w.Name(), w)
	e.freeIDLocked(w)
	w.Components(func(_ worker.Tier, c *worker.Worker) { e.freeIDLocked(c) })
	e.nlive.Add(-1)
}

// registerComponent gives a new tier component of primary p (locked) for tier t a
// worker id: worker.Env.Register.
func (e *Engine) registerComponent(p *worker.Worker, t worker.Tier) *worker.Worker {
	e.regMu.Lock()
	defer e.regMu.Unlock()
	c := p.NewComponent(t, e.allocIDLocked())
	(*e.slots.Load())[c.ID()].Store(c)
	return c
}

// freeIDLocked gives up w's id (see unregister). Called with regMu held.
func (e *Engine) freeIDLocked(w *worker.Worker) {
	(*e.slots.Load())[w.ID()].Store(nil)
	f := freeID{wid: w.ID(), after: make([]uint64, len(e.shards))}
	for i, s := range e.shards {
		f.after[i] = s.Ring().Stats().Pushes
	}
	e.free = append(e.free, f)
}

// fingerprint is k's name in the positional index (shard.Hash).
func (e *Engine) fingerprint(k shard.Key) uint64 { return e.env.Fingerprint(k) }

// ownerOf returns the shard that owns the key with fingerprint fp (worker.Env.OwnerOf).
func (e *Engine) ownerOf(fp uint64) int { return e.env.OwnerOf(fp) }
