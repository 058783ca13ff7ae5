package engine

import (
	"sync"
	"sync/atomic"

	"github.com/kvindex/kvindex/internal/invariants"
	"github.com/kvindex/kvindex/internal/table"
	"github.com/kvindex/kvindex/shard"
)

// worker is the per-worker state: which engine hashes it holds, at which (position,
// prefix), and the key bookkeeping that tells whether its held keys are prefix-closed.
//
// Ownership: every field below mu is owned by the goroutine holding mu. Events of one
// worker are applied under mu, and the deltas they produce are pushed to the shard rings
// before mu is released, so each ring sees one worker's deltas in event order. The
// atomics at the top are written under mu and read by queries without it.
type worker struct {
	// size is the number of distinct engine hashes held (seqs.n), the query's size(w), as
	// of the last flush.
	size atomic.Int64

	name string
	wid  uint32

	mu sync.Mutex
	// holes counts the held keys whose parent key is not held (see DESIGN.md).
	holes int32
	// gappy is true while holes > 0, i.e. while some held key's parent key is not held.
	// Queries may only jump over a stride for workers whose gappy is false. (It sits
	// with the other one-byte fields: the struct stays in the 160-byte size class.)
	gappy atomic.Bool
	// dead is set by RemoveWorker; a caller that finds it set looks the name up again.
	dead bool
	// owner records mu's holder in an invariants build (lockMu; empty otherwise).
	owner invariants.Owner
	// tier is the tier a component holds (TierDevice for a named worker).
	tier Tier
	// tl links a worker with its tier components (tiers.go); nil for a worker that has
	// only held device blocks. Set once, under the primary's mu.
	tl   atomic.Pointer[tierLink]
	seqs seqTable
	keys keyTable
	// cursor and mark are the worker's position in its event stream (Position): those of
	// the last event applied that carried a cursor, or of the last clear.
	cursor, mark uint64
	// hyb is a declared worker's KV-cache groups (groups.go); nil for a dense worker.
	// hybSize is its entry count, written under mu and read without it.
	hyb     *hybrid
	hybSize atomic.Int64
	// dg is the digest of this tier's entries (digest.go).
	dg digests
	// out is the scratch of the events being applied, lent by the caller that locked the
	// worker for events (lockLive; Apply and ApplyBatch take one from the engine's pool
	// per call) and taken back at unlock, so an idle worker holds none: 100,000 workers
	// do not keep 100,000 delta buffers.
	out *outbox
}

// lockMu takes w's mutex: the caller owns w's bookkeeping until unlockMu.
func (w *worker) lockMu() {
	w.mu.Lock()
	w.owner.Acquire()
}

// unlockMu lets w's mutex go.
func (w *worker) unlockMu() {
	w.owner.Release()
	w.mu.Unlock()
}

// outbox is a locked worker's scratch: the deltas of the events being applied, per
// shard, the duplicate check's set and the counters flush publishes.
type outbox struct {
	// events and skipped are the worker's changes to the engine-wide event and
	// skipped-removal counters since its last flush, which publishes them (and the block
	// count's change, seqs.n - size): one shared atomic update per flush rather than
	// several per event keeps producers of different workers from bouncing the counters'
	// cache line between cores.
	events, skipped uint64
	// npend counts the deltas in pend.
	npend int
	// pend collects the deltas per shard until flush; reused across events.
	pend [][]shard.Delta
	// seen is the duplicate check's scratch set.
	seen seqSet
}

// validateStore checks the parts of a stored event that do not depend on state: no seq
// twice, no seq equal to the parent.
func (w *worker) validateStore(seed *table.Seed, parent uint64, hasParent bool, blocks []Block) bool {
	if len(blocks) <= 16 {
		for i := range blocks {
			if hasParent && blocks[i].Seq == parent {
				return false
			}
			for j := i + 1; j < len(blocks); j++ {
				if blocks[i].Seq == blocks[j].Seq {
					return false
				}
			}
		}
		return true
	}
	seen := &w.out.seen
	seen.reset(len(blocks))
	defer seen.release()
	for _, b := range blocks {
		if hasParent && b.Seq == parent || !seen.add(seed, b.Seq) {
			return false
		}
	}
	return true
}

// seqSet is a scratch set of seqs for the duplicate check of one event: open addressing
// over at least twice as many slots as the event has blocks, emptied in O(1) by bumping
// gen (a slot is used only while its stamp equals gen).
type seqSet struct {
	slots []seqSetSlot
	gen   uint32
}

type seqSetSlot struct {
	seq uint64
	gen uint32
}

