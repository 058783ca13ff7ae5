package engine

import (
	"fmt"
	"github.com/kvindex/kvindex/engine/internal/chain"
	"math"
	"sync/atomic"

	"github.com/kvindex/kvindex/internal/table"
)

// Tier is the storage tier of a worker's block copy: the engine's device (GPU) memory,
// host memory, or disk and remote storage. An engine that offloads (vLLM's offloading
// connector, LMCache, SGLang's hierarchical cache) publishes stored and removed events
// per medium; an ingester maps each medium to a tier (package server has the defaults).
//
// Tiers are independent copies: a worker may hold one engine hash on several tiers at
// once, a removal names one tier, and a query reports how far each worker's prefix
// reaches when the slower tiers are counted too (Match.Tiers).
type Tier uint8

// The tiers, fastest first. TierDevice is the zero value: events without a tier are
// device events, as before tiers existed.
const (
	TierDevice Tier = iota
	TierHost
	TierDisk
	// NumTiers is the number of tiers.
	NumTiers = 3
)

var tierNames = [NumTiers]string{"device", "host", "disk"}

// String returns the tier's name: "device", "host" or "disk".
func (t Tier) String() string {
	if t < NumTiers {
		return tierNames[t]
	}
	return fmt.Sprintf("tier(%d)", uint8(t))
}

// ParseTier returns the tier named name ("device", "host" or "disk"), or an error
// wrapping ErrInvalidEvent.
func ParseTier(name string) (Tier, error) {
	for t, n := range tierNames {
		if n == name {
			return Tier(t), nil
		}
	}
	return 0, fmt.Errorf("%w: unknown tier %q (want device, host or disk)", ErrInvalidEvent, name)
}

// Weights gives each tier's value per block for Match.Weighted: a block that only a
// slower tier holds saves less than one in device memory (it must be loaded first).
type Weights [NumTiers]float64

// DefaultWeights are NVIDIA Dynamo's: device 1, a host extension 0.75, a disk extension
// 0.25.
var DefaultWeights = Weights{1, 0.75, 0.25}

// Validate reports whether every weight is finite and in [0, 1] (an error wrapping
// ErrInvalidConfig otherwise).
func (w Weights) Validate() error {
	for t, x := range w {
		if math.IsNaN(x) || x < 0 || x > 1 {
			return fmt.Errorf("%w: weight of tier %s is %v (want 0..1)", ErrInvalidConfig, Tier(t), x)
		}
	}
	return nil
}

// Weighted returns the match's weighted score: each leading block counted at the weight
// of the fastest tier that holds it, i.e. w[0]*Tiers[0] + w[1]*(Tiers[1]-Tiers[0]) +
// w[2]*(Tiers[2]-Tiers[1]). Predicted blocks count as device blocks.
func (m *Match) Weighted(w Weights) float64 {
	s, prev := 0.0, 0
	for t := range NumTiers {
		s += w[t] * float64(m.Tiers[t]-prev)
		prev = m.Tiers[t]
	}
	return s
}

// tierLink ties a worker's tier components together. A worker that has only ever held
// device blocks has none (tl == nil): single-tier fleets pay nothing. The first event of
// another tier creates the link and that tier's component, a worker of its own (its own
// seq and key tables, holes and worker id in the shards) that is not in the name table.
// Every component is guarded by the primary's mutex; their atomics are published by the
// primary's flush.
//
// Queries read the link without the lock, so it is published atomically: a component is
// complete (its id registered) before it is stored in comps.
type tierLink struct {
	primary *worker
	comps   [NumTiers - 1]atomic.Pointer[worker] // host, disk; nil until used
}

// isComponent reports whether w is a non-device tier component (not a named worker).
func (w *worker) isComponent() bool { return w.tier != TierDevice }

// tierOf returns the component of primary w (locked) for tier t, creating it when create
// is set; nil when there is none. The component shares the caller's outbox.
func (e *Engine) tierOf(w *worker, t Tier, create bool) *worker {
	if t == TierDevice {
		return w
	}
	tl := w.tl.Load()
	if tl == nil {
		if !create {
			return nil
		}
		// Its tiers look keys up by key alone (parentOf's fallback, copies, tierLengths):
		// the device table indexes every record from now on.
		w.keys.setFull(&e.seed, true)
		tl = &tierLink{primary: w}
		w.tl.Store(tl)
	}
	c := tl.comps[t-1].Load()
	if c == nil {
		if !create {
			return nil
		}
		c = e.registerComponent(w, tl, t)
		tl.comps[t-1].Store(c)
	}
	c.out = w.out
	return c
}

