package worker

import (
	"fmt"

	"github.com/kvindex/kvindex/internal/table"
)

// Digests (the engine's digest.go says what they cover and why): each table keeps, per
// namespace, the wrapping sum of its entries' terms and their count, updated where an
// entry becomes held or stops being held (store, remove, clear, storeKey, LoadEntry;
// Hybrid.Put, Remove, Copy): O(1) per entry, no allocation but the first entry of a
// namespace other than the default. The engine combines the cells (EachDigestCell)
// under the worker's mutex.

// DigestCell is one table's entries in one namespace: the wrapping sum of their terms
// (digestTerm) and their count.
type DigestCell struct {
	Sum uint64
	N   int64
}

// digests is one table's cells: the default namespace's inline, the others by engine
// namespace id (an entry leaves the map when its count drops to 0, so a namespace the
// sweep drops has none). Owned like the table by the holder of the worker's mutex.
type digests struct {
	def   DigestCell
	other map[uint32]DigestCell
}

// add adds term t (sign: +1 held, -1 no longer held) to namespace ns.
func (d *digests) add(ns uint32, t uint64, sign int64) {
	if ns == 0 {
		d.def.Sum += t * uint64(sign)
		d.def.N += sign
		return
	}
	if d.other == nil {
		d.other = make(map[uint32]DigestCell)
	}
	c := d.other[ns]
	c.Sum += t * uint64(sign)
	c.N += sign
	if c.N == 0 {
		delete(d.other, ns)
		return
	}
	d.other[ns] = c
}

// addCell adds a namespace's accumulated change (a stored event's: every block in one
// namespace).
func (d *digests) addCell(ns uint32, c DigestCell) {
	if c.N == 0 && c.Sum == 0 {
		return
	}
	if ns == 0 {
		d.def.Sum += c.Sum
		d.def.N += c.N
		return
	}
	if d.other == nil {
		d.other = make(map[uint32]DigestCell)
	}
	o := d.other[ns]
	o.Sum += c.Sum
	o.N += c.N
	if o.N == 0 {
		delete(d.other, ns)
		return
	}
	d.other[ns] = o
}

// reset empties d (keeping its map).
func (d *digests) reset() {
	d.def = DigestCell{}
	clear(d.other)
}

// each calls f for each non-empty cell.
func (d *digests) each(f func(ns uint32, c DigestCell)) {
	if d.def.N != 0 {
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

// Fmix64 is MurmurHash3's 64-bit finalizer: a bijection whose every output bit depends
// on every input bit.
func Fmix64(x uint64) uint64 {
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
	return Fmix64(seq ^ (uint64(pos)*digestGolden + digestOdd))
}

// Value mixes non-empty cell c with what it is a cell of: tier, group (0 for a dense
// table, 1 + its index for a declared group) and the hash of its namespace's name. A
// worker's digest is the wrapping sum of its cells' values.
func (c DigestCell) Value(t Tier, group int, nsHash uint64) uint64 {
	class := Fmix64((uint64(t)<<32 | uint64(uint32(group))) + digestOdd)
	return Fmix64(Fmix64(c.Sum^class^nsHash) + uint64(c.N)*digestGolden)
}

// EachDigestCell calls f with each non-empty digest cell of primary w: its tier
// tables' (group 0) and, if it declared groups, theirs (group 1 + the group's index).
// Holder of w's mutex.
func (w *Worker) EachDigestCell(f func(ns uint32, t Tier, group int, c DigestCell)) {
	w.dg.each(func(ns uint32, c DigestCell) { f(ns, Device, 0, c) })
	w.Components(func(t Tier, c *Worker) {
		c.dg.each(func(ns uint32, cell DigestCell) { f(ns, t, 0, cell) })
	})
	if h := w.hyb; h != nil {
		for gi := range h.groups {
			for t := range h.groups[gi].dg {
				h.groups[gi].dg[t].each(func(ns uint32, c DigestCell) { f(ns, Tier(t), gi+1, c) })
			}
		}
	}
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
func (w *Worker) checkDigest(seed *table.Seed) error {
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
