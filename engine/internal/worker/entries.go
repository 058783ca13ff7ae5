package worker

import (
	"unsafe"

	"github.com/kvindex/kvindex/shard"
)

// What the engine's snapshots, namespace sweeps and diagnostics read of a worker's
// tables, and how Restore loads them. Every function here is called by the holder of
// the worker's mutex (a component's: its primary's).

// Entry is one held engine hash of a tier's tables, as a snapshot carries it: the seq,
// its key and its parent key's prefix (0 for a root).
type Entry struct {
	Seq    uint64
	Key    shard.Key
	Parent uint64
}

// AppendEntries appends w's own entries to dst, in table order (a snapshot sorts them).
func (w *Worker) AppendEntries(env *Env, dst []Entry) []Entry {
	for i := range w.seqs.slots {
		s := &w.seqs.slots[i]
		if s.ref == 0 {
			continue
		}
		ref := s.ref - 1
		dst = append(dst, Entry{Seq: s.seq(&env.Seed), Key: w.keys.key(ref).shard(), Parent: w.keys.parentPrefix(ref)})
	}
	return dst
}

// LoadBegin prepares primary w, which holds nothing, for LoadEntry: a snapshot's
// entries come in seq order, children before parents as often as not, so every block
// is found by key while they load (a full table).
func (w *Worker) LoadBegin() { w.keys.full = true }

// LoadEntry makes tier component (or primary) c hold seq at key k, whose parent key has
// prefix parent, as Restore reads it from a snapshot: seqs ascend, so seq is new to c.
func (c *Worker) LoadEntry(env *Env, seq uint64, k shard.Key, parent uint64) {
	tk := key{prefix: k.Prefix, pos: k.Pos, ns: k.NS}
	si, sh, _ := c.seqs.locate(&env.Seed, seq) // seqs ascend: never found
	c.seqs.setAt(si, sh, c.addKey(env, tk, parent, 0, 1))
	c.dg.add(tk.ns, digestTerm(seq, tk.pos), 1)
}

// LoadEnd ends primary w's load: a worker without other tiers indexes only what its
// parents cannot reach.
func (w *Worker) LoadEnd(env *Env) {
	if w.tl.Load() == nil {
		w.keys.setFull(&env.Seed, false)
	}
}

// NamespacesInUse adds to used the namespaces of every segment of primary w (every tier,
// ghosts included) and of every block of its declared groups. A table whose segments
// are all in the default namespace costs one test.
func (w *Worker) NamespacesInUse(used map[uint32]bool) {
	w.keys.namespacesInUse(used)
	w.Components(func(_ Tier, c *Worker) { c.keys.namespacesInUse(used) })
	if h := w.hyb; h != nil {
		for gi := range h.groups {
			for t := range NumTiers {
				for k := range h.groups[gi].held[t] {
					used[k.NS] = true
				}
			}
		}
	}
}

// Footprint is the size of one tier's tables (Footprint), for tests and benchmarks.
type Footprint struct {
	// Records is the blocks of the key table's segments (held, ghosts and dead), Slab
	// the blocks its arena could hold (free chunks and slack included).
	Records, Slab int
	// RecBytes, SeqBytes and IdxBytes are the capacities in bytes of the key table's
	// segments (arena and headers), the seq table and the key index.
	RecBytes, SeqBytes, IdxBytes int
}

// Footprint returns the size of w's own tables.
func (w *Worker) Footprint() Footprint {
	return Footprint{
		Records:  int(w.keys.blocks),
		Slab:     len(w.keys.ar) * 8 / 9,
		RecBytes: cap(w.keys.ar)*8 + cap(w.keys.segs)*int(unsafe.Sizeof(segHdr{})),
		SeqBytes: cap(w.seqs.slots)*int(unsafe.Sizeof(seqSlot{})) + cap(w.seqs.ctrl)*8,
		IdxBytes: cap(w.keys.idx) * int(unsafe.Sizeof(keySlot{})),
	}
}

// Probes returns the slots a lookup of key k reads in w's key index and one of seq in
// its seq table (a measure of how well the seeded hash spreads the tables; tests use it).
func (w *Worker) Probes(env *Env, k shard.Key, seq uint64) (keyProbes, seqProbes int) {
	return w.keys.probes(&env.Seed, key{prefix: k.Prefix, pos: k.Pos, ns: k.NS}), w.seqs.probes(&env.Seed, seq)
}

// TableFloor is the size below which a worker's tables do not shrink (tableFloor).
const TableFloor = tableFloor
