package engine

import (
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/kvindex/kvindex/ringbuf"
)

// Block is one stored block: its content hash (see package hash) and the engine's opaque
// hash for it (vLLM's and SGLang's block hash, called seq in the op log).
type Block struct {
	Content uint64
	Seq     uint64
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
// each shard's state at some moment during the query.
type Engine struct {
	cfg    Config
	shards []*shardLoop

	closed atomic.Bool
	done   chan struct{} // closed by Close or by a failed shard
	once   sync.Once
	failed atomic.Pointer[error]
	wg     sync.WaitGroup

	// registry of workers: byName maps a name to its *worker; slots maps a worker id to
	// its *worker (nil for a free id) and is replaced copy-on-write under regMu, so
	// queries read it without a lock.
	byName sync.Map
	regMu  sync.Mutex
	slots  atomic.Pointer[[]*worker]
	free   []uint32
	nlive  atomic.Int64

	blocks atomic.Int64

	// namespaces interns prefix-namespace names to ids; "" is id 0 and never stored.
	namespaces sync.Map // string -> uint32
	nsNext     atomic.Uint32

	events          atomic.Uint64
	rejParent       atomic.Uint64
	rejInvalid      atomic.Uint64
	skippedRemovals atomic.Uint64
	queries         atomic.Uint64
	abandoned       atomic.Uint64

	qpool    sync.Pool
	barriers sync.Pool

	// onDelta and onProbe, when set (by tests, before any call), observe every index
	// delta and every query probe; the partition measurement uses them.
	onDelta, onProbe func(key)

	// locked guards shards[0].idx when cfg.LockedIndex is set (the benchmark baseline).
	locked sync.RWMutex
}

// New validates cfg, starts the shard goroutines and returns the engine.
func New(cfg Config) (*Engine, error) {
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	e := &Engine{cfg: cfg, done: make(chan struct{})}
	empty := []*worker{}
	e.slots.Store(&empty)
	e.shards = make([]*shardLoop, cfg.Shards)
	for i := range e.shards {
		r, err := ringbuf.New[delta](cfg.QueueSize)
		if err != nil {
			return nil, fmt.Errorf("%w: %v", ErrInvalidConfig, err)
		}
		e.shards[i] = newShardLoop(e, i, r)
	}
	if cfg.LockedIndex {
		return e, nil
	}
	for _, s := range e.shards {
		e.wg.Add(1)
		go s.run()
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
			s.ring.Close()
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
	return int(w.size.Load()), true
}

// setCursor records a worker's stream position, for a live worker only: an event that
// does not make its worker known has no state to resume.
func (e *Engine) setCursor(name string, c uint64) {
	if w := e.lockLive(name, false); w != nil {
		w.cursor = c
		w.mu.Unlock()
	}
}

// lookup returns the live worker named name, or nil.
func (e *Engine) lookup(name string) *worker {
	if v, ok := e.byName.Load(name); ok {
		return v.(*worker)
	}
	return nil
}

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
	old := *e.slots.Load()
	var wid uint32
	if n := len(e.free); n > 0 {
		wid = e.free[n-1]
		e.free = e.free[:n-1]
	} else {
		wid = uint32(len(old))
	}
	slots := make([]*worker, max(len(old), int(wid)+1))
	copy(slots, old)
	w := &worker{name: name, wid: wid, pend: make([][]delta, len(e.shards))}
	slots[wid] = w
	e.slots.Store(&slots)
	e.byName.Store(name, w)
	e.nlive.Add(1)
	return w
}

// unregister forgets w; its id may be reused by the next new worker. Its removal deltas
// are already in the rings, ahead of anything a reuse of the id can push.
func (e *Engine) unregister(w *worker) {
	e.regMu.Lock()
	defer e.regMu.Unlock()
	e.byName.CompareAndDelete(w.name, w)
	old := *e.slots.Load()
	slots := make([]*worker, len(old))
	copy(slots, old)
	slots[w.wid] = nil
	e.slots.Store(&slots)
	e.free = append(e.free, w.wid)
	e.nlive.Add(-1)
}

// lockLive locks the live worker named name (creating it when create is set) and
// returns it, or nil when there is none. It retries when it races with RemoveWorker.
func (e *Engine) lockLive(name string, create bool) *worker {
	for {
		var w *worker
		if create {
			w = e.lookupOrCreate(name)
		} else if w = e.lookup(name); w == nil {
			return nil
		}
		w.mu.Lock()
		if !w.dead {
			return w
		}
		w.mu.Unlock()
	}
}

// Store applies a stored event for a chain of root blocks: blocks[0] is at position 0
// and each next block hangs under the previous one.
func (e *Engine) Store(worker string, blocks []Block) error {
	return e.store(worker, 0, 0, false, blocks)
}

// StoreUnder applies a stored event whose first block hangs under the block the worker
// holds as parent. It returns ErrParentNotFound, and changes nothing, if the worker does
// not hold parent.
func (e *Engine) StoreUnder(worker string, parent uint64, blocks []Block) error {
	return e.store(worker, 0, parent, true, blocks)
}

// EventKind names the kind of an Event.
type EventKind uint8

// The event kinds.
const (
	EventStored EventKind = iota + 1
	EventRemoved
	EventCleared
	EventRemoveWorker
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
	Seqs      []uint64 // EventRemoved
	// Cursor, when not zero, is the event's position in its worker's event stream (for
	// example the publisher's sequence number). The engine records the last one applied
	// per worker, under the same lock as the worker's state, so a snapshot knows where
	// each worker's stream must resume. Events that do not exist in the stream keep 0.
	Cursor uint64
}

// Apply applies one event. It is equivalent to the method of the event's kind.
func (e *Engine) Apply(ev *Event) error {
	err := e.apply(ev)
	if ev.Cursor != 0 && !e.closed.Load() {
		e.setCursor(ev.Worker, ev.Cursor)
	}
	return err
}

func (e *Engine) apply(ev *Event) error {
	switch ev.Kind {
	case EventStored:
		ns := uint32(0)
		if ev.Namespace != "" && len(ev.Blocks) > 0 {
			ns = e.namespaceID(ev.Namespace, true)
		}
		return e.store(ev.Worker, ns, ev.Parent, ev.HasParent, ev.Blocks)
	case EventRemoved:
		return e.Remove(ev.Worker, ev.Seqs...)
	case EventCleared:
		return e.Clear(ev.Worker)
	case EventRemoveWorker:
		return e.RemoveWorker(ev.Worker)
	}
	e.rejInvalid.Add(1)
	return fmt.Errorf("%w: unknown event kind %d", ErrInvalidEvent, ev.Kind)
}

// namespaceID returns the id of a non-empty namespace name, interning it when create is
// set; 0 with create unset means the namespace has never been stored into.
func (e *Engine) namespaceID(name string, create bool) uint32 {
	if v, ok := e.namespaces.Load(name); ok {
		return v.(uint32)
	}
	if !create {
		return 0
	}
	e.regMu.Lock()
	defer e.regMu.Unlock()
	if v, ok := e.namespaces.Load(name); ok {
		return v.(uint32)
	}
	id := e.nsNext.Add(1)
	e.namespaces.Store(name, id)
	return id
}

func (e *Engine) store(name string, ns uint32, parent uint64, hasParent bool, blocks []Block) error {
	if e.closed.Load() {
		return e.err()
	}
	if name == "" {
		e.rejInvalid.Add(1)
		return fmt.Errorf("%w: empty worker id", ErrInvalidEvent)
	}
	if len(blocks) == 0 {
		return nil
	}
	if len(blocks) > e.cfg.MaxEventBlocks {
		e.rejInvalid.Add(1)
		return fmt.Errorf("%w: %d blocks in one event (limit %d)", ErrInvalidEvent, len(blocks), e.cfg.MaxEventBlocks)
	}
	// An event with a parent can only apply to a worker that exists; a root event may
	// create the worker, but only once it has been validated.
	w := e.lockLive(name, false)
	if w == nil && hasParent {
		e.rejParent.Add(1)
		return fmt.Errorf("%w: worker %q is unknown", ErrParentNotFound, name)
	}
	if w == nil {
		var probe worker
		if !probe.validateStore(parent, hasParent, blocks) {
			e.rejInvalid.Add(1)
			return fmt.Errorf("%w: a seq appears twice in one event", ErrInvalidEvent)
		}
		w = e.lockLive(name, true)
	}
	defer w.mu.Unlock()
	if err := e.storeLocked(w, ns, parent, hasParent, blocks); err != nil {
		return err
	}
	return w.flush(e)
}

// storeLocked applies a stored event whose stateless checks passed to w, which the
// caller has locked; the deltas stay in w.pend until the caller flushes.
func (e *Engine) storeLocked(w *worker, ns uint32, parent uint64, hasParent bool, blocks []Block) error {
	var at key
	if hasParent {
		k, ok := w.seqs.get(parent)
		if !ok || k.ns != ns {
			e.rejParent.Add(1)
			return fmt.Errorf("%w: worker %q does not hold %d in this namespace", ErrParentNotFound, w.name, parent)
		}
		at = k
		if uint64(at.pos)+uint64(len(blocks)) >= MaxDepth {
			e.rejInvalid.Add(1)
			return fmt.Errorf("%w: chain deeper than %d blocks", ErrInvalidEvent, MaxDepth)
		}
	}
	if !w.validateStore(parent, hasParent, blocks) {
		e.rejInvalid.Add(1)
		if hasParent {
			return fmt.Errorf("%w: a seq appears twice in one event or equals the parent", ErrInvalidEvent)
		}
		return fmt.Errorf("%w: a seq appears twice in one event", ErrInvalidEvent)
	}
	w.store(e, ns, at, hasParent, blocks)
	e.events.Add(1)
	return nil
}

// ApplyBatch applies evs in order and appends one error per event (nil when accepted) to
// errs. Consecutive events of one worker are applied under one acquisition of its lock
// and their index changes are handed to the shards together: this is how an ingester
// should apply an engine's event batch. The answers are those of applying each event
// with Apply.
func (e *Engine) ApplyBatch(evs []Event, errs []error) []error {
	for i := 0; i < len(evs); {
		j := i + 1
		for j < len(evs) && evs[j].Worker == evs[i].Worker {
			j++
		}
		errs = e.applyRun(evs[i:j], errs)
		i = j
	}
	return errs
}

// applyRun applies events of one worker.
func (e *Engine) applyRun(evs []Event, errs []error) []error {
	var w *worker
	for k := range evs {
		ev := &evs[k]
		if w == nil {
			if ev.Worker != "" && !e.closed.Load() {
				w = e.lockLive(ev.Worker, false)
			}
			if w == nil {
				// No live worker (or a bad id, or closed): the single-event path decides,
				// and creates the worker for a valid root store.
				errs = append(errs, e.Apply(ev))
				continue
			}
		}
		var err error
		if ev.Cursor != 0 {
			w.cursor = ev.Cursor
		}
		switch ev.Kind {
		case EventStored:
			switch {
			case len(ev.Blocks) == 0:
			case len(ev.Blocks) > e.cfg.MaxEventBlocks:
				e.rejInvalid.Add(1)
				err = fmt.Errorf("%w: %d blocks in one event (limit %d)", ErrInvalidEvent, len(ev.Blocks), e.cfg.MaxEventBlocks)
			default:
				ns := uint32(0)
				if ev.Namespace != "" {
					ns = e.namespaceID(ev.Namespace, true)
				}
				err = e.storeLocked(w, ns, ev.Parent, ev.HasParent, ev.Blocks)
			}
		case EventRemoved:
			if len(ev.Seqs) > e.cfg.MaxEventBlocks {
				e.rejInvalid.Add(1)
				err = fmt.Errorf("%w: %d seqs in one event (limit %d)", ErrInvalidEvent, len(ev.Seqs), e.cfg.MaxEventBlocks)
				break
			}
			e.skippedRemovals.Add(uint64(w.remove(e, ev.Seqs)))
			e.events.Add(1)
		case EventCleared:
			w.clear(e)
			e.events.Add(1)
		case EventRemoveWorker:
			w.clear(e)
			e.events.Add(1)
			err = w.flush(e)
			w.dead = true
			e.unregister(w)
			w.mu.Unlock()
			w = nil
		default:
			e.rejInvalid.Add(1)
			err = fmt.Errorf("%w: unknown event kind %d", ErrInvalidEvent, ev.Kind)
		}
		if w != nil && w.npend >= maxPending && err == nil {
			err = w.flush(e)
		}
		errs = append(errs, err)
	}
	if w != nil {
		if err := w.flush(e); err != nil && errs[len(errs)-1] == nil {
			errs[len(errs)-1] = err
		}
		w.mu.Unlock()
	}
	return errs
}

// Remove drops the given engine hashes from a worker. Hashes it does not hold, and an
// unknown worker, are skipped and counted in Stats.SkippedRemovals.
func (e *Engine) Remove(worker string, seqs ...uint64) error {
	if e.closed.Load() {
		return e.err()
	}
	if worker == "" {
		e.rejInvalid.Add(1)
		return fmt.Errorf("%w: empty worker id", ErrInvalidEvent)
	}
	if len(seqs) > e.cfg.MaxEventBlocks {
		e.rejInvalid.Add(1)
		return fmt.Errorf("%w: %d seqs in one event (limit %d)", ErrInvalidEvent, len(seqs), e.cfg.MaxEventBlocks)
	}
	w := e.lockLive(worker, false)
	if w == nil {
		e.skippedRemovals.Add(uint64(len(seqs)))
		return nil
	}
	defer w.mu.Unlock()
	e.skippedRemovals.Add(uint64(w.remove(e, seqs)))
	e.events.Add(1)
	return w.flush(e)
}

// Clear drops every block of a worker; it stays known with size 0. An unknown worker is a
// no-op.
func (e *Engine) Clear(worker string) error {
	return e.clearWorker(worker, false)
}

// RemoveWorker forgets a worker and all its blocks. An unknown worker is a no-op.
func (e *Engine) RemoveWorker(worker string) error {
	return e.clearWorker(worker, true)
}

func (e *Engine) clearWorker(name string, forget bool) error {
	if e.closed.Load() {
		return e.err()
	}
	if name == "" {
		e.rejInvalid.Add(1)
		return fmt.Errorf("%w: empty worker id", ErrInvalidEvent)
	}
	w := e.lockLive(name, false)
	if w == nil {
		return nil
	}
	defer w.mu.Unlock()
	w.clear(e)
	e.events.Add(1)
	err := w.flush(e)
	if forget {
		w.dead = true
		e.unregister(w)
	}
	return err
}
