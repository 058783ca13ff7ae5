package worker

import (
	"github.com/kvindex/kvindex/internal/table"
	"sync/atomic"

	"github.com/kvindex/kvindex/shard"
)

// tierLink ties a worker with its tier components. A worker that has only ever held
// device blocks has none (tl == nil): single-tier fleets pay nothing. The first event of
// another tier creates the link and that tier's component, a worker of its own (its own
// seq and key tables, holes and worker id in the shards) that is not in the engine's
// name table. Every component is guarded by the primary's mutex; their atomics are
// published by the primary's Publish.
//
// Queries read the link without the lock, so it is published atomically: a component is
// complete (its id registered) before it is stored in comps.
type tierLink struct {
	primary *Worker
	comps   [NumTiers - 1]atomic.Pointer[Worker] // host, disk; nil until used
}

// TierOf returns the component of primary w for tier t (w itself for Device), creating
// it when create is set (Env.Register names it); nil when there is none. The component
// shares w's outbox. Holder of w's mutex.
func (w *Worker) TierOf(env *Env, t Tier, create bool) *Worker {
	if t == Device {
		return w
	}
	tl := w.tl.Load()
	if tl == nil {
		if !create {
			return nil
		}
		// Its tiers look keys up by key alone (FindParent's fallback, copies, Holds): the
		// device table indexes every block from now on.
		w.keys.setFull(&env.Seed, true)
		tl = &tierLink{primary: w}
		w.tl.Store(tl)
	}
	c := tl.comps[t-1].Load()
	if c == nil {
		if !create {
			return nil
		}
		c = env.Register(w, t)
		tl.comps[t-1].Store(c)
	}
	c.out = w.out
	return c
}

// NewComponent returns a component of primary p for tier t under worker id wid, for
// Env.Register (which publishes it in the registry before TierOf links it). Holder of
// p's mutex.
func (p *Worker) NewComponent(t Tier, wid uint32) *Worker {
	c := &Worker{name: p.name, wid: wid, tier: t}
	c.keys.full = true
	c.tl.Store(p.tl.Load())
	return c
}

// Components calls f for each existing component of primary w, fastest tier first.
// Concurrent: a query may walk them without w's mutex (reading only their atomics).
func (w *Worker) Components(f func(t Tier, c *Worker)) {
	tl := w.tl.Load()
	if tl == nil {
		return
	}
	for i := range tl.comps {
		if c := tl.comps[i].Load(); c != nil {
			f(Tier(i+1), c)
		}
	}
}

// HasTiers reports whether w belongs to a worker with tier components (a primary that
// has held a block off the device tier, or one of its components). Concurrent.
func (w *Worker) HasTiers() bool { return w.tl.Load() != nil }

// Primary returns the primary of w's tier link (w itself, or the named worker a
// component belongs to), or nil when w has no tier components. Concurrent.
func (w *Worker) Primary() *Worker {
	if tl := w.tl.Load(); tl != nil {
		return tl.primary
	}
	return nil
}

// TiersGappy reports whether primary w or any of its components published a gap flag.
// Concurrent.
func (w *Worker) TiersGappy() bool {
	gappy := w.gappy.Load()
	w.Components(func(_ Tier, c *Worker) { gappy = gappy || c.gappy.Load() })
	return gappy
}

// TotalSize is the worker's size over every tier and group (the query's size(w)), as
// published. Concurrent.
func (w *Worker) TotalSize() int {
	n := int(w.size.Load() + w.hybSize.Load())
	w.Components(func(_ Tier, c *Worker) { n += int(c.size.Load()) })
	return n
}

