package worker

import (
	"math/bits"

	"github.com/kvindex/kvindex/internal/table"
)

// A worker's bookkeeping is two tables: the seq table (below), engine hash -> the
// block that holds its key, 13 bytes a slot; and the key table (keys.go), the worker's
// keys as segments of consecutive positions (9 bytes a block in an arena, a 20-byte
// header a segment) with a key index of their first blocks. A removal finds its block
// through the seq table and trims its segment; a store that extends a chain appends to
// its parent's segment. The event path touches two tables per block (the seq table and
// the positional index), and the key index only where a segment starts.
//
// All of it is owned by whoever holds the worker's mutex. The tables are built from
// package internal/table (seeded hash, sizing; the key index's backward-shift
// deletion) like shard.Index.

// tableFloor is the size below which a worker's tables do not shrink, so a worker that
// stores and evicts a few blocks in a loop does not reallocate.
const tableFloor = 64

// seqSlot maps one engine hash to the block of its key (keys.go). It holds the hash
// mixed by the engine's seed (table.Seed.Mix64, a bijection: seq recovers the hash),
// whose top bits give its home group, so that growth reads no key again. ref is the
// block's ref + 1 (refOf); 0 marks a slot that holds nothing. The mixed hash is split
// in two words so that a slot is 12 bytes.
type seqSlot struct {
	lo, hi uint32
	ref    uint32
}

// mixed is the slot's mixed hash.
func (s *seqSlot) mixed() uint64 { return uint64(s.lo) | uint64(s.hi)<<32 }

// seq is the slot's engine hash.
func (s *seqSlot) seq(seed *table.Seed) uint64 { return seed.Unmix64(s.mixed()) }

// seqTable is the seq table: open addressing over groups of eight slots, each group
// with a control word of eight bytes beside the slots (swiss-table style): a byte is
// ctrlEmpty, ctrlDead (a deleted slot that a probe must pass) or 0xc0 | six bits of
// the slot's mixed hash (the tag). A lookup starts at the hash's home group and reads
// a group's control word, compares the tag with all eight bytes at once (in one
// word's arithmetic), reads only the slots whose byte matches (one in 64 of the
// others), and stops at a group with an empty byte: no branch per slot on its home
// and distance, as a Robin Hood table takes, and no shift. Against the Robin Hood
// table of the same slots (three alternating runs of go test -run '^$' -bench
// SeqSteady ./engine/internal/worker/): a deletion and an insertion at a steady 4,096
// seqs 37-40 ns against 51-52, growth from empty to 4,096 seqs 142-157 us against
// 156-179; with the store's runs (Worker.storeRun), on the conversation trace's events
// in process, 22-25% less time per coalesced event and 8-13% less per event (bench's
// BenchmarkEventsCoalesced and BenchmarkEvents, locked, three alternating runs), for
// one control byte more a slot.
//
// A deletion empties its slot when the slot's group has an empty byte (then no probe
// passes the group) and leaves a dead byte otherwise; dead bytes count against the
// load: an insertion that would take live and dead slots past 7/8 rebuilds the table
// without them, at the same size while the live ones stay below the growth load of 3/4
// (table.Full), grown (table.GrownLean) once they reach it. A table of fewer than 8 slots (a worker's first few seqs)
// is one group whose bytes past its slots read ctrlNone, which no probe matches, takes
// or stops at: a worker of one block keeps 2 slots and a word, not a group of 8.
type seqTable struct {
	slots []seqSlot // 8 per group (fewer in a table of one group that is not full size)
	ctrl  []uint64  // one word per group, byte j for slot j of the group
	// n counts the live entries and dead the dead bytes (32 bits each, which keeps a
	// Worker at 352 bytes, a size class).
	n, dead int32
}

const (
	ctrlEmpty = 0x00
	ctrlDead  = 0x01
	ctrlNone  = 0x80 // no slot: past the slots of a table of fewer than 8
	ctrlLSB   = 0x0101010101010101
	ctrlMSB   = 0x8080808080808080
	ctrlLow7  = 0x7f7f7f7f7f7f7f7f
)

