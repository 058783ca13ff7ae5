package worker

import (
	"math/bits"
	"sync"
	"sync/atomic"

	"github.com/kvindex/kvindex/internal/invariants"
	"github.com/kvindex/kvindex/internal/table"
	"github.com/kvindex/kvindex/shard"
)

// Worker is the per-worker state: which engine hashes it holds, at which (position,
// prefix), and the key bookkeeping that tells whether its held keys are prefix-closed.
// A primary (a named worker) holds its device blocks; its tier components (tiers.go),
// workers of their own under the primary's name, hold the others.
//
// Ownership: every field below mu is owned by the goroutine holding mu (a component's:
// its primary's mu). Events of one worker are applied under mu, and the deltas they
// produce are pushed to the shard rings before mu is released, so each ring sees one
// worker's deltas in event order. The atomics are written under mu and read by queries
// without it; name, wid and tier are set at creation and read by anyone.
type Worker struct {
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
	// with the other one-byte fields, which keeps the struct at 352 bytes, a size
	// class.)
	gappy atomic.Bool
	// dead is set by RemoveWorker; a caller that finds it set looks the name up again.
	dead bool
	// busy is set while a run of events holds the worker on the locked index (Busy).
	busy bool
	// owner records who owns the bookkeeping in an invariants build (Lock, Own; empty
	// otherwise): mu's holder, or on the locked index a single event's applier.
	owner invariants.Owner
	// tier is the tier a component holds (Device for a named worker).
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
	hyb     *Hybrid
	hybSize atomic.Int64
	// dg is the digest of this tier's entries (digest.go).
	dg digests
	// out is the scratch of the events being applied, lent by the caller that locked the
	// worker for events (SetOutbox; the engine takes one from its pool per call) and
	// taken back at unlock, so an idle worker holds none: 100,000 workers do not keep
	// 100,000 delta buffers.
	out *Outbox
}

// New returns a primary named name under worker id wid (the registry's; the caller
// publishes it).
func New(name string, wid uint32) *Worker { return &Worker{name: name, wid: wid} }

// Name is the worker's name (a component's: its primary's). Concurrent.
func (w *Worker) Name() string { return w.name }

// ID is the worker's id in the shards' memberships. Concurrent.
func (w *Worker) ID() uint32 { return w.wid }

// Tier is the tier w holds: Device for a primary. Concurrent.
func (w *Worker) Tier() Tier { return w.tier }

// IsComponent reports whether w is a non-device tier component (not a named worker).
// Concurrent.
func (w *Worker) IsComponent() bool { return w.tier != Device }

// Size is the number of distinct engine hashes w's own tables held at its last
// publication (Publish). Concurrent.
func (w *Worker) Size() int64 { return w.size.Load() }

// Gappy reports w's gap flag as of its last publication: some held key of its tables
// has a parent key it does not hold, so a query may not jump over a stride for it.
// Concurrent.
func (w *Worker) Gappy() bool { return w.gappy.Load() }

// Lock takes w's mutex: the caller owns w's bookkeeping (and its components') until
// Unlock.
func (w *Worker) Lock() {
	w.mu.Lock()
	w.owner.Acquire()
}

// Unlock lets w's mutex go.
func (w *Worker) Unlock() {
	w.owner.Release()
	w.mu.Unlock()
}

// LockMu takes w's mutex without owning w's bookkeeping yet: the caller takes what else
// it needs first (the locked index's read or write lock), then Own.
func (w *Worker) LockMu() { w.mu.Lock() }

// UnlockMu lets w's mutex go (after Disown).
func (w *Worker) UnlockMu() { w.mu.Unlock() }

// Own records, in an invariants build, that the caller owns w's bookkeeping: with w's
// mutex (LockMu) and the locked index's read lock, or on the locked index by its write
// lock alone (an event's applier). A no-op otherwise.
func (w *Worker) Own() { w.owner.Acquire() }

// Disown records that the caller no longer owns w's bookkeeping (see Own).
func (w *Worker) Disown() { w.owner.Release() }

// Busy reports whether a run of events (Outbox.Run) holds w on the locked index: a
// single event's applier, which takes only the write lock, then waits for the run's end
// on w's mutex. Holder of the locked index's write lock.
func (w *Worker) Busy() bool { return w.busy }

// SetBusy marks w as held by a run of events or not (see Busy). Holder of the locked
// index's write lock and of w's mutex.
func (w *Worker) SetBusy(b bool) { w.busy = b }

