package engine

import (
	"fmt"
	"strings"

	"github.com/kvindex/kvindex/internal/invariants"
	"github.com/kvindex/kvindex/shard"
)

// The events protocol: a worker's events are applied under its mutex (lockFor,
// lockLive), on the caller's goroutine, into the worker's bookkeeping (worker.go,
// tables.go, tiers.go, groups.go; the predictions' hooks in predict.go), and the
// membership changes they make leave at flush for the shards' rings (or, on the locked
// index, for the table itself under the engine's write lock), in event order per
// worker. Every function here runs on an event caller's goroutine; the ones that take
// a *worker are called with its mutex held (the holder owns the worker), and none
// takes the worker's mutex after the prediction table's.

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
	if e.preds.Live() != 0 {
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
	if e.preds.Live() != 0 {
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