// components calls f for each existing component of primary w, fastest tier first.
func (w *worker) components(f func(t Tier, c *worker)) {
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

// parentOf finds the parent of a store on tier t of primary w (locked): on that tier
// first, then on the others, fastest first (an offloaded block may hang under a block
// the worker holds only in device memory). It returns the component holding it and the
// parent's record id there.
func (e *Engine) parentOf(w *worker, t Tier, parent uint64) (holder *worker, rid uint32, ok bool) {
	if c := e.tierOf(w, t, false); c != nil {
		if rid, ok = c.seqs.get(&e.seed, parent); ok {
			return c, rid, true
		}
	}
	holder, rid = w.otherTierHolder(e, t, parent)
	return holder, rid, holder != nil
}

// registerComponent gives a new tier component of primary p a worker id.
func (e *Engine) registerComponent(p *worker, tl *tierLink, t Tier) *worker {
	e.regMu.Lock()
	defer e.regMu.Unlock()
	c := &worker{name: p.name, tier: t}
	c.keys.full = true
	c.tl.Store(tl)
	c.wid = e.allocIDLocked()
	(*e.slots.Load())[c.wid].Store(c)
	return c
}

// holds reports whether w (whose lock the caller holds, and whose tables are full: it
// has tier components) holds key k.
func (w *worker) holds(seed *table.Seed, k key) bool {
	rid, ok := w.keys.find(seed, k)
	return ok && w.keys.seqs(rid) > 0
}

// tierLengths computes a multi-tier worker's cumulative tier lengths for a query when
// one of its components is gappy, from the components' scores (g) and its own tables,
// under its lock (see DESIGN.md, "Tiers"). Every component holds the positions before
// its score (its first miss), so tier t's length is at least the best score of the
// components of tiers 0..t; a gap-free component holds nothing past its first miss (the
// prefix-closure lemma), so past that only the gappy components are looked up, position
// by position, while one of them holds the position. size is the worker's size at the
// same moment.
func (e *Engine) tierLengths(q *query, p *worker, content []uint64, g *tierGroup) (tiers [NumTiers]int, size int, ok bool) {
	p.lockMu()
	defer p.unlockMu()
	if p.dead {
		return tiers, 0, false
	}
	var gappy [NumTiers]*worker // the gappy components, by tier
	size = int(p.seqs.n)
	if p.holes > 0 || g.gappy {
		gappy[TierDevice] = p
	}
	p.components(func(t Tier, c *worker) {
		size += int(c.seqs.n)
		if c.holes > 0 || g.gappy {
			gappy[t] = c
		}
	})
	best := 0
	for t := range NumTiers {
		best = max(best, g.scores[t])
		x := best
		for x < len(content) && q.heldByAny(e, gappy[:t+1], content, x) {
			x++
		}
		best = x
		tiers[t] = best
	}
	return tiers, size, true
}

// heldByAny reports whether one of comps (nil entries skipped; their worker locked)
// holds the query's key at position x.
func (q *query) heldByAny(e *Engine, comps []*worker, content []uint64, x int) bool {
	var k key
	computed := false
	for _, c := range comps {
		if c == nil {
			continue
		}
		if !computed {
			k, computed = key{prefix: q.tierPrefix(&e.chain, content, x), pos: uint32(x), ns: q.ns}, true
		}
		if c.holds(&e.seed, k) {
			return true
		}
	}
	return false
}

// tierPrefix returns the prefix hash of the query's position x, computing the chain as
// deep as it is asked for once per query (q.tpre; collectTiers empties it).
func (q *query) tierPrefix(c *chain.Chain, content []uint64, x int) uint64 {
	if len(q.tpre) == 0 {
		q.tpre = append(q.tpre, content[0])
	}
	for h := q.tpre[len(q.tpre)-1]; len(q.tpre) <= x; {
		h = c.Step(h, content[len(q.tpre)], uint32(len(q.tpre)))
		q.tpre = append(q.tpre, h)
	}
	return q.tpre[x]
}

// tierGroup is collectTiers' scratch for one multi-tier worker: its components' scores
// (0 for a component that is not a candidate) and whether any candidate was gappy when
// admitted.
type tierGroup struct {
	stamp  uint32
	gappy  bool
	scores [NumTiers]int
}

// collectTiers appends one match per multi-tier worker among the query's candidates
// (every candidate whose worker has a tier link; collect has checked that each still
// names its worker).
//
// A component that is not gappy holds an initial segment of the query's positions (the
// prefix-closure lemma, DESIGN.md), so its score is its whole contribution, and the
// union of initial segments is the longest of them: tier t's cumulative length is the
// maximum score over the components of tiers 0..t. That needs every component of the
// worker to be gap-free, candidates or not (a gappy host copy that misses position 0 may
// still extend the device prefix); otherwise the worker's lengths come from its own
// tables (tierLengths).
func (e *Engine) collectTiers(q *query, content []uint64, dst []Match) []Match {
	now := e.workers()
	if len(q.tgrp) < len(now) {
		q.tgrp = make([]tierGroup, len(now)+len(now)/4)
		q.tstamp = 0
	}
	q.tstamp++
	if q.tstamp == 0 {
		clear(q.tgrp)
		q.tstamp = 1
	}
	q.tlist, q.tpre = q.tlist[:0], q.tpre[:0]
	for i := range q.cands {
		c := &q.cands[i]
		tl := c.w.tl.Load()
		if tl == nil || int(c.wid) >= len(now) || now[c.wid].Load() != c.w {
			continue
		}
		p := tl.primary
		if int(p.wid) >= len(q.tgrp) || now[p.wid].Load() != p {
			continue // the worker was removed meanwhile
		}
		g := &q.tgrp[p.wid]
		if g.stamp != q.tstamp {
			*g = tierGroup{stamp: q.tstamp}
			q.tlist = append(q.tlist, p)
		}
		g.scores[c.w.tier] = c.score
		g.gappy = g.gappy || c.gappy
	}
	for _, p := range q.tlist {
		g := &q.tgrp[p.wid]
		gappy := g.gappy || p.gappy.Load()
		p.components(func(_ Tier, c *worker) { gappy = gappy || c.gappy.Load() })
		var tiers [NumTiers]int
		var size int
		if gappy {
			var ok bool
			if tiers, size, ok = e.tierLengths(q, p, content, g); !ok {
				continue
			}
		} else {
			best := 0
			for t := range NumTiers {
				best = max(best, g.scores[t])
				tiers[t] = best
			}
			size = p.totalSize()
		}
		if s := tiers[NumTiers-1]; s > 0 {
			dst = append(dst, Match{Worker: p.name, Score: s, Size: size, Tiers: tiers})
		}
	}
	clear(q.tlist) // the pooled query must not keep workers alive
	q.tlist = q.tlist[:0]
	return dst
}

// copyLocked applies a copied event (see EventCopied) to primary w (locked): each seq
// that another tier holds is stored on tier t with the key and parent key of the
// fastest copy. It returns how many seqs it skipped.
func (e *Engine) copyLocked(w *worker, t Tier, seqs []uint64) (skipped int) {
	for _, s := range seqs {
		src, rid := w.otherTierHolder(e, t, s)
		if src == nil {
			if c := e.tierOf(w, t, false); c == nil || !c.seqs.has(&e.seed, s) {
				skipped++
			}
			continue
		}
		r := &src.keys.recs[rid]
		k := src.keys.key(rid)
		var parentPrefix uint64
		if k.pos > 0 {
			parentPrefix = src.keys.recs[r.parent-1].prefix()
		}
		e.tierOf(w, t, true).storeKey(e, s, k, parentPrefix)
	}
	return skipped
}

// otherTierHolder returns the fastest tier component of primary w (locked) other than
// tier t that holds seq, and the seq's record there, or nil: the source of a copy to
// tier t, and parentOf's fallback.
func (w *worker) otherTierHolder(e *Engine, t Tier, seq uint64) (*worker, uint32) {
	for u := range Tier(NumTiers) {
		if u == t {
			continue
		}
		if c := e.tierOf(w, u, false); c != nil {
			if rid, ok := c.seqs.get(&e.seed, seq); ok {
				return c, rid
			}
		}
	}
	return nil, 0
}

// storeKey makes w (locked) hold seq at key k, whose parent key has prefix parentPrefix:
// a no-op if it holds seq there already, a move (last write wins) if it holds it
// elsewhere.
func (w *worker) storeKey(e *Engine, seq uint64, k key, parentPrefix uint64) {
	// The seq's slot stays valid below: dropKey and addKey touch only the key table.
	si, sh, found := w.seqs.locate(&e.seed, seq)
	if found {
		old := w.seqs.slots[si].ref - 1
		if w.keys.is(old, k, w.keys.locOf(k, false)) {
			return
		}
		ok := w.keys.key(old)
		w.dg.add(ok.ns, digestTerm(seq, ok.pos), -1)
		w.dropKey(e, old)
	}
	w.seqs.setAt(si, sh, w.addKey(e, k, parentPrefix, 0))
	w.dg.add(k.ns, digestTerm(seq, k.pos), 1)
}

// has reports whether the table holds seq.
func (t *seqTable) has(seed *table.Seed, seq uint64) bool {
	_, ok := t.get(seed, seq)
	return ok
}

// totalSize is the worker's size over every tier (the query's size(w)), read without its
// lock.
func (w *worker) totalSize() int {
	n := int(w.size.Load() + w.hybSize.Load())
	w.components(func(_ Tier, c *worker) { n += int(c.size.Load()) })
	return n
}