// FindParent finds the parent seq of a store on tier t of primary w: on that tier
// first, then on the others, fastest first (an offloaded block may hang under a block
// the worker holds only in device memory). Holder of w's mutex.
func (w *Worker) FindParent(env *Env, t Tier, seq uint64) (Parent, bool) {
	var holder *Worker
	var rid uint32
	if c := w.TierOf(env, t, false); c != nil {
		if r, ok := c.seqs.get(&env.Seed, seq); ok {
			holder, rid = c, r
		}
	}
	if holder == nil {
		if holder, rid = w.otherTierHolder(env, t, seq); holder == nil {
			return Parent{}, false
		}
	}
	return Parent{Key: holder.keys.key(rid).shard(), Seq: seq, holder: holder, rid: rid}, true
}

// Holds reports whether w's own tables hold key k. They must be full (w has tier
// components). Holder of w's (or its primary's) mutex.
func (w *Worker) Holds(env *Env, k shard.Key) bool {
	rid, ok := w.keys.find(&env.Seed, key{prefix: k.Prefix, pos: k.Pos, ns: k.NS})
	return ok && w.keys.seqs(rid) > 0
}

// HeldRun returns how many leading positions of the query chain pre (pre[i] is the
// prefix hash at position x0+i, in namespace ns) w holds, w's own table only (a
// component's tier). x0 must be a multiple of SparseStride. closed says that w has no
// holes (its published gap flag is clear, read in the same hold as its tables): a
// segment's run is then found by bisection. The reader must exclude w's writers: w's
// mutex, or on the locked index the index's read lock (its writers hold the write lock
// while they change a worker's tables and publish its flag).
func (w *Worker) HeldRun(env *Env, ns uint32, x0 int, pre []uint64, closed bool) int {
	if x0%SparseStride != 0 {
		panic("worker: HeldRun from a position inside a stride")
	}
	return w.keys.heldRun(&env.Seed, ns, uint32(x0), pre, closed)
}

// Copy applies a copied event to primary w: each seq that another tier holds is
// stored on tier t with the key and parent key of the fastest copy. It returns how many
// seqs it skipped. Holder of w's mutex, with an outbox lent.
func (w *Worker) Copy(env *Env, t Tier, seqs []uint64) (skipped int) {
	for _, s := range seqs {
		src, rid := w.otherTierHolder(env, t, s)
		if src == nil {
			if c := w.TierOf(env, t, false); c == nil || !c.seqs.has(&env.Seed, s) {
				skipped++
			}
			continue
		}
		w.TierOf(env, t, true).storeKey(env, s, src.keys.key(rid), src.keys.parentPrefix(rid))
	}
	return skipped
}

// otherTierHolder returns the fastest tier component of primary w (locked) other than
// tier t that holds seq, and the seq's block there, or nil: the source of a copy to
// tier t, and FindParent's fallback.
func (w *Worker) otherTierHolder(env *Env, t Tier, seq uint64) (*Worker, uint32) {
	for u := range Tier(NumTiers) {
		if u == t {
			continue
		}
		if c := w.TierOf(env, u, false); c != nil {
			if rid, ok := c.seqs.get(&env.Seed, seq); ok {
				return c, rid
			}
		}
	}
	return nil, 0
}

// storeKey makes w (locked) hold seq at key k, whose parent key has prefix parentPrefix:
// a no-op if it holds seq there already, a move (last write wins) if it holds it
// elsewhere.
func (w *Worker) storeKey(env *Env, seq uint64, k key, parentPrefix uint64) {
	// The seq's slot stays valid below: dropKey and addKey touch only the key table.
	si, sh, found := w.seqs.locate(&env.Seed, seq)
	if found {
		old := w.seqs.slots[si].ref - 1
		if w.keys.is(old, k) {
			return
		}
		ok := w.keys.key(old)
		w.dg.add(ok.ns, digestTerm(seq, ok.pos), -1)
		w.dropKey(env, old, ok)
		w.keys.settleShrink()
	}
	w.seqs.setAt(si, sh, w.addKey(env, k, parentPrefix, 0, 1))
	w.dg.add(k.ns, digestTerm(seq, k.pos), 1)
}

// has reports whether the table holds seq.
func (t *seqTable) has(seed *table.Seed, seq uint64) bool {
	_, ok := t.get(seed, seq)
	return ok
}