// seqSetKeep is the largest set kept between events; a bigger event's set is dropped
// after its check, so a rare huge event does not pin its memory.
const seqSetKeep = 1 << 12

func (s *seqSet) reset(n int) {
	c := 32
	for c < 2*n {
		c *= 2
	}
	if len(s.slots) < c {
		s.slots = make([]seqSetSlot, c)
		s.gen = 0
	}
	s.gen++
	if s.gen == 0 { // the stamps wrapped: start over
		clear(s.slots)
		s.gen = 1
	}
}

func (s *seqSet) release() {
	if len(s.slots) > seqSetKeep {
		*s = seqSet{}
	}
}

// add inserts seq and reports whether it was absent.
func (s *seqSet) add(seed *table.Seed, seq uint64) bool {
	for i := table.Home(seed.Hash64(seq), len(s.slots)); ; i = table.Next(i, len(s.slots)) {
		e := &s.slots[i]
		if e.gen != s.gen {
			*e = seqSetSlot{seq: seq, gen: s.gen}
			return true
		}
		if e.seq == seq {
			return false
		}
	}
}

// parentRef is a stored event's parent: its key and, when the storing table holds its
// record, the record id + 1 (0: the parent is held on another tier, so addKey finds its
// key in this table or makes a ghost of it).
type parentRef struct {
	has    bool
	prefix uint64
	pos    uint32
	ref    uint32
}

// store applies an accepted stored event: the parent (if any) is p, validateStore
// passed, and positions fit. Called with mu held.
func (w *worker) store(e *Engine, ns uint32, p parentRef, blocks []Block) {
	seed := &e.seed
	prefix, pos, ref := p.prefix, p.pos, p.ref
	var dc digestCell // the entries this event adds to namespace ns
	for i, b := range blocks {
		parentPrefix := prefix
		var k key
		if i > 0 || p.has {
			k = key{prefix: e.chain.Step(prefix, b.Content, pos+1), pos: pos + 1, ns: ns}
		} else {
			k = key{prefix: b.Content, pos: 0, ns: ns}
		}
		prefix, pos = k.prefix, k.pos
		// The seq's slot stays valid below: dropKey and addKey touch only the key table.
		si, sh, found := w.seqs.locate(seed, b.Seq)
		if found {
			old := w.seqs.slots[si].ref - 1
			if w.keys.is(old, k, w.keys.locOf(k, false)) {
				ref = old + 1
				continue // a duplicate never inflates anything
			}
			ok := w.keys.key(old)
			w.dg.add(ok.ns, digestTerm(b.Seq, ok.pos), -1)
			w.dropKey(e, old) // last write wins: the seq moves
		}
		rid := w.addKey(e, k, parentPrefix, ref) // a root ignores its parent
		ref = rid + 1
		w.seqs.setAt(si, sh, rid)
		dc.sum += digestTerm(b.Seq, k.pos)
		dc.n++
	}
	w.dg.addCell(ns, dc)
}

// addKey counts one more engine hash under k and returns k's record id. The parent key
// has prefix parentPrefix and, when the caller knows it, record id parent-1 (parent ==
// 0: look it up by key, creating a ghost if the worker does not have it, as a store
// whose parent is on another tier and Restore, which loads children before parents,
// need; full tables only).
func (w *worker) addKey(e *Engine, k key, parentPrefix uint64, parent uint32) uint32 {
	t := &w.keys
	seed := &e.seed
	fp := e.fingerprint(k)
	var pk key
	newParent := false
	if k.pos > 0 && parent == 0 {
		pk = key{prefix: parentPrefix, pos: k.pos - 1, ns: k.ns}
		p, ok := t.find(seed, pk)
		if !ok {
			p, newParent = t.newRec(pk), true
		}
		parent = p + 1
	}
	rid, found := t.lookup(k, fp, parent)
	if found && t.seqs(rid) > 0 {
		t.addSeqs(rid, 1) // held already (and so is its parent's record: newParent is false)
		return rid
	}
	// The key becomes held: its children that were holes are reconnected, it tells the
	// index, and it becomes a child of its parent key.
	if found {
		t.ghosts--
	} else {
		rid = t.newRec(k) // (may move the slab)
	}
	t.addSeqs(rid, 1)
	w.holes -= int32(t.kids(rid))
	w.emitFP(e, shard.OpAdd, fp)
	if k.pos == 0 {
		if !found {
			t.index(seed, rid, k, fp)
		}
		return rid
	}
	t.recs[rid].parent = parent
	t.addKids(parent-1, 1)
	if t.seqs(parent-1) == 0 {
		w.holes++
	}
	if newParent {
		t.ghosts++
		t.index(seed, parent-1, pk, fpOf(seed, pk))
	}
	// Attach the key under its parent: linked while it is the one held child (a found
	// ghost is in the index already), indexed with its siblings past that.
	p := &t.recs[parent-1]
	switch c := p.child; {
	case c == 0 && !found && !t.full:
		p.child = rid + 1
	case c == 0 || c == childIndexed:
		p.child = childIndexed
		if !found {
			t.index(seed, rid, k, fp)
		}
	default: // the parent's linked child is c-1: both go in the index
		p.child = childIndexed
		ck := t.key(c - 1)
		t.index(seed, c-1, ck, fpOf(seed, ck))
		if !found {
			t.index(seed, rid, k, fp)
		}
	}
	return rid
}

