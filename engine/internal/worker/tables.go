package worker

import (
	"github.com/kvindex/kvindex/internal/table"
)

// A worker's bookkeeping is two tables: the seq table (below), engine hash -> the
// block that holds its key, 12-byte slots; and the key table (keys.go), the worker's
// keys as segments of consecutive positions (9 bytes a block in an arena, a 20-byte
// header a segment) with a key index of their first blocks. A removal finds its block
// through the seq table and trims its segment; a store that extends a chain appends to
// its parent's segment. The event path touches two tables per block (the seq table and
// the positional index), and the key index only where a segment starts.
//
// All of it is owned by whoever holds the worker's mutex. The tables are built from
// package internal/table (seeded hash, sizing, backward-shift deletion) like
// shard.Index.

// tableFloor is the size below which a worker's tables do not shrink, so a worker that
// stores and evicts a few blocks in a loop does not reallocate.
const tableFloor = 64

// seqSlot maps one engine hash to the block of its key (keys.go). It holds the hash
// mixed by the engine's seed (table.Seed.Mix64, a bijection: seq recovers the hash),
// whose top bits give its home slot, so that growth and deletion's backward shift move
// slots without rehashing (on the trace-driven replay, rehashing the shifted slots was
// most of a removal's seq-table time) and the table keeps Robin Hood order, as the key
// index does. ref is the block's ref + 1 (refOf); 0 marks an empty slot. The mixed hash
// is split in two words so that a slot is 12 bytes.
type seqSlot struct {
	lo, hi uint32
	ref    uint32
}

// mixed is the slot's mixed hash.
func (s *seqSlot) mixed() uint64 { return uint64(s.lo) | uint64(s.hi)<<32 }

// seq is the slot's engine hash.
func (s *seqSlot) seq(seed *table.Seed) uint64 { return seed.Unmix64(s.mixed()) }

type seqTable struct {
	slots []seqSlot
	n     int
}

func (t *seqTable) homeOf(h uint64) uint64 { return table.Home(h, len(t.slots)) }

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

// find returns the slot of the seq of mixed hash h, or the slot where it belongs (empty,
// or the first one nearer to its home than h would be: Robin Hood order).
func (t *seqTable) find(h uint64) (i uint64, found bool) {
	lo, hi := uint32(h), uint32(h>>32)
	n := len(t.slots)
	for i, d := t.homeOf(h), uint64(0); ; i, d = table.Next(i, n), d+1 {
		s := &t.slots[i]
		if s.ref == 0 {
			return i, false
		}
		if s.lo == lo && s.hi == hi {
			return i, true
		}
		if table.Dist(t.homeOf(s.mixed()), i, n) < d {
			return i, false
		}
	}
}

// locate returns the slot of seq, or the slot where it belongs (empty, or the first one
// nearer to its home than seq would be: the table keeps Robin Hood order, like the key
// index), after making room for one more entry, and seq's mixed hash for setAt. The
// slot stays valid until the table is next modified.
func (t *seqTable) locate(seed *table.Seed, seq uint64) (i, h uint64, found bool) {
	h = seed.Mix64(seq)
	i, found = t.locateMixed(h)
	return i, h, found
}

// locateMixed is locate of the seq of mixed hash h.
func (t *seqTable) locateMixed(h uint64) (i uint64, found bool) {
	if table.Full(t.n, len(t.slots)) {
		t.resize(table.GrownLean(len(t.slots)))
	}
	return t.find(h)
}

// setAt points slot i, found by locate for the seq of mixed hash h, at block rid.
func (t *seqTable) setAt(i uint64, h uint64, rid uint32) {
	e := seqSlot{lo: uint32(h), hi: uint32(h >> 32), ref: rid + 1}
	if s := &t.slots[i]; s.ref != 0 && s.mixed() == h {
		*s = e
		return
	}
	t.n++
	j := i
	for n := len(t.slots); t.slots[j].ref != 0; {
		j = table.Next(j, n)
	}
	table.ShiftRight(t.slots, i, j)
	t.slots[i] = e
}

// TouchGroup is how many engine hashes of a run store and remove look up ahead
// (seqTable.touch), and the most TouchSeqs reads.
const TouchGroup = 16

// touch reads the home slot of each mixed hash in hs and returns what it read, which the
// caller keeps (Outbox.sink) so that the loads are not dropped. The homes are spread
// over the table by the seed, so each probe of a run starts with a cache miss, and one
// block's probe cannot start before the previous block's bookkeeping is done; read
// together first, the misses overlap, and the run's probes find their slots in the
// cache. A slot moved since (a shift, a resize) only makes a read useless, never wrong.
func (t *seqTable) touch(hs []uint64) uint32 {
	var sum uint32
	if n := len(t.slots); n > 0 {
		for _, h := range hs {
			sum += t.slots[table.Home(h, n)].ref
		}
	}
	return sum
}

// del removes seq and returns its block, if it was there.
func (t *seqTable) del(seed *table.Seed, seq uint64) (rid uint32, ok bool) {
	return t.delMixed(seed.Mix64(seq))
}

// delMixed removes the seq of mixed hash h and returns its block, if it was there.
// The slots after it shift back up to the first one at its home (Robin Hood order keeps
// each run sorted by home, so none after that one can move).
func (t *seqTable) delMixed(h uint64) (rid uint32, ok bool) {
	if t.n == 0 {
		return 0, false
	}
	i, found := t.find(h)
	if !found {
		return 0, false
	}
	rid = t.slots[i].ref - 1
	n := len(t.slots)
	for {
		j := table.Next(i, n)
		s := &t.slots[j]
		if s.ref == 0 || t.homeOf(s.mixed()) == j {
			break
		}
		t.slots[i] = *s
		i = j
	}
	t.slots[i] = seqSlot{}
	t.n--
	if table.Sparse(t.n, n, tableFloor) {
		t.resize(table.Shrunk(n))
	}
	return rid, true
}

func (t *seqTable) resize(c int) {
	old := t.slots
	t.slots = make([]seqSlot, c)
	for k := range old {
		if e := &old[k]; e.ref != 0 {
			t.insertAt(t.homeOf(e.mixed()), 0, *e)
		}
	}
}

// insertAt puts e at slot i, d slots past its home, pushing each slot it meets that is
// nearer to its home one step on (Robin Hood order); resize inserts from the home slot.
func (t *seqTable) insertAt(i, d uint64, e seqSlot) {
	n := len(t.slots)
	for {
		s := &t.slots[i]
		if s.ref == 0 {
			*s = e
			return
		}
		if sd := table.Dist(t.homeOf(s.mixed()), i, n); sd < d {
			*s, e = e, *s
			d = sd
		}
		i, d = table.Next(i, n), d+1
	}
}

// probes returns the number of slots a lookup of seq reads (a measure of how well the
// hash spreads the table's keys; tests use it).
func (t *seqTable) probes(seed *table.Seed, seq uint64) int {
	h := seed.Mix64(seq)
	n := len(t.slots)
	for i, d := t.homeOf(h), uint64(0); ; i, d = table.Next(i, n), d+1 {
		s := &t.slots[i]
		if s.ref == 0 || s.mixed() == h || table.Dist(t.homeOf(s.mixed()), i, n) < d {
			return int(d) + 1
		}
	}
}
