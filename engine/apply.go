package engine

import (
	"fmt"
	"strings"
	"unsafe"

	"github.com/kvindex/kvindex/engine/internal/worker"
	"github.com/kvindex/kvindex/internal/invariants"
)

// The events protocol: a worker's events are applied under its mutex (lockFor,
// lockLive), on the caller's goroutine, into the worker's bookkeeping (package
// engine/internal/worker; groups.go for the declared groups' rules; the predictions'
// hooks in predict.go), and the membership changes they make leave at flush for the
// shards' rings (or, on the locked index, for the table itself under the engine's write
// lock), in event order per worker. Every function here runs on an event caller's
// goroutine; the ones that take a *worker.Worker are called with its mutex held (the
// holder owns the worker), and none takes the worker's mutex after the prediction
// table's.

// getOutbox takes a scratch for locked workers from the pool.
func (e *Engine) getOutbox() *worker.Outbox {
	if o, _ := e.outboxes.Get().(*worker.Outbox); o != nil {
		return o
	}
	return worker.NewOutbox(len(e.shards))
}

// unlock takes back the outbox of a worker locked by lockLive (flushed, so empty) and
// unlocks it.
func (e *Engine) unlock(w *worker.Worker) {
	if !e.cfg.LockedIndex {
		w.SetOutbox(nil)
		w.Unlock()
		return
	}
	run := w.Outbox().Run
	w.SetOutbox(nil)
	w.Disown()
	if run {
		w.SetBusy(false)
	}
	e.locked.Unlock()
	if run {
		w.UnlockMu()
	}
}

// lockWorker gives the caller w's bookkeeping to read outside events (digests,
// snapshots, positions, tiers and groups of a query's answer): w's mutex and, on the
// locked index, whose single events' appliers own a worker by its write lock alone
// (lockLive), its read lock as well. Not for a caller that holds the read lock.
func (e *Engine) lockWorker(w *worker.Worker) {
	w.LockMu()
	if e.cfg.LockedIndex {
		e.locked.RLock()
	}
	w.Own()
}

// unlockWorker undoes lockWorker.
func (e *Engine) unlockWorker(w *worker.Worker) {
	w.Disown()
	if e.cfg.LockedIndex {
		e.locked.RUnlock()
	}
	w.UnlockMu()
}

// The engine's Block is the worker package's: the conversion below compiles only while
// the two structs are identical, so blocksOf may view one slice as the other.
var _ = worker.Block(Block{})

// blocksOf views an event's blocks as the worker package's, without copying.
func blocksOf(b []Block) []worker.Block {
	return unsafe.Slice((*worker.Block)(unsafe.Pointer(unsafe.SliceData(b))), len(b))
}

// pendShards bounds the deltas a worker holds back from the shards during a run of
// events (ApplyBatch) before it hands them over: small, so that the shards apply a
// run's first deltas while its caller still applies the rest (a run that handed
// everything over at its end left the shards idle during the run and its caller waiting
// for them after it: the conversation log's ordered replay at two shards, 156 events
// between two barriers: 1,024 gave 6.2M block ops/s, 128 gave 7.0M, and 7.8M with the
// shards' longer poll, shard.spinPolls). The locked index applies its deltas when it
// lets the write lock go (yieldLocked, or the run's end): nothing runs beside the
// caller, and its deltas are few (the head positions and the anchors only).
const pendShards = 128

// yieldLocked is how many block changes of a run of one worker's events (ApplyBatch)
// the locked index's write lock is held for before the waiting queries are let in: its
// appliers change a worker's tables under it, about 0.1 us a block, and each letting-in
// waits for the queries it lets in. On the conversation trace under
// BenchmarkQueriesUnderIngest (three runs each, the same minutes), query p99 / p99.9 and
// events applied meanwhile: 64: 41-45 / 72-85 us, 2.0M/s; 256: 53-56 / 85-110 us,
// 2.6-2.7M/s; 1,024: 73-98 / 125-143 us, 3.0-3.3M/s; the layout with an index entry per
// block, which took the write lock for the deltas alone every 1,024 of them: 44-64 /
// 139-152 us, 1.7-1.9M/s.
const yieldLocked = 256

// keepPending is the buffer capacity per shard an outbox keeps after a flush: a huge
// event's deltas go out in one push, and its buffer is not kept.
const keepPending = 4096