// dropKey counts one engine hash less under record rid, which must be held.
func (w *worker) dropKey(e *Engine, rid uint32) {
	t := &w.keys
	if t.addSeqs(rid, -1) > 0 { // addSeqs panics if rid was not held
		return
	}
	kids := t.kids(rid)
	w.holes += int32(kids)
	k := t.key(rid)
	fp := e.fingerprint(k)
	w.emitFP(e, shard.OpRemove, fp)
	parent := t.recs[rid].parent
	t.recs[rid].parent = 0
	indexed := true // whether rid is in the key index
	if k.pos > 0 {
		if parent == 0 {
			panic("engine: worker key table lost a parent key")
		}
		p := parent - 1
		if t.recs[p].child == rid+1 {
			indexed = false // it was its parent's linked child
		}
		pk := t.addKids(p, -1)
		if pk == 0 {
			t.recs[p].child = 0
		}
		if t.seqs(p) == 0 {
			w.holes--    // the dropped key was itself a hole
			if pk == 0 { // the parent was a ghost kept for its held children, now none
				t.ghosts--
				t.del(&e.seed, p)
			}
		}
	}
	if kids > 0 {
		// rid stays as a ghost, which a refill must find: the index has every ghost.
		t.ghosts++
		if !indexed {
			t.index(&e.seed, rid, k, fp)
		}
		return
	}
	if indexed {
		t.unindex(rid, fp)
	}
	t.release(rid)
}

// remove drops seqs the worker holds and returns how many it did not hold.
func (w *worker) remove(e *Engine, seqs []uint64) (skipped int) {
	var dc digestCell // the entries dropped from namespace dns since the last change of namespace
	var dns uint32
	for _, s := range seqs {
		rid, ok := w.seqs.del(&e.seed, s)
		if !ok {
			skipped++
			continue
		}
		if k := w.keys.key(rid); k.ns == dns {
			dc.sum -= digestTerm(s, k.pos)
			dc.n--
		} else {
			w.dg.addCell(dns, dc)
			dc, dns = digestCell{sum: -digestTerm(s, k.pos), n: -1}, k.ns
		}
		w.dropKey(e, rid)
	}
	w.dg.addCell(dns, dc)
	if w.keys.sparse() {
		w.compact(&e.seed)
	}
	return skipped
}

// compact renumbers the live key records densely and rebuilds the key index at the size
// they need, so a worker that shrank gives its memory back (records never move
// otherwise). O(records); it runs only once the tables are mostly empty.
func (w *worker) compact(seed *table.Seed) {
	old := w.keys.recs
	full := w.keys.full
	if w.keys.n == 0 {
		w.keys = keyTable{full: full}
		return
	}
	ids := make([]uint32, len(old)) // per old record id: new id + 1
	recs := make([]keyRec, 0, int(w.keys.n))
	for i := range old {
		if !old[i].free() {
			ids[i] = uint32(len(recs)) + 1
			recs = append(recs, old[i])
		}
	}
	for i := range recs {
		if p := recs[i].parent; p != 0 {
			recs[i].parent = ids[p-1]
		}
	}
	// The side table follows the new ids; the namespaces keep their local ids.
	ext := w.keys.ext
	if ext != nil {
		wide := make(map[uint32]wideRec, len(ext.wide))
		for rid, c := range ext.wide {
			wide[ids[rid]-1] = c
		}
		ext.wide = wide
	}
	w.keys = keyTable{recs: recs, ext: ext, n: int32(len(recs)), full: full}
	w.keys.relink(seed)
	for i := range w.seqs.slots {
		if s := &w.seqs.slots[i]; s.ref != 0 {
			s.ref = ids[s.ref-1]
		}
	}
}

