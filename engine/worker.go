package engine

import (
	"slices"
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
	// size is the number of distinct engine hashes held: the query's size(w).
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
	// pend collects this event's deltas per shard; reused across events.
	pend [][]delta
	// scratch holds a sorted copy of an event's seqs for the duplicate check.
	scratch []uint64
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
	s := w.scratch[:0]
	for _, b := range blocks {
		if hasParent && b.Seq == parent {
			return false
		}
		s = append(s, b.Seq)
	}
	slices.Sort(s)
	w.scratch = s
	for i := 1; i < len(s); i++ {
		if s[i] == s[i-1] {
			return false
		}
	}
	return true
}

// store applies an accepted stored event: the parent (if any) is held, validateStore
// passed, and positions fit. Called with mu held.
func (w *worker) store(e *Engine, pos uint32, prefix, parentPrefix uint64, hasParent bool, blocks []Block) {
	for i, b := range blocks {
		if i > 0 || hasParent {
			parentPrefix = prefix
			prefix = hash.Next(prefix, b.Content)
			pos++
		} else {
			prefix = b.Content
		}
		if opos, opre, ok := w.seqs.get(b.Seq); ok {
			if opos == pos && opre == prefix {
				continue // a duplicate never inflates anything
			}
			w.dropKey(e, opos, opre) // last write wins: the seq moves
		} else {
			w.size.Add(1)
			e.blocks.Add(1)
		}
		w.seqs.put(b.Seq, pos, prefix)
		w.addKey(e, pos, prefix, parentPrefix)
	}
}

// addKey counts one more engine hash under (pos, prefix).
func (w *worker) addKey(e *Engine, pos uint32, prefix, parent uint64) {
	i := w.keys.findOrAdd(prefix, pos, parent)
	k := &w.keys.slots[i]
	k.seqs++
	if k.seqs > 1 {
		return
	}
	// The key became held: its children that were holes are reconnected, it tells the
	// index, and it becomes a child of its parent key.
	w.holes -= int(k.kids)
	w.emit(e, opAdd, pos, prefix)
	if pos > 0 {
		p := &w.keys.slots[w.keys.findOrAdd(parent, pos-1, 0)]
		p.kids++
		if p.seqs == 0 {
			w.holes++
		}
	}
}

// dropKey counts one engine hash less under (pos, prefix), which must be held.
func (w *worker) dropKey(e *Engine, pos uint32, prefix uint64) {
	i := w.keys.find(prefix, pos)
	if i < 0 {
		panic("engine: worker key table lost a held key")
	}
	k := &w.keys.slots[i]
	k.seqs--
	if k.seqs > 0 {
		return
	}
	w.holes += int(k.kids)
	w.emit(e, opRemove, pos, prefix)
	parent := k.parent
	if k.kids == 0 {
		w.keys.delAt(uint64(i))
	}
	if pos > 0 {
		j := w.keys.find(parent, pos-1)
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
		pos, prefix, ok := w.seqs.get(s)
		if !ok {
			skipped++
			continue
		}
		w.seqs.del(s)
		w.size.Add(-1)
		e.blocks.Add(-1)
		w.dropKey(e, pos, prefix)
	}
	return skipped
}

// clear drops every block.
func (w *worker) clear(e *Engine) {
	for i := range w.keys.slots {
		k := &w.keys.slots[i]
		if k.seqs > 0 {
			w.emit(e, opRemove, k.pos, k.prefix)
		}
	}
	e.blocks.Add(-w.size.Load())
	w.size.Store(0)
	w.seqs = seqTable{}
	w.keys = keyTable{}
	w.holes = 0
}

func (w *worker) emit(e *Engine, op uint8, pos uint32, prefix uint64) {
	s := e.owner(prefix, pos)
	w.pend[s] = append(w.pend[s], delta{prefix: prefix, pos: pos, wid: w.wid, op: op})
}

// flush publishes this event's deltas to the shard rings and the worker's gap flag.
// Called with mu held, so one worker's deltas enter each ring in event order.
func (w *worker) flush(e *Engine) error {
	w.gappy.Store(w.holes > 0)
	var err error
	for s := range w.pend {
		if len(w.pend[s]) == 0 {
			continue
		}
		if _, perr := e.shards[s].ring.PushBatch(w.pend[s]); perr != nil && err == nil {
			err = perr
		}
		clear(w.pend[s])
		w.pend[s] = w.pend[s][:0]
	}
	return err
}

// owner returns the shard that owns key (pos, prefix). Keys are spread by a hash of both,
// so the hot first positions that every request shares land on different shards.
func (e *Engine) owner(prefix uint64, pos uint32) int {
	return int(((shard.KeyHash(prefix, pos) >> 32) * uint64(len(e.shards))) >> 32)
}