// CheckOwner panics, in an invariants build, unless the calling goroutine owns w's
// bookkeeping (Lock, Own; what names the operation that needed it). A no-op otherwise.
func (w *Worker) CheckOwner(what string) { w.owner.Check(what) }

// Dead reports whether w was removed (SetDead): a caller that locked it by name looks
// the name up again. Holder of w's mutex.
func (w *Worker) Dead() bool { return w.dead }

// SetDead marks w removed. Holder of w's mutex.
func (w *Worker) SetDead() { w.dead = true }

// Position is w's position in its event stream (the engine's Position). Holder of w's
// mutex.
func (w *Worker) Position() (cursor, mark uint64) { return w.cursor, w.mark }

// SetPosition records w's position in its event stream. Holder of w's mutex.
func (w *Worker) SetPosition(cursor, mark uint64) { w.cursor, w.mark = cursor, mark }

// Len is the number of engine hashes w's own tables hold now (Size is the published
// count). Holder of w's mutex.
func (w *Worker) Len() int { return int(w.seqs.n) }

// HasHoles reports whether some held key of w's tables has a parent key it does not
// hold, now (Gappy is the published flag). Holder of w's mutex.
func (w *Worker) HasHoles() bool { return w.holes > 0 }

// Outbox is a locked worker's scratch: the deltas of the events being applied, per
// shard, the duplicate check's set and the counters the engine's flush publishes. It
// belongs to whoever holds the worker it is lent to (SetOutbox).
type Outbox struct {
	// Events and Skipped are the worker's changes to the engine-wide event and
	// skipped-removal counters since its last flush, which publishes them (and the block
	// count's change, Publish): one shared atomic update per flush rather than several
	// per event keeps producers of different workers from bouncing the counters' cache
	// line between cores.
	Events, Skipped uint64
	// Pending counts the deltas in Pend.
	Pending int
	// Pend collects the deltas per shard until the flush hands them over; reused across
	// events.
	Pend [][]shard.Delta
	// seen is the duplicate check's scratch set, bits its filter's bit numbers by block
	// (ValidStore).
	seen seqSet
	bits []uint16
	// undo is unstore's scratch; mark and markN are the lengths of Pend and Pending
	// when a store that may be taken back began (markPend).
	undo  []uint64
	mark  []int
	markN int
	// sink keeps what the look-ahead reads of a run's seq slots (seqTable.touch) return,
	// so that the compiler keeps the loads.
	sink uint32
	// Run says that the caller applies a run of events (ApplyBatch), which on the
	// locked index may let the write lock go between them: it holds the worker's mutex
	// as well, and marks the worker busy (SetBusy) while the run lasts.
	Run bool
	// Last is the worker the outbox was last lent to, or nil: the engine's Apply tries it
	// before the name table, since almost every event of an ingester's stream follows
	// one of the same worker (98-99% of the trace logs' removals). The outbox pool is
	// per processor, so a producer usually gets back its own outbox and hint. A hint
	// may be stale (its worker removed since); the engine checks that under the
	// worker's mutex (the locked index: its write lock), as it does for every worker it
	// locks.
	Last *Worker
}

// markPend records the queued deltas, so that dropPend can drop what is queued after.
func (o *Outbox) markPend() {
	if len(o.mark) != len(o.Pend) {
		o.mark = make([]int, len(o.Pend))
	}
	for s := range o.Pend {
		o.mark[s] = len(o.Pend[s])
	}
	o.markN = o.Pending
}

// dropPend drops the deltas queued since markPend (no flush comes between: a flush
// runs between events).
func (o *Outbox) dropPend() {
	for s := range o.Pend {
		o.Pend[s] = o.Pend[s][:o.mark[s]]
	}
	o.Pending = o.markN
}

// NewOutbox returns an empty outbox for an engine of shards shards.
func NewOutbox(shards int) *Outbox { return &Outbox{Pend: make([][]shard.Delta, shards)} }

// SetOutbox lends o to w and its components for the events its caller applies (nil:
// takes it back). Holder of w's mutex.
func (w *Worker) SetOutbox(o *Outbox) {
	w.out = o
	if tl := w.tl.Load(); tl != nil {
		for i := range tl.comps {
			if c := tl.comps[i].Load(); c != nil {
				c.out = o
			}
		}
	}
}

// Outbox is the outbox lent to w. Holder of w's mutex.
func (w *Worker) Outbox() *Outbox { return w.out }