// flush hands the deltas of w's events to the shard rings and publishes its gap flags
// and counters (worker.Worker.Publish). Called with w's mutex held, so one worker's
// deltas enter each ring in event order.
func (e *Engine) flush(w *worker.Worker) error {
	w.CheckOwner("worker flush")
	o := w.Outbox()
	if e.cfg.LockedIndex && !e.hooks.dropDeltas {
		// The locked index takes the flags with the deltas, under the write lock that
		// the caller holds since it locked w (lockLive): a query reads them under the
		// read lock, so it sees a worker's gap flag, its memberships and its tables of
		// one moment. gallop trusts a gap-free flag for every position; published
		// before the deltas, a flag cleared by an event that fills a hole would meet
		// the index with the hole still in it.
		e.shards[0].ApplyLocked(o.Pend[0]) // (most removals change no key of the sparse index)
		w.Publish(&e.env)
		handedOver(o, 0)
		o.Pending = 0
	} else {
		w.Publish(&e.env)
	}
	if invariants.Enabled {
		w.MustCheck(&e.env, true)
	}
	if e.cfg.LockedIndex {
		// Under the write lock: plain words (Stats reads them under the read lock).
		e.lockedEvents += o.Events
		e.lockedSkipped += o.Skipped
		o.Events, o.Skipped = 0, 0
	} else {
		if o.Events != 0 {
			e.events.Add(o.Events)
			o.Events = 0
		}
		if o.Skipped != 0 {
			e.skippedRemovals.Add(o.Skipped)
			o.Skipped = 0
		}
	}
	if e.hooks.dropDeltas {
		for s := range o.Pend {
			handedOver(o, s)
		}
		o.Pending = 0
		return nil
	}
	if e.cfg.LockedIndex {
		return nil
	}
	var err error
	for s := range o.Pend {
		if len(o.Pend[s]) == 0 {
			continue
		}
		if _, perr := e.shards[s].Ring().PushBatch(o.Pend[s]); perr != nil && err == nil {
			// A ring fails a push only once Close (or a failed shard) has closed it: the
			// caller gets the engine's reason, as from every other call.
			err = e.err()
		}
		handedOver(o, s)
	}
	o.Pending = 0
	return err
}

// handedOver empties o's delta buffer for shard s, whose deltas are applied: a huge
// event's buffer is not kept (keepPending), on any index. Deltas hold no pointers:
// nothing to clear.
func handedOver(o *worker.Outbox, s int) {
	o.Pend[s] = o.Pend[s][:0]
	if cap(o.Pend[s]) > keepPending {
		o.Pend[s] = nil
	}
}

// lockLive locks the live worker named name (creating it when create is set), lends it
// out, and returns it, or nil when there is none. hint, when not nil, is the worker the
// name named a moment ago (ApplyBatch keeps a few): it spares the name lookup. It
// retries when it races with RemoveWorker.
func (e *Engine) lockLive(name string, create bool, hint *worker.Worker, out *worker.Outbox) *worker.Worker {
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
		if e.cfg.LockedIndex {
			switch l := e.lockLocked(w, out); l {
			case lockedDead:
				continue
			case lockedBusy:
				hint = w // (its run is over: try it again)
				continue
			}
			return w
		}
		w.Lock()
		if !w.Dead() {
			w.SetOutbox(out)
			return w
		}
		w.Unlock()
	}
}

// lockLocked locks w on the locked index, whose queries read the tables of the
// workers they score under its read lock (walkSparse): a worker's tables change under
// the write lock, which e.unlock lets go. A single event owns its worker by the write
// lock alone, without the worker's mutex (two atomic operations an event: on the
// conversation trace, bench's BenchmarkEvents, locked, eight alternating runs, min /
// median 191.8 / 199 -> 184.9 / 191.5 ns an event). A run of events (out.Run,
// ApplyBatch) lets the write lock go to waiting queries every yieldLocked block
// changes, so it also holds the worker's mutex, which readers outside events take
// (lockWorker), and marks the worker busy for its run; a single event that finds its
// worker busy lets the write lock go and waits on the worker's mutex for the run's end
// (lockedBusy). A removed worker (lockedDead) is looked up again by name.
func (e *Engine) lockLocked(w *worker.Worker, out *worker.Outbox) lockedResult {
	if out.Run {
		w.LockMu()
	}
	e.locked.Lock()
	switch {
	case w.Dead():
		e.locked.Unlock()
		if out.Run {
			w.UnlockMu()
		}
		return lockedDead
	case !out.Run && w.Busy():
		e.locked.Unlock()
		w.LockMu()
		w.UnlockMu()
		return lockedBusy
	}
	if out.Run {
		w.SetBusy(true)
	}
	w.Own()
	w.SetOutbox(out)
	return lockedOK
}

// lockedResult is lockLocked's outcome.
type lockedResult uint8

