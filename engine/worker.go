package engine

import (
	"sync"
	"sync/atomic"

	"github.com/kvindex/kvindex/hash"
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
	// gappy is true while holes > 0, i.e. while some held key's parent key is not held.
	// Queries may only jump over a stride for workers whose gappy is false.
	gappy atomic.Bool

	name string
	wid  uint32

	mu sync.Mutex
	// dead is set by RemoveWorker; a caller that finds it set looks the name up again.
	dead  bool
	seqs  seqTable
	keys  keyTable
	holes int
	// events and skipped are this worker's changes to the engine-wide event and
	// skipped-removal counters since its last flush, which publishes them (and the block
	// count's change, seqs.n - size): one shared atomic update per flush rather than
	// several per event keeps producers of different workers from bouncing the counters'
	// cache line between cores.
	events, skipped uint64
	// cursor is the stream position of the last event applied that carried one.
	cursor uint64
	// npend counts the deltas in pend.
	npend int
	// pend collects this event's deltas per shard; reused across events.
	pend [][]delta
	// seen is the duplicate check's scratch set.
	seen seqSet
}

// validateStore checks the parts of a stored event that do not depend on state: no seq
// twice, no seq equal to the parent.
func (w *worker) validateStore(parent uint64, hasParent bool, blocks []Block) bool {
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
	w.seen.reset(len(blocks))
	defer w.seen.release()
	for _, b := range blocks {
		if hasParent && b.Seq == parent || !w.seen.add(b.Seq) {
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
	shift uint8
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
	s.shift = tableShift(len(s.slots))
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
func (s *seqSet) add(seq uint64) bool {
	mask := uint64(len(s.slots) - 1)
	for i := (mix64(seq) * 0x9e3779b97f4a7c15) >> s.shift; ; i = (i + 1) & mask {
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

// store applies an accepted stored event: the parent (if any) is held at key parent,
// validateStore passed, and positions fit. Called with mu held.
func (w *worker) store(e *Engine, ns uint32, parent key, hasParent bool, blocks []Block) {
	k := parent
	for i, b := range blocks {
		parentPrefix := k.prefix
		if i > 0 || hasParent {
			k = key{prefix: hash.Next(k.prefix, b.Content), pos: k.pos + 1, ns: ns}
		} else {
			k = key{prefix: b.Content, pos: 0, ns: ns}
		}
		old, had := w.seqs.put(b.Seq, k)
		if had && old == k {
			continue // a duplicate never inflates anything
		}
		if had {
			w.dropKey(e, old) // last write wins: the seq moves
		}
		w.addKey(e, k, parentPrefix)
	}
}

// addKey counts one more engine hash under k, whose parent key has prefix parent.
func (w *worker) addKey(e *Engine, k key, parent uint64) {
	i := w.keys.findOrAdd(k, parent)
	ke := &w.keys.slots[i]
	ke.seqs++
	if ke.seqs > 1 {
		return
	}
	// The key became held: its children that were holes are reconnected, it tells the
	// index, and it becomes a child of its parent key. A ghost entry created as some
	// child's parent (Restore loads children before parents) learns its own parent here.
	ke.parent = parent
	w.holes -= int(ke.kids)
	w.emit(e, opAdd, k)
	if k.pos > 0 {
		p := &w.keys.slots[w.keys.findOrAdd(key{prefix: parent, pos: k.pos - 1, ns: k.ns}, 0)]
		p.kids++
		if p.seqs == 0 {
			w.holes++
		}
	}
}

// dropKey counts one engine hash less under k, which must be held.
func (w *worker) dropKey(e *Engine, k key) {
	i := w.keys.find(k)
	if i < 0 {
		panic("engine: worker key table lost a held key")
	}
	ke := &w.keys.slots[i]
	ke.seqs--
	if ke.seqs > 0 {
		return
	}
	w.holes += int(ke.kids)
	w.emit(e, opRemove, k)
	parent := ke.parent
	if ke.kids == 0 {
		w.keys.delAt(uint64(i))
	}
	if k.pos > 0 {
		j := w.keys.find(key{prefix: parent, pos: k.pos - 1, ns: k.ns})
		if j < 0 {
			panic("engine: worker key table lost a parent key")
		}
		p := &w.keys.slots[j]
		p.kids--
		if p.seqs == 0 {
			w.holes-- // the dropped key was itself a hole
			if p.kids == 0 {
				w.keys.delAt(uint64(j))
			}
		}
	}
	w.keys.maybeShrink()
}

// remove drops seqs the worker holds and returns how many it did not hold.
func (w *worker) remove(e *Engine, seqs []uint64) (skipped int) {
	for _, s := range seqs {
		k, ok := w.seqs.del(s)
		if !ok {
			skipped++
			continue
		}
		w.dropKey(e, k)
	}
	return skipped
}

// clear drops every block.
func (w *worker) clear(e *Engine) {
	for i := range w.keys.slots {
		k := &w.keys.slots[i]
		if k.seqs > 0 {
			w.emit(e, opRemove, k.key())
		}
	}
	w.seqs = seqTable{}
	w.keys = keyTable{}
	w.holes = 0
}

func (w *worker) emit(e *Engine, op uint8, k key) {
	if e.onDelta != nil {
		e.onDelta(k)
	}
	s := e.owner(k)
	w.pend[s] = append(w.pend[s], delta{prefix: k.prefix, pos: k.pos, ns: k.ns, wid: w.wid, op: op})
	w.npend++
}

// maxPending bounds the deltas a worker holds back during a run of events (ApplyBatch)
// before it hands them to the shards, and the buffer capacity it keeps afterwards.
const maxPending = 1024

// flush publishes this event's deltas to the shard rings and the worker's gap flag and
// counters. Called with mu held, so one worker's deltas enter each ring in event order.
func (w *worker) flush(e *Engine) error {
	if g := w.holes > 0; g != w.gappy.Load() {
		w.gappy.Store(g)
	}
	if d := int64(w.seqs.n) - w.size.Load(); d != 0 {
		e.blocks.Add(d)
		w.size.Store(int64(w.seqs.n))
	}
	if w.events != 0 {
		e.events.Add(w.events)
		w.events = 0
	}
	if w.skipped != 0 {
		e.skippedRemovals.Add(w.skipped)
		w.skipped = 0
	}
	if e.dropDeltas {
		for s := range w.pend {
			w.pend[s] = w.pend[s][:0]
		}
		w.npend = 0
		return nil
	}
	if e.cfg.LockedIndex {
		e.locked.Lock()
		e.shards[0].apply(w.pend[0])
		e.locked.Unlock()
		w.pend[0] = w.pend[0][:0]
		w.npend = 0
		return nil
	}
	var err error
	for s := range w.pend {
		if len(w.pend[s]) == 0 {
			continue
		}
		if _, perr := e.shards[s].ring.PushBatch(w.pend[s]); perr != nil && err == nil {
			// A ring fails a push only once Close (or a failed shard) has closed it: the
			// caller gets the engine's reason, as from every other call.
			err = e.err()
		}
		clear(w.pend[s])
		w.pend[s] = w.pend[s][:0]
		if cap(w.pend[s]) > 4*maxPending {
			w.pend[s] = nil // a huge event passed: do not keep its buffer
		}
	}
	w.npend = 0
	return err
}

// owner returns the shard that owns key k. Keys are spread by a hash of all of k, so the
// hot first positions that every request shares land on different shards.
func (e *Engine) owner(k key) int {
	h := shard.KeyHash(shard.Key{Prefix: k.prefix, Pos: k.pos, NS: k.ns})
	return int(((h >> 32) * uint64(len(e.shards))) >> 32)
}