// tagOf is the control byte of a slot holding mixed hash h: six bits that the home
// group (the top bits) does not use, with the top two bits set.
func tagOf(h uint64) uint64 { return 0xc0 | h&0x3f }

// matchTag returns a word with the top bit set of exactly the bytes of c equal to tag.
func matchTag(c, tag uint64) uint64 {
	x := c ^ tag*ctrlLSB
	return ^((x&ctrlLow7 + ctrlLow7) | x | ctrlLow7)
}

// live returns the top bits of c's bytes that hold a slot's tag.
func live(c uint64) uint64 { return c & (c << 1) & ctrlMSB }

// hasEmpty reports whether control word c has an empty byte.
func hasEmpty(c uint64) bool { return (c-ctrlLSB)&^c&ctrlMSB != 0 }

// free returns the top bits of c's bytes that are empty or dead (exact).
func free(c uint64) uint64 { return ^c & ctrlMSB }

// slotIn is the slot of group g whose control byte's top bit is the lowest set in m.
func slotIn(g, m uint64) uint64 { return g*8 + uint64(bits.TrailingZeros64(m))>>3 }

func (t *seqTable) homeOf(h uint64) uint64 { return table.Home(h, len(t.ctrl)) }

// get returns the block (ref) of seq.
func (t *seqTable) get(seed *table.Seed, seq uint64) (rid uint32, ok bool) {
	if t.n == 0 {
		return 0, false
	}
	i, found := t.find(seed.Mix64(seq))
	if !found {
		return 0, false
	}
	return t.slots[i].ref - 1, true
}

// find returns the slot of the seq of mixed hash h, or the slot where it would go: the
// first empty or dead slot on its probe (there is one: the table is never full).
func (t *seqTable) find(h uint64) (i uint64, found bool) {
	i, found, _ = t.probe(h)
	return i, found
}

// probe is find, and the number of groups it read.
func (t *seqTable) probe(h uint64) (i uint64, found bool, groups int) {
	lo, hi := uint32(h), uint32(h>>32)
	tag := tagOf(h)
	g, G := t.homeOf(h), uint64(len(t.ctrl))
	put := ^uint64(0)
	for groups = 1; ; groups++ {
		c := t.ctrl[g]
		for m := matchTag(c, tag); m != 0; m &= m - 1 {
			j := slotIn(g, m)
			if s := &t.slots[j]; s.lo == lo && s.hi == hi { // (a tag byte is a live slot's: checkSlots)
				return j, true, groups
			}
		}
		if f := free(c); f != 0 && put == ^uint64(0) {
			put = slotIn(g, f)
		}
		if hasEmpty(c) {
			return put, false, groups
		}
		if g++; g == G {
			g = 0
		}
	}
}

// locate returns the slot of seq, or the slot where it goes, after making room for one
// more entry, and seq's mixed hash for setAt. The slot stays valid until the table is
// next modified.
func (t *seqTable) locate(seed *table.Seed, seq uint64) (i, h uint64, found bool) {
	h = seed.Mix64(seq)
	i, found = t.locateMixed(h)
	return i, h, found
}

// locateMixed is locate of the seq of mixed hash h.
func (t *seqTable) locateMixed(h uint64) (i uint64, found bool) {
	switch c := len(t.slots); {
	case table.Full(int(t.n), c):
		t.resize(table.GrownLean(c))
	case (int(t.n)+int(t.dead)+1)*8 > c*7:
		t.resize(c) // dead slots past the load: rebuilt at the same size
	}
	return t.find(h)
}

// setAt points slot i, found by locate for the seq of mixed hash h, at block rid.
func (t *seqTable) setAt(i uint64, h uint64, rid uint32) {
	s := &t.slots[i]
	if s.ref == 0 {
		t.n++
		w, sh := &t.ctrl[i/8], 8*(i%8)
		if uint8(*w>>sh) == ctrlDead {
			t.dead--
		}
		*w = *w&^(0xff<<sh) | tagOf(h)<<sh
	}
	*s = seqSlot{lo: uint32(h), hi: uint32(h >> 32), ref: rid + 1}
}