const (
	lockedOK   lockedResult = iota // w is locked
	lockedDead                     // w was removed: look the name up again
	lockedBusy                     // a run of events held w; it is over: try again
)

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
func setPosition(w *worker.Worker, ev *Event) {
	if ev.Cursor != 0 || ev.Kind == EventCleared || ev.Kind == EventRemoveWorker {
		w.SetPosition(ev.Cursor, ev.Mark)
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
	return e.applyWith(out, ev)
}

// applyWith is Apply of a checked event with out, the caller's outbox: its Last worker
// spares the name lookup when ev is that worker's.
func (e *Engine) applyWith(out *worker.Outbox, ev *Event) error {
	hint := out.Last
	if hint != nil && hint.Name() != ev.Worker {
		hint = nil
	}
	w, err := e.lockFor(ev, hint, out)
	if w == nil {
		return err
	}
	out.Last = w
	gone, err := e.applyLocked(w, ev)
	if gone {
		out.Last = nil // do not keep a removed worker alive in the pool
	} else {
		// flush checks w's bookkeeping (invariants builds), published sizes included.
		if ferr := e.flush(w); err == nil {
			err = ferr
		}
	}
	e.unlock(w)
	e.maybeSweepNamespaces()
	return err
}

// ApplyBatch applies evs in order and appends one error per event (nil when accepted) to
// errs. Consecutive events of one worker are applied under one acquisition of its lock
// and their index changes are handed to the shards together (every pendShards deltas,
// or on the locked index every yieldLocked block changes, at the latest): this is how an
// ingester should apply an engine's event batch. The answers are those of applying each
// event with Apply.
func (e *Engine) ApplyBatch(evs []Event, errs []error) []error {
	out := e.getOutbox()
	defer e.outboxes.Put(out)
	return e.applyBatchWith(out, evs, errs)
}

// applyBatchWith is ApplyBatch with out, the caller's outbox.
func (e *Engine) applyBatchWith(out *worker.Outbox, evs []Event, errs []error) []error {
	out.Run = true // (see lockLocked)
	defer func() { out.Run = false }()
	// recent remembers the last workers the batch locked, starting with the outbox's
	// (Outbox.Last: an ingester's batches come one worker at a time): an engine's batch
	// interleaves few workers, and a name compare is cheaper than a lookup in the name
	// table.
	recent := [4]*worker.Worker{out.Last}
	next := 1
	ahead := 0 // the events before it had their seq slots read ahead (touchAhead)
	var w *worker.Worker
	held := 0 // the block changes made under the locked index's write lock so far
	release := func() {
		held = 0
		if w == nil {
			return
		}
		if err := e.flush(w); err != nil && errs[len(errs)-1] == nil {
			errs[len(errs)-1] = err
		}
		e.unlock(w)
		out.Last, w = w, nil
	}
	for k := range evs {
		ev := &evs[k]
		if w != nil && w.Name() != ev.Worker {
			release()
		}
		apply, err := e.check(ev)
		if apply && w == nil {
			var hint *worker.Worker
			for _, r := range recent {
				if r != nil && r.Name() == ev.Worker {
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
			if ev.Kind == EventRemoved && k >= ahead {
				ahead = touchAhead(&e.env, w, evs, k)
			}
			var gone bool
			gone, err = e.applyLocked(w, ev)
			if invariants.Enabled && !gone {
				w.MustCheck(&e.env, false)
			}
			switch {
			case gone:
				e.unlock(w) // flushed already
				w = nil
				out.Last = nil // do not keep a removed worker alive in the pool
			case err == nil && !e.cfg.LockedIndex && out.Pending >= pendShards:
				err = e.flush(w)
			}
			if e.cfg.LockedIndex && w != nil {
				// A worker's run of events holds the locked index's write lock: let
				// the queries waiting for the read lock in every yieldLocked block
				// changes.
				if held += 1 + len(ev.Blocks) + len(ev.Seqs) + len(ev.Contents); held >= yieldLocked {
					_ = e.flush(w) // (the locked index's flush cannot fail)
					e.locked.Unlock()
					e.locked.Lock()
					held = 0
				}
			}
		}
		errs = append(errs, err)
	}
	release()
	e.maybeSweepNamespaces()
	return errs
}

// touchAhead reads ahead the seq slots of the removals that follow evs[k] in a run of
// removed events of its worker on its tier, up to worker.TouchGroup engine hashes
// (Worker.TouchSeqs), and returns the index of the first event it did not read:
// almost every event of the trace logs is a removal of one block after one of the same
// worker, so that the slots of one event per call would never overlap their misses.
// It only reads: an event it read ahead may still be refused or apply otherwise. Holder
// of w's mutex, with an outbox lent.
func touchAhead(env *worker.Env, w *worker.Worker, evs []Event, k int) int {
	ev := &evs[k]
	var seqs [worker.TouchGroup]uint64
	n := 0
	j := k + 1
	for ; j < len(evs) && n < len(seqs); j++ {
		x := &evs[j]
		if x.Kind != EventRemoved || x.Tier != ev.Tier || x.Worker != ev.Worker {
			break
		}
		n += copy(seqs[n:], x.Seqs)
	}
	w.TouchSeqs(env, worker.Tier(ev.Tier), seqs[:n])
	return j
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
func (e *Engine) lockFor(ev *Event, hint *worker.Worker, out *worker.Outbox) (w *worker.Worker, err error) {
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
		if !out.ValidStore(&e.env, 0, false, blocksOf(ev.Blocks)) {
			e.rejInvalid.Add(1)
			return nil, fmt.Errorf("%w: a seq appears twice in one event", ErrInvalidEvent)
		}
		return e.lockLive(ev.Worker, true, nil, out), nil
	case EventRemoved:
		e.skippedRemovals.Add(uint64(len(ev.Seqs)))
	case EventCopied:
		e.skippedCopies.Add(uint64(len(ev.Seqs)))
	}
	if e.preds.Live() != 0 {
		e.predictionsFor(ev) // a worker known only through predictions
	}
	return nil, nil
}

// applyLocked applies a checked event to w, which the caller has locked and unlocks; its
// deltas stay in w's outbox until the caller flushes. gone says the event forgot the worker,
// which is then flushed already (its lock is still held). While the engine holds
// predictions, the event also ends those it covers or contradicts (predict.go).
func (e *Engine) applyLocked(w *worker.Worker, ev *Event) (gone bool, err error) {
	w.CheckOwner("worker event")
	if groupedEvent(w, ev) {
		return e.applyGrouped(w, ev) // groups.go
	}
	return e.applyPlain(w, ev)
}

// applyPlain is applyLocked for a worker without groups.
func (e *Engine) applyPlain(w *worker.Worker, ev *Event) (gone bool, err error) {
	if e.preds.Live() != 0 {
		return e.predictedEvent(w, ev)
	}
	return e.applyEvent(w, ev)
}

// applyEvent is applyLocked without the predictions.
func (e *Engine) applyEvent(w *worker.Worker, ev *Event) (gone bool, err error) {
	setPosition(w, ev)
	switch ev.Kind {
	case EventStored:
		ns, err := e.eventNamespace(ev.Namespace)
		if err != nil {
			return false, err
		}
		return false, e.storeLocked(w, ns, ev)
	case EventRemoved:
		w.Outbox().Skipped += uint64(w.Remove(&e.env, worker.Tier(ev.Tier), ev.Seqs))
	case EventCopied:
		if !w.Room(&e.env, worker.Tier(ev.Tier), len(ev.Seqs)) {
			e.rejInvalid.Add(1)
			return false, fmt.Errorf("%w: worker %q could pass MaxSegments (%d) on one tier", ErrInvalidEvent, w.Name(), MaxSegments)
		}
		e.skippedCopies.Add(uint64(w.Copy(&e.env, worker.Tier(ev.Tier), ev.Seqs)))
	case EventCleared:
		w.Clear(&e.env)
	case EventRemoveWorker:
		w.Clear(&e.env)
		w.Outbox().Events++
		err = e.flush(w)
		w.SetDead()
		e.unregister(w)
		return true, err
	}
	w.Outbox().Events++
	return false, nil
}

// storeLocked applies a stored event to w (locked). The parent is resolved first, so an
// event faulty in both ways reports ErrParentNotFound.
// The parent may live on another tier than the event's (Event.Tier).
func (e *Engine) storeLocked(w *worker.Worker, ns uint32, ev *Event) error {
	var p worker.Parent
	tier := worker.Tier(ev.Tier)
	if ev.HasParent {
		var ok bool
		if p, ok = w.FindParent(&e.env, tier, ev.Parent); !ok || p.Key.NS != ns {
			e.rejParent.Add(1)
			return fmt.Errorf("%w: worker %q does not hold %d in this namespace", ErrParentNotFound, w.Name(), ev.Parent)
		}
		if uint64(p.Key.Pos)+uint64(len(ev.Blocks)) >= MaxDepth {
			e.rejInvalid.Add(1)
			return fmt.Errorf("%w: chain deeper than %d blocks", ErrInvalidEvent, MaxDepth)
		}
	}
	blocks := blocksOf(ev.Blocks)
	if !w.Room(&e.env, tier, len(blocks)) {
		e.rejInvalid.Add(1)
		if !w.Outbox().ValidStore(&e.env, ev.Parent, ev.HasParent, blocks) {
			return errDuplicateSeq // (the duplicate is reported first, as Store does)
		}
		return fmt.Errorf("%w: worker %q could pass MaxSegments (%d) on one tier", ErrInvalidEvent, w.Name(), MaxSegments)
	}
	if !w.Store(&e.env, tier, ns, p, blocks) { // (Store runs the duplicate check)
		e.rejInvalid.Add(1)
		return errDuplicateSeq
	}
	w.Outbox().Events++
	return nil
}

// errDuplicateSeq rejects a stored event one of whose seqs appears twice in it or
// equals its parent's.
var errDuplicateSeq = fmt.Errorf("%w: a seq appears twice in one event or equals the parent", ErrInvalidEvent)
