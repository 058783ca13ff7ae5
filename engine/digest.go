package engine

import (
	"fmt"
	"slices"
	"sort"

	"github.com/kvindex/kvindex/internal/table"
)

// Digests: an order-independent summary of what each worker holds, so that two replicas
// (or a replica and a snapshot) can tell which workers they disagree on without
// exchanging the blocks.
//
// What a digest covers: the worker's entries, each an engine hash (Block.Seq) held in a
// namespace, on a tier, in a KV-cache group (0 for a worker that declared none), at a
// position (its block's depth; for a declared group, its end in units). Two tables hold
// the same entries exactly when their digests are equal, up to 64-bit collisions. The
// prefix a block is held under is not in it: the engine names prefixes by a chain keyed
// per engine, which two replicas do not share, so a seq held at the same depth under
// another parent on one replica is not told apart. Engines name blocks by a hash of the
// tokens and of the parent's hash (vLLM, SGLang), so a seq under another parent is in
// practice another seq.
//
// How: each entry contributes term(seq, position), and each table keeps, per namespace,
// the wrapping sum of its entries' terms and their count (a digestCell), updated where
// an entry becomes held or stops being held (worker.store, remove, clear, storeKey,
// Restore's loadTier; hybrid.put, remove): O(1) per entry, no allocation but the first
// entry of a namespace other than the default. A digest is read under the worker's
// mutex by combining its cells: each non-empty cell (tier, group, namespace name, sum,
// count) is mixed into one 64-bit value, and the worker's digest is the sum of its
// cells' values, so that it too is independent of the order the entries arrived in.
// None of it depends on the engine's seeds: replicas with different seeds and shard
// counts, the locked index, and a restored snapshot agree on equal state.
//
// Not keyed by a secret: a client that chooses seqs could make two different holdings
// of a worker sum alike. A digest is a consistency check between replicas fed the same
// events, not a proof against a hostile publisher.

// Digest summarises a set of held entries.
type Digest struct {
	// Sum is the order-independent digest: 0 when Blocks is 0.
	Sum uint64
	// Blocks is how many entries it covers ((group, tier, seq) triples: the worker's
	// size, as WorkerSize).
	Blocks int
}

// WorkerDigest is one worker's digest, over all of it and per namespace.
type WorkerDigest struct {
	// Digest covers every namespace: its Sum is the wrapping sum of the namespaces'.
	Digest
	// Namespaces has a digest per namespace the worker holds blocks in ("" is the
	// default namespace).
	Namespaces map[string]Digest
}

// digestCell is one table's entries in one namespace: the wrapping sum of their terms
// and their count.
type digestCell struct {
	sum uint64
	n   int64
}

// digests is one table's cells: the default namespace's inline, the others by engine
// namespace id (an entry leaves the map when its count drops to 0, so a namespace the
// sweep drops has none). Owned like the table by the holder of the worker's mutex.
type digests struct {
	def   digestCell
	other map[uint32]digestCell
}

// add adds term t (sign: +1 held, -1 no longer held) to namespace ns.
func (d *digests) add(ns uint32, t uint64, sign int64) {
	if ns == 0 {
		d.def.sum += t * uint64(sign)
		d.def.n += sign
		return
	}
	if d.other == nil {
		d.other = make(map[uint32]digestCell)
	}
	c := d.other[ns]
	c.sum += t * uint64(sign)
	c.n += sign
	if c.n == 0 {
		delete(d.other, ns)
		return
	}
	d.other[ns] = c
}

// addCell adds a namespace's accumulated change (a stored event's: every block in one
// namespace).
func (d *digests) addCell(ns uint32, c digestCell) {
	if c.n == 0 && c.sum == 0 {
		return
	}
	if ns == 0 {
		d.def.sum += c.sum
		d.def.n += c.n
		return
	}
	if d.other == nil {
		d.other = make(map[uint32]digestCell)
	}
	o := d.other[ns]
	o.sum += c.sum
	o.n += c.n
	if o.n == 0 {
		delete(d.other, ns)
		return
	}
	d.other[ns] = o
}

// reset empties d (keeping its map).
func (d *digests) reset() {
	d.def = digestCell{}
	clear(d.other)
}

// each calls f for each non-empty cell.
func (d *digests) each(f func(ns uint32, c digestCell)) {
	if d.def.n != 0 {
		f(0, d.def)
	}
	for ns, c := range d.other {
		f(ns, c)
	}
}

const (
	digestGolden = 0x9e3779b97f4a7c15
	digestOdd    = 0xd6e8feb86659fd93
)

// fmix64 is MurmurHash3's 64-bit finalizer: a bijection whose every output bit depends
// on every input bit.
func fmix64(x uint64) uint64 {
	x ^= x >> 33
	x *= 0xff51afd7ed558ccd
	x ^= x >> 33
	x *= 0xc4ceb9fe1a85ec53
	x ^= x >> 33
	return x
}

// digestTerm is the term of one entry: seq held at position pos (a dense table's key
// position; a group's end in units).
func digestTerm(seq uint64, pos uint32) uint64 {
	return fmix64(seq ^ (uint64(pos)*digestGolden + digestOdd))
}

// nameHash is a stable 64-bit hash of a name (FNV-1a, finalised), the same in every
// process.
func nameHash(s string) uint64 {
	h := uint64(0xcbf29ce484222325)
	for i := 0; i < len(s); i++ {
		h ^= uint64(s[i])
		h *= 0x100000001b3
	}
	return fmix64(h)
}

// cellValue mixes a non-empty cell with what it is a cell of: tier, group (0 for a
// dense table, 1 + its index for a declared group) and namespace name hash.
func cellValue(tier Tier, group int, nsHash uint64, c digestCell) uint64 {
	class := fmix64((uint64(tier)<<32 | uint64(uint32(group))) + digestOdd)
	return fmix64(fmix64(c.sum^class^nsHash) + uint64(c.n)*digestGolden)
}