// reserve makes room for k more live entries, growing the table as locate would before
// each of them, so that a run of k insertions (insertRun) needs no growth of its own.
// (A run that stops early may leave the table grown a little sooner.) Dead slots are
// insertRun's to settle: an insertion into a dead slot adds nothing to the load, so a
// bound on live and dead slots taken for the whole run ahead would rebuild a table in
// steady churn (a run stored where the last one was evicted) at every run.
func (t *seqTable) reserve(k int) {
	c := len(t.slots)
	if table.Full(int(t.n)+k-1, c) {
		for table.Full(int(t.n)+k-1, c) {
			c = table.GrownLean(c)
		}
		t.resize(c)
	}
}

// insertRun inserts the seqs of mixed hashes hs, pointing them at blocks ref0, ref0+1,
// ..., up to the first that the table holds already (it changes nothing for that one),
// and returns how many it inserted. reserve must have made room for len(hs). An
// insertion that would take an empty slot past 7/8 of the table in live and dead
// slots rebuilds it at its size first, as locate does. It is probe and setAt in one
// loop: a store's run calls it once for up to TouchGroup blocks, where calls per block
// made Go spill the run's registers around each (every register is the caller's to
// save in Go's ABI).
func (t *seqTable) insertRun(hs []uint64, ref0 uint32) int {
	G := uint64(len(t.ctrl))
	for j, h := range hs {
		lo, hi := uint32(h), uint32(h>>32)
		tag := tagOf(h)
		g := table.Home(h, int(G))
		put := ^uint64(0)
		for {
			c := t.ctrl[g]
			for m := matchTag(c, tag); m != 0; m &= m - 1 {
				if s := &t.slots[slotIn(g, m)]; s.lo == lo && s.hi == hi {
					return j
				}
			}
			if f := free(c); f != 0 && put == ^uint64(0) {
				put = slotIn(g, f)
			}
			if hasEmpty(c) {
				break
			}
			if g++; g == G {
				g = 0
			}
		}
		w, sh := &t.ctrl[put/8], 8*(put%8)
		if uint8(*w>>sh) == ctrlDead {
			t.dead--
		} else if c := len(t.slots); (int(t.n)+int(t.dead)+1)*8 > c*7 {
			if (int(t.n)+1)*8 > c*7 {
				c = table.GrownLean(c) // more than reserve made room for: grown
			}
			t.resize(c)                                    // dead slots past the load: rebuilt at the same size
			return j + t.insertRun(hs[j:], ref0+uint32(j)) // this seq probed again
		}
		*w = *w&^(0xff<<sh) | tag<<sh
		t.slots[put] = seqSlot{lo: lo, hi: hi, ref: ref0 + uint32(j) + 1}
		t.n++
	}
	return len(hs)
}

// TouchGroup is how many engine hashes of a run store and remove look up ahead
// (seqTable.touch), and the most TouchSeqs reads.
const TouchGroup = 16

// touch reads the home group (control word and first slot) of each mixed hash in hs
// and returns what it read, which the caller keeps (Outbox.sink) so that the loads are
// not dropped. The homes are spread over the table by the seed, so each probe of a run
// starts with a cache miss, and one block's probe cannot start before the previous
// block's bookkeeping is done; read together first, the misses overlap, and the run's
// probes find their groups in the cache. A group changed since only makes a read
// useless, never wrong.
func (t *seqTable) touch(hs []uint64) uint32 {
	var sum uint32
	if G := len(t.ctrl); G > 0 {
		for _, h := range hs {
			g := table.Home(h, G)
			sum += uint32(t.ctrl[g]) + t.slots[g*8].ref
		}
	}
	return sum
}

// del removes seq and returns its block, if it was there.
func (t *seqTable) del(seed *table.Seed, seq uint64) (rid uint32, ok bool) {
	return t.delMixed(seed.Mix64(seq))
}