// parentRef is a stored event's parent: its key and, when the storing table holds its
// block, its ref + 1 (0: the parent is held on another tier, so addKey finds its
// key in this table or makes a ghost of it).
type parentRef struct {
	has    bool
	prefix uint64
	pos    uint32
	ref    uint32
}

// Parent is a stored event's parent, found by FindParent: its seq and key, and the
// table and block that hold it. Valid until its worker is next modified.
type Parent struct {
	Key    shard.Key
	Seq    uint64
	holder *Worker
	rid    uint32
}

// Store applies a stored event of primary w on tier t in namespace ns whose blocks hang
// under p (found by FindParent in the same hold of the mutex; the zero Parent:
// blocks[0] is a root) and whose positions fit, and reports whether it was valid: false,
// and nothing changed, when a seq appears twice in blocks or equals p's (the duplicate
// check of Outbox.ValidStore). Holder of w's mutex, with an outbox lent.
//
// The check runs first only where the tier's table could not tell: a tier w has no
// table for yet, or a parent held on another tier (the table does not hold its seq).
// Otherwise a duplicate is a seq the table holds by the time the store reaches it (the
// parent's, or one an earlier block of the event stored), so the store runs the check
// at the first seq it finds held, before it changes anything for that block, and
// undoes the blocks before it when the check fails (unstore). A store that finds no
// seq held, every store of both trace logs, checks nothing: the check was 7% of a
// coalesced event (BenchmarkEventsCoalesced, locked, seven alternating runs).
func (w *Worker) Store(env *Env, t Tier, ns uint32, p Parent, blocks []Block) bool {
	c := w.TierOf(env, t, false)
	checked := false
	if c == nil || p.holder != nil && p.holder != c {
		if !w.out.ValidStore(env, p.Seq, p.holder != nil, blocks) {
			return false
		}
		checked = true
		c = w.TierOf(env, t, true)
	}
	ref := parentRef{has: p.holder != nil, prefix: p.Key.Prefix, pos: p.Key.Pos}
	if p.holder == c {
		ref.ref = p.rid + 1 // else the parent's block is in another tier's table: addKey finds or makes it
	}
	return c.store(env, ns, ref, p.Seq, blocks, checked)
}

// HasRoom reports whether w's own table can take n more keys: each may start a segment,
// or two (a store whose parent is on another tier makes a ghost of the parent's key), of
// a chunk of up to a stride's words; a table names at most MaxSegments segments and
// 2^32 - 1 arena words (a chunk's offset is a word of its header). Holder of w's mutex.
func (w *Worker) HasRoom(n int) bool {
	return int(w.keys.nsegs)+2*n < segLimit && uint64(len(w.keys.ar))+uint64(2*n)*uint64(maxChunk) < arenaLimit
}

// Room is HasRoom of primary w's tier t (true for a tier it holds nothing on yet, up to
// the same bound). Holder of w's mutex.
func (w *Worker) Room(env *Env, t Tier, n int) bool {
	if c := w.TierOf(env, t, false); c != nil {
		return c.HasRoom(n)
	}
	return 2*n < segLimit
}

// Remove drops seqs from primary w's tier t and returns how many of them the tier did
// not hold. Holder of w's mutex, with an outbox lent.
func (w *Worker) Remove(env *Env, t Tier, seqs []uint64) (skipped int) {
	c := w.TierOf(env, t, false)
	if c == nil {
		return len(seqs)
	}
	return c.remove(env, seqs)
}

// KeyOf returns the key at which w's own tables hold seq. Holder of w's mutex.
func (w *Worker) KeyOf(env *Env, seq uint64) (shard.Key, bool) {
	rid, ok := w.seqs.get(&env.Seed, seq)
	if !ok {
		return shard.Key{}, false
	}
	return w.keys.key(rid).shard(), true
}

// store applies a stored event to this tier's tables: the parent (if any) is p, of seq
// pseq, and positions fit; checked says that the duplicate check passed already (else
// the first seq found held runs it: Store). Blocks that extend the chain of their
// parent's segment go in runs (storeRun); the others, and a block whose seq the
// worker holds already, one at a time (storeBlock). It reports whether the event was
// valid (false: unstore took back what it had applied).
func (w *Worker) store(env *Env, ns uint32, p parentRef, pseq uint64, blocks []Block, checked bool) bool {
	s := storeState{prefix: p.prefix, pos: p.pos, ref: p.ref, has: p.has, ns: ns, pseq: pseq, phas: p.has, checked: checked}
	if !checked {
		w.out.markPend()
	}
	for i := 0; i < len(blocks); {
		if s.has {
			if n := w.storeRun(env, &s, blocks, i); n > 0 {
				i += n
				continue
			}
		}
		if !w.storeBlock(env, &s, blocks, i) {
			w.unstore(env, &s, blocks[:i])
			return false
		}
		i++
	}
	w.dg.addCell(ns, s.dc)
	return true
}