// digestOf combines the cells of primary w (locked) per namespace id: its tier tables
// and, if it declared groups, theirs.
func (w *worker) digestOf(f func(ns uint32, tier Tier, group int, c digestCell)) {
	w.dg.each(func(ns uint32, c digestCell) { f(ns, TierDevice, 0, c) })
	w.components(func(t Tier, c *worker) {
		c.dg.each(func(ns uint32, cell digestCell) { f(ns, t, 0, cell) })
	})
	if h := w.hyb; h != nil {
		for gi := range h.groups {
			for t := range h.groups[gi].dg {
				h.groups[gi].dg[t].each(func(ns uint32, c digestCell) { f(ns, Tier(t), gi+1, c) })
			}
		}
	}
}

// workerDigest is w's digest (w locked). names maps namespace ids to names (nil: look
// them up when the worker holds blocks outside the default namespace).
func (e *Engine) workerDigest(w *worker, names map[uint32]string) (WorkerDigest, map[uint32]string) {
	out := WorkerDigest{Namespaces: map[string]Digest{}}
	def := nameHash("")
	w.digestOf(func(ns uint32, tier Tier, group int, c digestCell) {
		name, h := "", def
		if ns != 0 {
			if names == nil {
				names = e.namespaceNames()
			}
			name = names[ns]
			h = nameHash(name)
		}
		v := cellValue(tier, group, h, c)
		d := out.Namespaces[name]
		d.Sum += v
		d.Blocks += int(c.n)
		out.Namespaces[name] = d
		out.Sum += v
		out.Blocks += int(c.n)
	})
	return out, names
}

// Digest returns the digest of what worker holds (see WorkerDigest), read under its
// lock: it covers every event applied before the call, whether or not the shards have
// applied it yet. The second result is false for an unknown worker.
func (e *Engine) Digest(worker string) (WorkerDigest, bool) {
	for {
		w := e.lookup(worker)
		if w == nil {
			return WorkerDigest{}, false
		}
		w.lockMu()
		if w.dead { // removed since the lookup: look again
			w.unlockMu()
			continue
		}
		d, _ := e.workerDigest(w, nil)
		w.unlockMu()
		return d, true
	}
}

// Digests returns every known worker's digest, each read under its lock.
func (e *Engine) Digests() map[string]WorkerDigest {
	out := map[string]WorkerDigest{}
	var names map[uint32]string
	e.eachLiveWorker(func(wk *worker) { out[wk.name], names = e.workerDigest(wk, names) })
	return out
}

// NamespaceDigests combines per namespace the digests of every worker (keyed by worker
// name, so that two workers swapping their blocks differ): two engines holding the same
// blocks for the same workers in a namespace have equal digests for it.
func NamespaceDigests(ws map[string]WorkerDigest) map[string]Digest {
	out := map[string]Digest{}
	for name, wd := range ws {
		wh := nameHash(name)
		for ns, d := range wd.Namespaces {
			o := out[ns]
			o.Sum += fmix64(d.Sum ^ wh)
			o.Blocks += d.Blocks
			out[ns] = o
		}
	}
	return out
}

// DiffDigests compares two engines' digests (Digests of each) and returns the names of
// the workers whose digests differ, or that one of them does not know while the other
// holds blocks for, sorted. A worker known to one and empty or absent on the other does
// not differ.
func DiffDigests(a, b map[string]WorkerDigest) []string {
	var out []string
	for name, da := range a {
		db := b[name]
		if da.Sum != db.Sum || da.Blocks != db.Blocks {
			out = append(out, name)
		}
	}
	for name, db := range b {
		if _, ok := a[name]; !ok && db.Blocks != 0 {
			out = append(out, name)
		}
	}
	sort.Strings(out)
	return slices.Compact(out)
}

// recount returns d recomputed from scratch by f, which calls add for each entry.
func recount(f func(add func(ns uint32, seq uint64, pos uint32))) digests {
	var d digests
	f(func(ns uint32, seq uint64, pos uint32) { d.add(ns, digestTerm(seq, pos), 1) })
	return d
}

// equal reports whether d and o have the same cells.
func (d *digests) equal(o *digests) bool {
	return d.def == o.def && len(d.other) == len(o.other) && func() bool {
		for ns, c := range d.other {
			if o.other[ns] != c {
				return false
			}
		}
		return true
	}()
}

// checkDigest verifies one tier's digests against a recount of its seq table.
func (w *worker) checkDigest(seed *table.Seed) error {
	d := recount(func(add func(uint32, uint64, uint32)) {
		for i := range w.seqs.slots {
			if s := &w.seqs.slots[i]; s.ref != 0 {
				k := w.keys.key(s.ref - 1)
				add(k.ns, s.seq(seed), k.pos)
			}
		}
	})
	if !d.equal(&w.dg) {
		return fmt.Errorf("digest %+v %v kept, %+v %v recounted", w.dg.def, w.dg.other, d.def, d.other)
	}
	return nil
}

// checkDigest verifies a declared worker's group digests against a recount.
func (h *hybrid) checkDigest() error {
	for gi := range h.groups {
		g := &h.groups[gi]
		for t := range g.seqs {
			d := recount(func(add func(uint32, uint64, uint32)) {
				for seq, k := range g.seqs[t] {
					add(k.ns, seq, k.end)
				}
			})
			if !d.equal(&g.dg[t]) {
				return fmt.Errorf("group %d, %s tier: digest kept and recounted differ", gi, Tier(t))
			}
		}
	}
	return nil
}