// delMixed removes the seq of mixed hash h and returns its block, if it was there.
func (t *seqTable) delMixed(h uint64) (rid uint32, ok bool) {
	if t.n == 0 {
		return 0, false
	}
	i, found := t.find(h)
	if !found {
		return 0, false
	}
	rid = t.slots[i].ref - 1
	t.slots[i] = seqSlot{}
	t.n--
	w, sh := &t.ctrl[i/8], 8*(i%8)
	b := uint64(ctrlEmpty)
	if !hasEmpty(*w) {
		b = ctrlDead // a probe may pass this group: it must go on past the slot
		t.dead++
	}
	*w = *w&^(0xff<<sh) | b<<sh
	if table.Sparse(int(t.n), len(t.slots), tableFloor) {
		t.resize(table.Shrunk(len(t.slots)))
	}
	return rid, true
}

// (insertRun and delRun repeat probe's group step and setAt's and delMixed's slot
// change in their own loops. A shared inlined helper for the step (matchIn) and the
// deletion (clearAt) measured 88.0-93.4M instructions a coalesced pass, the copies
// 84.9-92.8M in eight runs (scripts/instructions.sh coalesced): no difference beyond
// the spread between runs, so the copies, the version timed beside the peers, stay.)

// delRun removes the seqs of mixed hashes hs and sets refs[j] to the block of hs[j] + 1,
// or 0 where the table did not hold it. It is delMixed for a window of a removal in one
// loop (a call per seq made Go spill the removal's registers around it), and leaves
// the shrink check to the caller (shrink), once per removal.
func (t *seqTable) delRun(hs []uint64, refs []uint32) {
	refs = refs[:len(hs)]
	G := uint64(len(t.ctrl))
	for j, h := range hs {
		refs[j] = 0
		if t.n == 0 {
			continue
		}
		lo, hi := uint32(h), uint32(h>>32)
		tag := tagOf(h)
		g := table.Home(h, int(G))
	probe:
		for {
			c := t.ctrl[g]
			for m := matchTag(c, tag); m != 0; m &= m - 1 {
				i := slotIn(g, m)
				if s := &t.slots[i]; s.lo == lo && s.hi == hi {
					refs[j] = s.ref
					*s = seqSlot{}
					t.n--
					w, sh := &t.ctrl[g], 8*(i%8)
					b := uint64(ctrlEmpty)
					if !hasEmpty(c) {
						b = ctrlDead // a probe may pass this group: it must go on past the slot
						t.dead++
					}
					*w = *w&^(0xff<<sh) | b<<sh
					break probe
				}
			}
			if hasEmpty(c) {
				break
			}
			if g++; g == G {
				g = 0
			}
		}
	}
}

// shrink shrinks the table once it is sparse (after deletions: delRun, once per
// removal; delMixed makes the same check inline, where a call per removal would not
// inline: 201.5-203.3M instructions a per-event pass against 196.3-201.4M,
// scripts/instructions.sh events).
func (t *seqTable) shrink() {
	if table.Sparse(int(t.n), len(t.slots), tableFloor) {
		t.resize(table.Shrunk(len(t.slots)))
	}
}

// resize rebuilds the table with room for at least c slots (whole groups), dropping
// the dead ones.
func (t *seqTable) resize(c int) {
	old, oldCtrl := t.slots, t.ctrl
	G := max(1, (c+7)/8)
	t.ctrl = make([]uint64, G)
	if c < 8 {
		t.slots = make([]seqSlot, c)
		t.ctrl[0] = ^uint64(0) << (8 * c) & (ctrlNone * ctrlLSB)
	} else {
		t.slots = make([]seqSlot, 8*G)
	}
	t.dead = 0
	for gi, c := range oldCtrl {
		for m := live(c); m != 0; m &= m - 1 {
			e := &old[slotIn(uint64(gi), m)]
			h := e.mixed()
			g := table.Home(h, G)
			for free(t.ctrl[g]) == 0 {
				if g++; g == uint64(G) {
					g = 0
				}
			}
			j := slotIn(g, free(t.ctrl[g]))
			t.slots[j] = *e
			t.ctrl[g] |= tagOf(h) << (8 * (j % 8))
		}
	}
}

// probes returns the number of groups a lookup of seq reads (a measure of how well the
// hash spreads the table's keys; tests use it).
func (t *seqTable) probes(seed *table.Seed, seq uint64) int {
	if len(t.ctrl) == 0 {
		return 0
	}
	_, _, groups := t.probe(seed.Mix64(seq))
	return groups
}