// unstore takes back the blocks done that a store applied before it found a duplicate
// seq. Every one of them was a seq the table did not hold (the first seq found held
// stops the store: Store), in chain order, so removing them leaf first gives the tables
// their state before the event; the deltas the event and the removal queued are
// dropped (Outbox.dropPend), so the index never sees the event.
func (w *Worker) unstore(env *Env, s *storeState, done []Block) {
	w.dg.addCell(s.ns, s.dc)
	o := w.out
	seqs := o.undo[:0]
	for j := len(done) - 1; j >= 0; j-- {
		seqs = append(seqs, done[j].Seq)
	}
	w.remove(env, seqs)
	o.undo = seqs[:0]
	if cap(seqs) > undoKeep {
		o.undo = nil // a huge event's scratch is not kept
	}
	o.dropPend()
}

// undoKeep is the largest undo scratch an outbox keeps between events.
const undoKeep = 4096

// storeState is where a store is along its blocks: the last block's prefix, position
// and ref + 1 (0: the caller must look the parent up by key), whether there is one
// (has: false before a root), the entries added (dc), the event's parent seq (pseq,
// if phas) and whether the duplicate check passed (checked), and the read-ahead
// window of the blocks' mixed hashes.
type storeState struct {
	prefix  uint64
	pos     uint32
	ref     uint32
	has     bool
	phas    bool
	checked bool
	ns      uint32
	pseq    uint64
	dc      DigestCell
	from, n int // hs holds the mixed hashes of blocks[from:from+n]
	hs      [TouchGroup]uint64
}

// mixed returns block i's mixed hash, reading the next window's seq slots ahead when i
// leaves the current one (window). A store asks for its blocks in order.
func (w *Worker) mixed(env *Env, s *storeState, blocks []Block, i int) uint64 {
	if i >= s.from+s.n {
		w.window(env, s, blocks, i)
	}
	return s.hs[i-s.from]
}

// window makes the store's read-ahead window start at block i: the mixed hashes of up
// to TouchGroup blocks from there, their seq slots read ahead (seqTable.touch).
func (w *Worker) window(env *Env, s *storeState, blocks []Block, i int) {
	s.from = i
	s.n = min(len(blocks)-i, TouchGroup)
	w.touchBlocks(env, s.hs[:], blocks[i:])
}

// storeBlock applies blocks[i] on its own: a root, a block that starts a segment or
// branches, or one whose seq the worker holds already (a duplicate of the same key is
// skipped; the seq of another key moves: last write wins). It reports false, having
// changed nothing, when it finds the seq held and the event fails the duplicate check
// (Store).
func (w *Worker) storeBlock(env *Env, s *storeState, blocks []Block, i int) bool {
	b := blocks[i]
	parentPrefix := s.prefix
	var k key
	if s.has {
		k = key{prefix: env.Chain.Step(s.prefix, b.Content, s.pos+1), pos: s.pos + 1, ns: s.ns}
	} else {
		k = key{prefix: b.Content, pos: 0, ns: s.ns}
	}
	s.prefix, s.pos, s.has = k.prefix, k.pos, true
	// The seq's slot stays valid below: dropKey and addKey touch only the key table.
	sh := w.mixed(env, s, blocks, i)
	si, found := w.seqs.locateMixed(sh)
	if found {
		if !s.checked {
			if !w.out.ValidStore(env, s.pseq, s.phas, blocks) {
				return false
			}
			s.checked = true
		}
		old := w.seqs.slots[si].ref - 1
		if w.keys.is(old, k) {
			s.ref = old + 1
			return true // a duplicate never inflates anything
		}
		ok := w.keys.key(old)
		w.dg.add(ok.ns, digestTerm(b.Seq, ok.pos), -1)
		w.dropKey(env, old, ok) // last write wins: the seq moves
		w.keys.settleShrink()
	}
	nref := w.addKey(env, k, parentPrefix, s.ref, len(blocks)-i) // a root ignores its parent
	s.ref = nref + 1
	w.seqs.setAt(si, sh, nref)
	s.dc.Sum += digestTerm(b.Seq, k.pos)
	s.dc.N++
	return true
}

