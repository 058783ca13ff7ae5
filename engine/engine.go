package engine

import (
	"fmt"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/kvindex/kvindex/internal/invariants"
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
// workers proceed in parallel.
//
// Visibility: an event whose call has returned is visible to every query that starts
// after a Barrier that started after that return. Queries that overlap event traffic see
// each shard's state at some moment during the query, so a worker whose event is still
// on its way through the shards may be scored from a mix of its states before and after
// it (the package documentation says how far).
type Engine struct {
	cfg    Config
	shards []*shard.Loop

	closed atomic.Bool
	done   chan struct{} // closed by Close or by a failed shard
	once   sync.Once
	failed atomic.Pointer[error]
	wg     sync.WaitGroup

	// registry of workers: byName maps a name to its *worker; slots maps a worker id to
	// its *worker (nil for a free id). slots grows by doubling under regMu (the old
	// array is copied once, then abandoned to readers that still hold it) and its cells
	// are written in place, so creating or removing a worker is O(1) amortised and
	// queries read it without a lock. nextID is the first id never given out.
	byName nameTable
	regMu  sync.Mutex
	slots  atomic.Pointer[[]atomic.Pointer[worker]]
	nextID uint32
	free   []freeID
	nlive  atomic.Int64
	// hybrids lists the workers that declared KV-cache groups (groups.go), copied on
	// write under regMu and read by queries without it.
	hybrids atomic.Pointer[[]*worker]

	blocks atomic.Int64
	// tierBlocks splits blocks by tier.
	tierBlocks [NumTiers]atomic.Int64

	// ns interns prefix-namespace names to ids (namespaces.go); "" is id 0 and never
	// stored.
	ns nsTable

	events          atomic.Uint64
	rejParent       atomic.Uint64
	rejInvalid      atomic.Uint64
	skippedRemovals atomic.Uint64
	skippedCopies   atomic.Uint64
	queries         atomic.Uint64
	queryRounds     atomic.Uint64 // see Stats.QueryRounds
	queryProbes     atomic.Uint64
	abandoned       atomic.Uint64

	qpool    sync.Pool
	barriers sync.Pool
	bars     shard.Barriers // the barrier tokens in the rings (barrier.go)
	outboxes sync.Pool      // of *outbox

	// hooks are what tests and benchmarks set (before any call); zero in production.
	hooks testHooks

	// locked is shards[0]'s table token when cfg.LockedIndex is set (shard.Env.Locked):
	// event appliers hold it to write, queries to read.
	locked sync.RWMutex
	// spinFor says whether a querier may spin for a busy shard's table (shard.Loop.Serve):
	// only when the shard's goroutine can run meanwhile, with GOMAXPROCS > 1 at New.
	spinFor bool

	// seed keys every table hash of this engine (see table.Seed); drawn at New.
	seed table.Seed
	// chain computes the prefix words of keys (chain.go); its key is drawn at New or
	// read from the snapshot Restore loads.
	chain chain
	// dense is how many leading positions a query's first wave probes one by one,
	// denseShort or denseLandings; noteDense sets it from denseStats.
	dense      atomic.Int32
	denseStats atomic.Uint64

	// preds holds the predictions (predict.go).
	preds predTable
}

// New validates cfg, starts the shard goroutines and returns the engine.
func New(cfg Config) (*Engine, error) {
	return newEngine(cfg, table.NewSeed(), newChain(cfg.SpecChain, table.NewSeed()))
}

// testChainKey is the chain key of the engines tests start with newSeeded, so that
// their snapshots depend on nothing but their state.
var testChainKey = table.SeedFrom(0x6b767065)

// newSeeded is New with a given table seed (and a fixed chain key), for tests that need
// to know it.
func newSeeded(cfg Config, seed table.Seed) (*Engine, error) {
	return newEngine(cfg, seed, newChain(cfg.SpecChain, testChainKey))
}

// newEngine starts an engine with table seed seed and prefix chain ch.
func newEngine(cfg Config, seed table.Seed, ch chain) (*Engine, error) {
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	e := &Engine{cfg: cfg, done: make(chan struct{}), seed: seed, chain: ch, spinFor: runtime.GOMAXPROCS(0) > 1}
	e.dense.Store(denseLandings)
	e.byName.init()
	e.ns.init(cfg.NamespaceBytes)
	empty := []atomic.Pointer[worker]{}
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
	return w.totalSize(), true
}

// lookup returns the live worker named name, or nil.
func (e *Engine) lookup(name string) *worker {
	return e.byName.load(name)
}

// workers returns the registry's id -> worker cells; a nil cell is a free id.
func (e *Engine) workers() []atomic.Pointer[worker] { return *e.slots.Load() }

// lookupOrCreate returns the live worker named name, registering it if needed.
func (e *Engine) lookupOrCreate(name string) *worker {
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
	w := &worker{name: own, wid: e.allocIDLocked()}
	(*e.slots.Load())[w.wid].Store(w)
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
		grown := make([]atomic.Pointer[worker], max(64, 2*len(slots)))
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
func (e *Engine) unregister(w *worker) {
	e.regMu.Lock()
	defer e.regMu.Unlock()
	e.byName.deleteIf(w.name, w)
	e.freeIDLocked(w)
	w.components(func(_ Tier, c *worker) { e.freeIDLocked(c) })
	e.nlive.Add(-1)
}

// freeIDLocked gives up w's id (see unregister). Called with regMu held.
func (e *Engine) freeIDLocked(w *worker) {
	(*e.slots.Load())[w.wid].Store(nil)
	f := freeID{wid: w.wid, after: make([]uint64, len(e.shards))}
	for i, s := range e.shards {
		f.after[i] = s.Ring().Stats().Pushes
	}
	e.free = append(e.free, f)
}

// getOutbox takes a scratch for locked workers from the pool.
func (e *Engine) getOutbox() *outbox {
	if o, _ := e.outboxes.Get().(*outbox); o != nil {
		return o
	}
	return &outbox{pend: make([][]shard.Delta, len(e.shards))}
}

// unlock takes back the outbox of a worker locked by lockLive (flushed, so empty) and
// unlocks it.
func (e *Engine) unlock(w *worker) {
	w.out = nil
	w.components(func(_ Tier, c *worker) { c.out = nil })
	w.unlockMu()
}

// lockLive locks the live worker named name (creating it when create is set), lends it
// out, and returns it, or nil when there is none. hint, when not nil, is the worker the
// name named a moment ago (ApplyBatch keeps a few): it spares the name lookup. It
// retries when it races with RemoveWorker.
func (e *Engine) lockLive(name string, create bool, hint *worker, out *outbox) *worker {
	for {
		w := hint
		hint = nil
		if w == nil {
			if create {
				w = e.lookupOrCreate(name)
			} else if w = e.lookup(name); w == nil {
				return nil
			}
		}
		w.lockMu()
		if !w.dead {
			w.out = out
			w.components(func(_ Tier, c *worker) { c.out = out })
			return w
		}
		w.unlockMu()
	}
}

// Store applies a stored event for a chain of root blocks: blocks[0] is at position 0
// and each next block hangs under the previous one.
func (e *Engine) Store(worker string, blocks []Block) error {
	return e.Apply(&Event{Kind: EventStored, Worker: worker, Blocks: blocks})
}

// StoreUnder applies a stored event whose first block hangs under the block the worker
// holds as parent. It returns ErrParentNotFound, and changes nothing, if the worker does
// not hold parent.
func (e *Engine) StoreUnder(worker string, parent uint64, blocks []Block) error {
	return e.Apply(&Event{Kind: EventStored, Worker: worker, Parent: parent, HasParent: true, Blocks: blocks})
}

// Remove drops the given engine hashes from a worker. Hashes it does not hold, and an
// unknown worker, are skipped and counted in Stats.SkippedRemovals.
func (e *Engine) Remove(worker string, seqs ...uint64) error {
	return e.Apply(&Event{Kind: EventRemoved, Worker: worker, Seqs: seqs})
}

// Clear drops every block of a worker; it stays known with size 0. An unknown worker is a
// no-op.
func (e *Engine) Clear(worker string) error {
	return e.Apply(&Event{Kind: EventCleared, Worker: worker})
}

// RemoveWorker forgets a worker and all its blocks. An unknown worker is a no-op.
func (e *Engine) RemoveWorker(worker string) error {
	return e.Apply(&Event{Kind: EventRemoveWorker, Worker: worker})
}

// EventKind names the kind of an Event.
type EventKind uint8

// The event kinds.
const (
	EventStored EventKind = iota + 1
	EventRemoved
	EventCleared
	EventRemoveWorker
	// EventCopied says that the worker now holds, on the event's tier (host or disk),
	// copies of the blocks it holds on another tier under the event's Seqs: what an
	// engine that offloads publishes when it names blocks by engine hash only (vLLM's
	// offloading connector sends no token ids and no parent). Each copy takes the
	// position and prefix of the block it copies, from the fastest other tier that
	// holds the seq; a seq no other tier holds is skipped (Stats.SkippedCopies) unless
	// the event's tier already holds it.
	EventCopied
	// EventGroups declares a hybrid model's KV-cache groups (Event.Unit, Event.Groups;
	// groups.go): the worker becomes known, every block it held is dropped, and its
	// stored, removed and copied events then name a group (Event.Group). A declaration
	// of one full group whose block size is the unit is what an undeclared worker is.
	EventGroups
)

// Event is any engine event, for ingesters that decode events generically.
type Event struct {
	Kind   EventKind
	Worker string
	// Namespace separates prefix trees (LoRA adapters, cache salts): blocks stored in one
	// namespace never match queries in another. "" is the default namespace, the one
	// Store, StoreUnder and FindMatches use. Stored events only; a parent must be held in
	// the same namespace.
	Namespace string
	Parent    uint64
	HasParent bool
	Blocks    []Block  // EventStored
	Seqs      []uint64 // EventRemoved, EventCopied
	// Tier is the tier a stored or removed event is about (the zero value is the device
	// tier). A worker's tiers hold independent copies: a removal drops the copies on its
	// tier only, and a store's parent is looked up on its tier first, then on the others,
	// fastest first. Cleared and RemoveWorker cover every tier and take no Tier.
	Tier Tier
	// Group is the KV-cache group a stored, removed or copied event is about (0, the
	// only group of a worker that declared none, by default); see EventGroups.
	Group int
	// Contents, for a stored event of a group whose block size spans several units,
	// holds each block's content hashes, span values a block, in order (Blocks[i]'s
	// Content is then unused). nil for a span of one unit.
	Contents []uint64
	// Unit and Groups are an EventGroups declaration: the index's block size in tokens
	// and the model's groups, in group order.
	Unit   int
	Groups []Group
	// Cursor, when not zero, is the event's position in its worker's event stream (for
	// example the publisher's sequence number). The engine records the last one applied
	// per worker, under the same lock as the worker's state, so a snapshot knows where
	// each worker's stream must resume. Events that do not exist in the stream keep 0.
	// A clear or a worker's removal sets the position whatever its Cursor: the worker's
	// history starts over there, so a made-up clear (Cursor 0) leaves the worker with no
	// position to resume from (Position.Cursor 0).
	Cursor uint64
	// Mark is an opaque word kept with Cursor, set whenever the cursor is: what the
	// event's source needs, beside the cursor, to resume the worker's stream there (a
	// ZeroMQ subscriber keeps its batch's digest and whether the index is exact).
	Mark uint64
}

// Position is where a worker stands in its event stream: the Cursor and Mark of the
// last event applied to it that carried a cursor, or of its last clear.
type Position struct {
	Cursor, Mark uint64
}

// setPosition records ev's position in w (locked), as Event.Cursor says.
func (w *worker) setPosition(ev *Event) {
	if ev.Cursor != 0 || ev.Kind == EventCleared || ev.Kind == EventRemoveWorker {
		w.cursor, w.mark = ev.Cursor, ev.Mark
	}
}

// Apply applies one event. Every event method goes through it.
func (e *Engine) Apply(ev *Event) error {
	apply, err := e.check(ev)
	if !apply {
		return err
	}
	out := e.getOutbox()
	defer e.outboxes.Put(out)
	w, err := e.lockFor(ev, nil, out)
	if w == nil {
		return err
	}
	gone, err := e.applyLocked(w, ev)
	if !gone {
		if invariants.Enabled {
			w.mustCheck(e, false)
		}
		if ferr := w.flush(e); err == nil {
			err = ferr
		}
	}
	e.unlock(w)
	e.maybeSweepNamespaces()
	return err
}

// ApplyBatch applies evs in order and appends one error per event (nil when accepted) to
// errs. Consecutive events of one worker are applied under one acquisition of its lock
// and their index changes are handed to the shards together (every maxPending deltas
// at the latest): this is how an ingester should apply an engine's event batch. The
// answers are those of applying each event with Apply.
func (e *Engine) ApplyBatch(evs []Event, errs []error) []error {
	out := e.getOutbox()
	defer e.outboxes.Put(out)
	// recent remembers the last workers the batch locked: an engine's batch interleaves
	// few workers, and a name compare is cheaper than a lookup in the name table.
	var recent [4]*worker
	next := 0
	var w *worker
	release := func() {
		if w == nil {
			return
		}
		if err := w.flush(e); err != nil && errs[len(errs)-1] == nil {
			errs[len(errs)-1] = err
		}
		e.unlock(w)
		w = nil
	}
	for k := range evs {
		ev := &evs[k]
		if w != nil && w.name != ev.Worker {
			release()
		}
		apply, err := e.check(ev)
		if apply && w == nil {
			var hint *worker
			for _, r := range recent {
				if r != nil && r.name == ev.Worker {
					hint = r
					break
				}
			}
			if w, err = e.lockFor(ev, hint, out); w != nil && w != hint {
				recent[next%len(recent)] = w
				next++
			}
		}
		if apply && w != nil {
			var gone bool
			gone, err = e.applyLocked(w, ev)
			if invariants.Enabled && !gone {
				w.mustCheck(e, false)
			}
			switch {
			case gone:
				e.unlock(w) // flushed already
				w = nil
			case err == nil && out.npend >= maxPending:
				err = w.flush(e)
			}
		}
		errs = append(errs, err)
	}
	release()
	e.maybeSweepNamespaces()
	return errs
}

// check rejects what needs no worker state and reports whether ev must be applied: not
// after Close, not with an empty worker id or more blocks or seqs than
// Config.MaxEventBlocks, not an unknown kind; a store without blocks is a no-op.
func (e *Engine) check(ev *Event) (apply bool, err error) {
	if e.closed.Load() {
		return false, e.err()
	}
	bad := func(format string, args ...any) (bool, error) {
		e.rejInvalid.Add(1)
		return false, fmt.Errorf("%w: %s", ErrInvalidEvent, fmt.Sprintf(format, args...))
	}
	switch {
	case ev.Worker == "":
		return bad("empty worker id")
	case len(ev.Worker) > MaxWorkerLen:
		return bad("worker id of %d bytes (limit %d)", len(ev.Worker), MaxWorkerLen)
	case len(ev.Namespace) > MaxNamespaceLen && ev.Kind == EventStored:
		return bad("namespace of %d bytes (limit %d)", len(ev.Namespace), MaxNamespaceLen)
	case ev.Kind < EventStored || ev.Kind > EventGroups:
		return bad("unknown event kind %d", ev.Kind)
	case len(ev.Contents) > e.cfg.MaxEventBlocks:
		return bad("%d content hashes in one event (limit %d)", len(ev.Contents), e.cfg.MaxEventBlocks)
	case ev.Group < 0:
		return bad("group %d", ev.Group)
	case ev.Kind == EventGroups:
		if ev.Tier != TierDevice {
			return bad("a groups declaration covers every tier and takes none (got %s)", ev.Tier)
		}
		if _, err := validateGroups(ev.Unit, ev.Groups); err != nil {
			return bad("%v", err)
		}
	case len(ev.Blocks) > e.cfg.MaxEventBlocks:
		return bad("%d blocks in one event (limit %d)", len(ev.Blocks), e.cfg.MaxEventBlocks)
	case len(ev.Seqs) > e.cfg.MaxEventBlocks:
		return bad("%d seqs in one event (limit %d)", len(ev.Seqs), e.cfg.MaxEventBlocks)
	case ev.Tier >= NumTiers:
		return bad("unknown tier %d", ev.Tier)
	case ev.Tier != TierDevice && (ev.Kind == EventCleared || ev.Kind == EventRemoveWorker):
		return bad("a cleared or remove_worker event covers every tier and takes none (got %s)", ev.Tier)
	case ev.Kind == EventCopied && ev.Tier == TierDevice:
		return bad("a copied event names the tier its copies land on, host or disk")
	case ev.Kind == EventStored && len(ev.Blocks) == 0:
		return false, nil // whatever the parent, and an unknown worker stays unknown
	}
	return true, nil
}

// lockFor returns ev's worker, locked, or nil when there is none to apply it to (with
// the event's outcome). Only a valid root store makes an unknown worker known, so such a
// store is checked here before the worker exists (and again, like every store, by
// storeLocked: once per worker, not worth a flag).
func (e *Engine) lockFor(ev *Event, hint *worker, out *outbox) (w *worker, err error) {
	if w = e.lockLive(ev.Worker, false, hint, out); w != nil {
		return w, nil
	}
	switch ev.Kind {
	case EventGroups:
		return e.lockLive(ev.Worker, true, nil, out), nil
	case EventStored:
		if ev.Group != 0 || ev.Contents != nil {
			e.rejInvalid.Add(1)
			return nil, fmt.Errorf("%w: worker %q is unknown, so it has declared no groups", ErrInvalidEvent, strings.Clone(ev.Worker))
		}
		if ev.HasParent {
			e.rejParent.Add(1)
			return nil, fmt.Errorf("%w: worker %q is unknown", ErrParentNotFound, strings.Clone(ev.Worker))
		}
		probe := worker{out: out}
		if !probe.validateStore(&e.seed, 0, false, ev.Blocks) {
			e.rejInvalid.Add(1)
			return nil, fmt.Errorf("%w: a seq appears twice in one event", ErrInvalidEvent)
		}
		return e.lockLive(ev.Worker, true, nil, out), nil
	case EventRemoved:
		e.skippedRemovals.Add(uint64(len(ev.Seqs)))
	case EventCopied:
		e.skippedCopies.Add(uint64(len(ev.Seqs)))
	}
	if e.preds.live.Load() != 0 {
		e.predictionsFor(ev) // a worker known only through predictions
	}
	return nil, nil
}

// applyLocked applies a checked event to w, which the caller has locked and unlocks; its
// deltas stay in w.out until the caller flushes. gone says the event forgot the worker,
// which is then flushed already (its lock is still held). While the engine holds
// predictions, the event also ends those it covers or contradicts (predict.go).
func (e *Engine) applyLocked(w *worker, ev *Event) (gone bool, err error) {
	w.owner.Check("worker event")
	if groupedEvent(w, ev) {
		return e.applyGrouped(w, ev) // groups.go
	}
	return e.applyPlain(w, ev)
}

// applyPlain is applyLocked for a worker without groups.
func (e *Engine) applyPlain(w *worker, ev *Event) (gone bool, err error) {
	if e.preds.live.Load() != 0 {
		return e.predictedEvent(w, ev)
	}
	return e.applyEvent(w, ev)
}

// applyEvent is applyLocked without the predictions.
func (e *Engine) applyEvent(w *worker, ev *Event) (gone bool, err error) {
	w.setPosition(ev)
	switch ev.Kind {
	case EventStored:
		ns, err := e.eventNamespace(ev.Namespace)
		if err != nil {
			return false, err
		}
		return false, e.storeLocked(w, ns, ev)
	case EventRemoved:
		if c := e.tierOf(w, ev.Tier, false); c != nil {
			w.out.skipped += uint64(c.remove(e, ev.Seqs))
		} else {
			w.out.skipped += uint64(len(ev.Seqs))
		}
	case EventCopied:
		e.skippedCopies.Add(uint64(e.copyLocked(w, ev.Tier, ev.Seqs)))
	case EventCleared:
		w.clearTiers(e)
	case EventRemoveWorker:
		w.clearTiers(e)
		w.out.events++
		err = w.flush(e)
		w.dead = true
		e.unregister(w)
		return true, err
	}
	w.out.events++
	return false, nil
}

// storeLocked applies a stored event to w (locked). The parent is resolved first, so an
// event faulty in both ways reports ErrParentNotFound.
// The parent may live on another tier than the event's (Event.Tier).
func (e *Engine) storeLocked(w *worker, ns uint32, ev *Event) error {
	var p parentRef
	var holder *worker
	if ev.HasParent {
		h, rid, ok := e.parentOf(w, ev.Tier, ev.Parent)
		if !ok || h.keys.ns(rid) != ns {
			e.rejParent.Add(1)
			return fmt.Errorf("%w: worker %q does not hold %d in this namespace", ErrParentNotFound, w.name, ev.Parent)
		}
		pos := h.keys.pos(rid)
		holder, p = h, parentRef{has: true, prefix: h.keys.recs[rid].prefix(), pos: pos, ref: rid + 1}
		if uint64(pos)+uint64(len(ev.Blocks)) >= MaxDepth {
			e.rejInvalid.Add(1)
			return fmt.Errorf("%w: chain deeper than %d blocks", ErrInvalidEvent, MaxDepth)
		}
	}
	if !w.validateStore(&e.seed, ev.Parent, ev.HasParent, ev.Blocks) {
		e.rejInvalid.Add(1)
		return fmt.Errorf("%w: a seq appears twice in one event or equals the parent", ErrInvalidEvent)
	}
	t := e.tierOf(w, ev.Tier, true)
	if holder != t {
		p.ref = 0 // the parent's record is in another tier's table: addKey finds or makes it
	}
	t.store(e, ns, p, ev.Blocks)
	w.out.events++
	return nil
}