// publish makes w's gap flag and size (and the engine's block counts) visible to
// queries. Called with the primary's mu held.
func (w *worker) publish(e *Engine) {
	if g := w.holes > 0; g != w.gappy.Load() {
		w.gappy.Store(g)
	}
	if d := int64(w.seqs.n) - w.size.Load(); d != 0 {
		e.blocks.Add(d)
		e.tierBlocks[w.tier].Add(d)
		w.size.Store(int64(w.seqs.n))
	}
}

// clearTiers drops every block of primary w on every tier.
func (w *worker) clearTiers(e *Engine) {
	w.clear(e)
	w.components(func(_ Tier, c *worker) { c.clear(e) })
}

// clear drops every block of one tier.
func (w *worker) clear(e *Engine) {
	for i := range w.keys.recs {
		if !w.keys.recs[i].free() && w.keys.seqs(uint32(i)) > 0 {
			w.emitFP(e, shard.OpRemove, e.fingerprint(w.keys.key(uint32(i))))
		}
	}
	w.seqs = seqTable{}
	w.keys = keyTable{full: w.keys.full}
	w.holes = 0
	w.dg.reset()
}

// emitFP queues a delta of the key whose fingerprint is fp for the key's shard.
func (w *worker) emitFP(e *Engine, op uint8, fp uint64) {
	s := e.ownerOf(fp)
	o := w.out
	o.pend[s] = append(o.pend[s], shard.NewDelta(op, fp, w.wid))
	o.npend++
}

// maxPending bounds the deltas a worker holds back during a run of events (ApplyBatch)
// before it hands them to the shards, and the buffer capacity it keeps afterwards.
const maxPending = 1024

// flush publishes this event's deltas to the shard rings and the worker's gap flag and
// counters. Called with mu held, so one worker's deltas enter each ring in event order.
func (w *worker) flush(e *Engine) error {
	w.owner.Check("worker flush")
	o := w.out
	if e.cfg.LockedIndex && !e.hooks.dropDeltas {
		// The locked index takes the flags with the deltas, under the write lock: a
		// query reads them under the read lock, so it sees a worker's gap flag and its
		// memberships of one moment. gallop trusts a gap-free flag for every position;
		// published before the deltas, a flag cleared by an event that fills a hole
		// would meet the index with the hole still in it.
		e.locked.Lock()
		e.shards[0].ApplyLocked(o.pend[0])
		w.publish(e)
		w.components(func(_ Tier, c *worker) { c.publish(e) })
		e.locked.Unlock()
		o.pend[0] = o.pend[0][:0]
		o.npend = 0
	} else {
		w.publish(e)
		w.components(func(_ Tier, c *worker) { c.publish(e) })
	}
	if invariants.Enabled {
		w.mustCheck(e, true)
	}
	if o.events != 0 {
		e.events.Add(o.events)
		o.events = 0
	}
	if o.skipped != 0 {
		e.skippedRemovals.Add(o.skipped)
		o.skipped = 0
	}
	if e.hooks.dropDeltas {
		for s := range o.pend {
			o.pend[s] = o.pend[s][:0]
		}
		o.npend = 0
		return nil
	}
	if e.cfg.LockedIndex {
		return nil
	}
	var err error
	for s := range o.pend {
		if len(o.pend[s]) == 0 {
			continue
		}
		if _, perr := e.shards[s].Ring().PushBatch(o.pend[s]); perr != nil && err == nil {
			// A ring fails a push only once Close (or a failed shard) has closed it: the
			// caller gets the engine's reason, as from every other call.
			err = e.err()
		}
		clear(o.pend[s])
		o.pend[s] = o.pend[s][:0]
		if cap(o.pend[s]) > 4*maxPending {
			o.pend[s] = nil // a huge event passed: do not keep its buffer
		}
	}
	o.npend = 0
	return err
}

// fingerprint is k's name in the positional index (shard.Hash).
func (e *Engine) fingerprint(k key) uint64 {
	return shard.Hash(e.seed, shard.Key{Prefix: k.prefix, Pos: k.pos, NS: k.ns})
}

// ownerOf returns the shard that owns the key with fingerprint fp. Keys are spread by a
// hash of all of the key, so the hot first positions that every request shares land on
// different shards. The shard takes the fingerprint's low bits and the shard's table
// its high bits, so that the keys of one shard still spread over the whole table.
func (e *Engine) ownerOf(fp uint64) int {
	return int((uint64(uint32(fp)) * uint64(len(e.shards))) >> 32)
}