// storeRun applies blocks[i:] as far as they extend the segment of their parent block
// (s.ref), which must end it, hold a seq and have no branch child, inside its stride,
// and returns how many it applied (0: none may go this way; storeBlock takes the next
// one). Each block then has the key after the one before, none of which the table has
// (no loose segment, no branch child: addKey's case for extend), so the run's seqs go
// in the seq table first (insertRun, a read-ahead window at a time), pointing at the
// blocks the run is about to take, up to the first seq the worker holds already, and
// the blocks then join the segment together: one check of the parent, one growth of
// the chunk, then loops that call nothing but where the index keeps a key: the
// prefixes (the keyed chain's arithmetic inline: Chain.Mults), the meta bytes, the
// digest terms.
func (w *Worker) storeRun(env *Env, s *storeState, blocks []Block, i int) int {
	t := &w.keys
	if s.ref == 0 || t.loose != 0 || t.full {
		return 0
	}
	seg, n0, ok := t.runRoom(s.ref-1, s.pos)
	if !ok {
		return 0
	}
	room := min(len(blocks)-i, segMax-int(s.pos+1)%segMax)
	w.seqs.reserve(room)
	m := 0
	for m < room {
		at := i + m
		if at < s.from || at >= s.from+s.n {
			w.window(env, s, blocks, at)
		}
		hs := s.hs[at-s.from : min(s.n, at-s.from+room-m)]
		k := w.seqs.insertRun(hs, refOf(seg, n0+uint32(m)))
		if m += k; k < len(hs) {
			break
		}
	}
	if m == 0 {
		return 0
	}
	h := t.growFor(seg, int(n0)+m)
	run := blocks[i : i+m]
	pre := t.ar[h.at+n0 : h.at+n0+uint32(m)]
	prefix, pos := s.prefix, s.pos
	if k, mults, ok := env.Chain.Mults(pos+1, m); ok {
		mults = mults[:len(run)]
		for j := range run {
			hi, lo := bits.Mul64(run[j].Content^k, mults[j])
			prefix += hi ^ lo
			pre[j] = prefix
		}
	} else {
		for j := range run {
			prefix = env.Chain.Step(prefix, run[j].Content, pos+1+uint32(j))
			pre[j] = prefix
		}
	}
	metas := t.ar[h.at+uint32(segCaps[h.class]):]
	for off := n0; off < n0+uint32(m); off++ {
		metas[off/8] |= 1 << (8 * (off % 8)) // one seq (the byte was 0: past the end)
	}
	var sum uint64
	for j := range run {
		sum += digestTerm(run[j].Seq, pos+1+uint32(j))
	}
	for j := range run {
		if p := pos + 1 + uint32(j); env.Indexed(p) {
			w.emitFP(env, shard.OpAdd, env.fingerprint(key{prefix: pre[j], pos: p, ns: s.ns}))
		}
	}
	h.n += uint8(m)
	t.blocks += int32(m)
	t.held += int32(m)
	s.dc.Sum += sum
	s.dc.N += int64(m)
	s.prefix, s.pos, s.ref = prefix, pos+uint32(m), refOf(seg, n0+uint32(m-1))+1
	return m
}

// addKey counts one more engine hash under k and returns k's block. The parent key has
// prefix parentPrefix and, when the caller knows it, block parent-1 (parent == 0: look
// it up by key, making a ghost of it if the worker does not have it, as a store whose
// parent is on another tier and Restore, which loads children before parents, need;
// full tables only). hint is how many blocks the caller adds along this chain, k's
// included (the chunk's size when k starts or extends a segment).
func (w *Worker) addKey(env *Env, k key, parentPrefix uint64, parent uint32, hint int) uint32 {
	t := &w.keys
	seed := &env.Seed
	if parent != 0 && k.pos > 0 && t.loose == 0 && !t.full {
		if ref, ok := t.extend(parent-1, k); ok {
			t.held++
			w.emit(env, shard.OpAdd, k) // (no fingerprint where the index keeps no key)
			return ref
		}
	}
	fp := env.fingerprint(k)
	var ref uint32
	var found bool
	if k.pos == 0 {
		if ref, found = t.findFP(k, fp); !found {
			ref = t.newSeg(seed, k, fp, hint)
		}
	} else {
		if parent == 0 {
			pk := key{prefix: parentPrefix, pos: k.pos - 1, ns: k.ns}
			pfp := fpOf(seed, pk)
			p, ok := t.findFP(pk, pfp)
			if !ok {
				p = t.newSeg(seed, pk, pfp, hint+1) // a ghost once k is held under it
			}
			parent = p + 1
		}
		if ref, found = t.child(parent-1, k, fp); !found {
			ref = t.attach(seed, parent-1, k, fp, hint)
		}
	}
	if t.addSeqs(ref, 1) > 1 {
		return ref // held already (and so is its parent's block)
	}
	// The key becomes held: its children that were holes are reconnected, it tells the
	// index, and it becomes a child of its parent key.
	t.held++
	w.holes -= int32(t.heldKids(ref))
	w.emitAdd(env, k, fp)
	if offOf(ref) == 0 {
		t.loose--
		if k.pos > 0 {
			t.segs[segOf(ref)].parent = parent
			t.addKids(parent-1, 1)
		}
	}
	if k.pos > 0 && t.seqs(parent-1) == 0 {
		w.holes++
	}
	return ref
}

// dropKey counts one engine hash less under block ref, which must be held and whose key
// (the caller has read it) is k. The caller settles the key table (settleShrink)
// before it returns: a removal of many blocks settles once.
func (w *Worker) dropKey(env *Env, ref uint32, k key) {
	if !w.dropTail(env, ref, &w.keys.segs[segOf(ref)], k.pos) {
		w.dropHeld(env, ref, k)
	}
}

// dropHeld is dropKey of a block that dropTail does not take: one of several seqs, a
// segment's first, a branch parent, or not its segment's last.
func (w *Worker) dropHeld(env *Env, ref uint32, k key) {
	t := &w.keys
	if t.addSeqs(ref, -1) > 0 { // addSeqs panics if ref was not held
		return
	}
	t.held--
	seed := &env.Seed
	w.holes += int32(t.heldKids(ref))
	w.emit(env, shard.OpRemove, k)
	seg := segOf(ref)
	if k.pos > 0 {
		p := t.parentOf(ref)
		if p == 0 {
			panic("engine: worker key table lost a parent key")
		}
		if t.seqs(p-1) == 0 {
			w.holes-- // the dropped key was itself a hole
		}
		if offOf(ref) == 0 {
			t.segs[seg].parent = 0
			t.addKids(p-1, -1)
			t.trim(seed, segOf(p-1)) // the parent may have been a ghost kept for this key
		}
	}
	if offOf(ref) == 0 {
		t.loose++
	}
	t.trim(seed, seg)
}

// dropTail drops block ref, at position pos of segment h, when it is the last block of
// its segment (not the first) with one seq and no branch child, as a removal leaf
// meets almost every block, and reports whether it did (dropKey's case, which the
// caller settles the same way). Its byte is read once, its parent is in the same
// segment and no child is to reconnect; its prefix is read only where the index keeps
// the key.
func (w *Worker) dropTail(env *Env, ref uint32, h *segHdr, pos uint32) bool {
	t := &w.keys
	off := offOf(ref)
	if off == 0 || off+1 != uint32(h.n) {
		return false
	}
	metas := h.at + uint32(segCaps[h.class])
	mw := &t.ar[metas+off/8]
	sh := 8 * (off % 8)
	if uint8(*mw>>sh) != 1 {
		return false
	}
	*mw &^= 0xff << sh
	t.held--
	if env.Indexed(pos) {
		w.emitFP(env, shard.OpRemove, env.fingerprint(key{prefix: t.ar[h.at+off], pos: pos, ns: h.ns}))
	}
	p := off - 1 // the parent block, in this segment
	if t.seqsOf(ref-1, uint8(t.ar[metas+p/8]>>(8*(p%8)))) == 0 {
		w.holes-- // the dropped key was itself a hole
		t.trim(&env.Seed, segOf(ref))
		return true
	}
	if t.full {
		t.trim(&env.Seed, segOf(ref))
		return true
	}
	// Its parent block is held, so trim would drop this block alone (not indexed: not
	// a segment's first, in a table that is not full) and stop.
	h.n--
	t.blocks--
	t.putOffShrink(segOf(ref))
	return true
}

// dropTailRun drops the last block of segment h (ref) and up to n-1 blocks before it,
// as far as each is dropTail's case (one seq, no branch child, not the segment's
// first), and returns how many it dropped (0: ref is not dropTail's case). The caller
// has checked that the n blocks are ref and the ones below it in its segment. The
// blocks above the last one dropped have their parents, the next ones down, held, so
// they go as dropTail takes such a block, as one range (their bytes cleared, the counts
// changed once); the last one goes through dropTail, whose parent check decides how.
func (w *Worker) dropTailRun(env *Env, ref uint32, h *segHdr, n int) int {
	t := &w.keys
	off := offOf(ref)
	if n > int(off) || off+1 != uint32(h.n) {
		return 0 // (block 0 is never dropTail's case)
	}
	m := 1 // blocks of one seq and no child from ref down, at most n
	metas := t.ar[h.at+uint32(segCaps[h.class]):]
	if !t.full && uint8(metas[off/8]>>(8*(off%8))) == 1 {
		// Block o goes here when its parent, o-1, is of the run too (one seq, so held).
		for o := off; m < n && uint8(metas[(o-1)/8]>>(8*((o-1)%8))) == 1; o-- {
			metas[o/8] &^= 0xff << (8 * (o % 8))
			if pos := h.pos0 + o; env.Indexed(pos) {
				w.emitFP(env, shard.OpRemove, env.fingerprint(key{prefix: t.ar[h.at+o], pos: pos, ns: h.ns}))
			}
			m++
		}
		if m > 1 {
			t.held -= int32(m - 1)
			h.n -= uint8(m - 1)
			t.blocks -= int32(m - 1)
			t.putOffShrink(segOf(ref))
		}
	}
	last := ref - uint32(m-1)
	if !w.dropTail(env, last, h, h.pos0+offOf(last)) {
		if m > 1 {
			panic("engine: worker dropped a run's blocks but not its last")
		}
		return 0
	}
	return m
}

// remove drops seqs the worker holds and returns how many it did not hold. A window of
// up to TouchGroup seqs at a time leaves the seq table first (read ahead, then
// delRun), then its blocks leave the key table, in the seqs' order; a seq repeated in
// the removal is found the first time only, as one at a time would.
func (w *Worker) remove(env *Env, seqs []uint64) (skipped int) {
	if len(seqs) == 1 {
		return w.removeOne(env, seqs[0])
	}
	var dc DigestCell // the entries dropped from namespace dns since the last change of namespace
	var dns uint32
	var hs [TouchGroup]uint64 // the window's mixed hashes
	var refs [TouchGroup]uint32
	for j := 0; j < len(seqs); j += TouchGroup {
		win := seqs[j:min(j+TouchGroup, len(seqs))]
		w.touchSeqs(env, hs[:], win)
		w.seqs.delRun(hs[:len(win)], refs[:])
		for k := 0; k < len(win); {
			if refs[k] == 0 {
				skipped++
				k++
				continue
			}
			ref := refs[k] - 1
			h := &w.keys.segs[segOf(ref)]
			pos, ns := h.pos0+offOf(ref), h.ns
			if ns != dns {
				w.dg.addCell(dns, dc)
				dc, dns = DigestCell{}, ns
			}
			// The seqs after it that name the blocks before it in its segment, as a
			// chain's eviction leaf first does: dropped together where they may be.
			n := 1
			for k+n < len(win) && uint32(n) < offOf(ref) && refs[k+n] == refs[k]-uint32(n) {
				n++
			}
			if n = w.dropTailRun(env, ref, h, n); n == 0 {
				w.dropHeld(env, ref, w.keys.key(ref))
				n = 1
			}
			for j, s := range win[k : k+n] {
				dc.Sum -= digestTerm(s, pos-uint32(j))
			}
			dc.N -= int64(n)
			k += n
		}
	}
	w.dg.addCell(dns, dc)
	w.seqs.shrink()
	w.keys.settleShrink()
	if w.keys.sparse() {
		w.compact(&env.Seed)
	}
	return skipped
}

// removeOne is remove of one seq, the trace logs' usual removal event: without the
// windows' loops around it and without a read-ahead of the slot it reads next. Through
// the windows a per-event pass of the conversation trace took 228.8M instructions
// against 196.3-201.4M (scripts/instructions.sh events), 240-280 more a removal.
func (w *Worker) removeOne(env *Env, seq uint64) (skipped int) {
	ref, ok := w.seqs.delMixed(env.Seed.Mix64(seq))
	if !ok {
		return 1
	}
	h := &w.keys.segs[segOf(ref)]
	pos := h.pos0 + offOf(ref)
	w.dg.add(h.ns, digestTerm(seq, pos), -1)
	if !w.dropTail(env, ref, h, pos) {
		w.dropHeld(env, ref, w.keys.key(ref))
	}
	w.keys.settleShrink()
	if w.keys.sparse() {
		w.compact(&env.Seed)
	}
	return 0
}

// touchBlocks is touchSeqs of the blocks' engine hashes.
func (w *Worker) touchBlocks(env *Env, hs []uint64, blocks []Block) {
	g := hs[:min(len(blocks), len(hs))]
	for j := range g {
		g[j] = env.Seed.Mix64(blocks[j].Seq)
	}
	w.out.sink += w.seqs.touch(g)
}

// TouchSeqs reads ahead the seq slots of the first TouchGroup of seqs in primary w's
// tier t (seqTable.touch), for removals of them that are about to come: it changes
// nothing. Holder of w's mutex, with an outbox lent.
func (w *Worker) TouchSeqs(env *Env, t Tier, seqs []uint64) {
	if c := w.TierOf(env, t, false); c != nil && len(seqs) > 0 {
		var hs [TouchGroup]uint64
		c.touchSeqs(env, hs[:], seqs)
	}
}

// touchSeqs puts the mixed hashes of the first len(hs) seqs (fewer if seqs is shorter)
// in hs and reads their home slots ahead (seqTable.touch).
func (w *Worker) touchSeqs(env *Env, hs []uint64, seqs []uint64) {
	g := hs[:min(len(seqs), len(hs))]
	for j := range g {
		g[j] = env.Seed.Mix64(seqs[j])
	}
	w.out.sink += w.seqs.touch(g)
}

// compact rebuilds the key table densely (keyTable.compact) and points the seq slots at
// the blocks' new refs, so a worker that shrank gives its memory back (blocks never
// move otherwise). O(blocks); it runs only once the tables are mostly empty or unheld.
func (w *Worker) compact(seed *table.Seed) {
	w.keys.compact(seed, func(to func(uint32) uint32) {
		for i := range w.seqs.slots {
			if s := &w.seqs.slots[i]; s.ref != 0 {
				s.ref = to(s.ref-1) + 1
			}
		}
	})
}

// Publish makes the gap flags and sizes of primary w and its components (and the
// engine's block counts) visible to queries. Holder of w's mutex; the engine calls it at
// flush, with the deltas of the events it publishes (see the engine's flush for the
// order on the locked index).
func (w *Worker) Publish(env *Env) {
	w.publish(env)
	w.Components(func(_ Tier, c *Worker) { c.publish(env) })
}

// publish is Publish of one tier.
func (w *Worker) publish(env *Env) {
	if g := w.holes > 0; g != w.gappy.Load() {
		w.gappy.Store(g)
	}
	if d := int64(w.seqs.n) - w.size.Load(); d != 0 {
		env.addBlocks(w.tier, d)
		w.size.Store(int64(w.seqs.n))
	}
}

// Clear drops every block of primary w on every tier (its declared groups excepted:
// DropGroups). Holder of w's mutex, with an outbox lent.
func (w *Worker) Clear(env *Env) {
	w.clear(env)
	w.Components(func(_ Tier, c *Worker) { c.clear(env) })
}

// clear drops every block of one tier.
func (w *Worker) clear(env *Env) {
	t := &w.keys
	for seg := range t.segs {
		for off := uint32(0); off < uint32(t.segs[seg].n); off++ {
			if ref := refOf(uint32(seg), off); t.seqs(ref) > 0 {
				w.emit(env, shard.OpRemove, t.key(ref))
			}
		}
	}
	w.seqs = seqTable{}
	w.keys = keyTable{full: w.keys.full}
	w.holes = 0
	w.dg.reset()
}

// emitAdd tells the index that w holds k (fingerprint fp) now, where the index keeps
// k's position (Env.Indexed).
func (w *Worker) emitAdd(env *Env, k key, fp uint64) {
	if env.Indexed(k.pos) {
		w.emitFP(env, shard.OpAdd, fp)
	}
}

// emit queues op for k where the index keeps k's position, hashing k only there.
func (w *Worker) emit(env *Env, op uint8, k key) {
	if env.Indexed(k.pos) {
		w.emitFP(env, op, env.fingerprint(k))
	}
}

// emitFP queues a delta of the key whose fingerprint is fp for the key's shard.
func (w *Worker) emitFP(env *Env, op uint8, fp uint64) {
	s := env.OwnerOf(fp)
	o := w.out
	o.Pend[s] = append(o.Pend[s], shard.NewDelta(op, fp, w.wid))
	o.Pending++
}
