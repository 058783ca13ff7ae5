package shard

import (
	"unsafe"

	"github.com/kvindex/kvindex/internal/table"
)

// Inline is the number of members a slot stores without an overflow set.
const Inline = 1

// shrinkFloor is the size below which the table never shrinks.
const shrinkFloor = 1024

// Key names one position of one prefix chain in one namespace. Keys of different
// namespaces never compare equal, whatever their prefix hashes.
type Key struct {
	Prefix uint64
	Pos    uint32
	NS     uint32
}

// Loc packs a key's namespace and position into one word for the hash.
func (k Key) Loc() uint64 { return uint64(k.NS)<<32 | uint64(k.Pos) }

// slot is one table cell, 12 bytes: the key's fingerprint (see Hash) in two words, so
// that the slot needs no 8-byte alignment, and m, which says what the slot holds:
//
//	m == 0                  empty
//	0 < m < ovfBit          one member, worker m-1 (inline)
//	m >= ovfBit             two or more members, in overflow set m-ovfBit
//
// The member count of an overflow key is its set's length, so the slot needs no count.
type slot struct {
	lo, hi uint32
	m      uint32
}

// ovfBit marks a slot whose members live in an overflow set.
const ovfBit = 1 << 31

// MaxMember is the largest worker id the index takes: ids above it would be read as an
// overflow set. Worker ids are registry indexes, far below it.
const MaxMember = ovfBit - 2

func (s *slot) fp() uint64 { return uint64(s.lo) | uint64(s.hi)<<32 }

func (s *slot) is(fp uint64) bool { return s.lo == uint32(fp) && s.hi == uint32(fp>>32) }

func newSlot(fp uint64, wid uint32) slot {
	return slot{lo: uint32(fp), hi: uint32(fp >> 32), m: wid + 1}
}

// Index is a positional index owned by one goroutine. The zero value is not usable;
// call New.
type Index struct {
	slots   []slot
	used    int
	members int
	ovf     [][]uint32
	ovfFree []uint32
	// ovfCap is the total capacity of the overflow sets, kept so that Bytes is O(1).
	ovfCap int
	// sink takes what touch reads.
	sink uint32
	// changes counts the changes since the last full check (invariants builds only;
	// see mustCheck).
	changes int
}

// New returns an empty index sized for about hint keys.
func New(hint int) *Index {
	return &Index{slots: make([]slot, table.ForEntries(hint))}
}

// Hash is a key's fingerprint, the 64 bits the index stores and is keyed by: the
// engine's seeded hash of the whole key (keys come from prompts, so where they land
// must not be known outside the process). Two keys share an index entry only if their
// fingerprints collide, a 64-bit collision of a keyed hash (DESIGN.md, "Exactness of
// fingerprints"). The engine spreads keys over shards by its low bits; the table's home
// slot takes the high ones.
func Hash(seed table.Seed, k Key) uint64 { return seed.Hash128(k.Prefix, k.Loc()) }

func (x *Index) home(fp uint64) uint64 { return table.Home(fp, len(x.slots)) }

// find returns the slot index of fp, or -1. The table keeps Robin Hood order, so a probe
// that meets an entry nearer to its home than the probe is has passed where fp would be.
func (x *Index) find(fp uint64) int {
	n := len(x.slots)
	h := x.home(fp)
	for i, d := h, uint64(0); ; i, d = table.Next(i, n), d+1 {
		s := &x.slots[i]
		if s.m == 0 {
			return -1
		}
		if s.is(fp) {
			return int(i)
		}
		if table.Dist(x.home(s.fp()), i, n) < d {
			return -1
		}
	}
}

// Probes returns the number of slots a lookup of fp reads: 1 when fp, or an empty slot,
// sits at its home. It measures how well the hash spreads a set of keys.
func (x *Index) Probes(fp uint64) int {
	n := len(x.slots)
	for i, d := x.home(fp), uint64(0); ; i, d = table.Next(i, n), d+1 {
		s := &x.slots[i]
		if s.m == 0 || s.is(fp) || table.Dist(x.home(s.fp()), i, n) < d {
			return int(d) + 1
		}
	}
}

// touchGroup is how many deltas' home slots apply reads ahead (Index.touch).
const touchGroup = 16

// touch reads the home slot of each membership change in ds, so that the cache misses
// of a run of changes overlap instead of following one another: the slots are spread
// over the table by a seeded hash, each change's probe starts with a miss, and a probe
// cannot start before the previous change is done. The changes then find their slots
// in the cache. What it reads goes to x.sink, so the loads are not dropped.
func (x *Index) touch(ds []Delta) {
	var sum uint32
	n := len(x.slots)
	for i := range ds {
		sum += x.slots[table.Home(ds[i].FP(), n)].m
	}
	x.sink += sum
}

// Len returns the number of keys with at least one member.
func (x *Index) Len() int { return x.used }

// Memberships returns the total number of (key, worker) memberships.
func (x *Index) Memberships() int { return x.members }

// Capacity returns the number of slots, for memory accounting.
func (x *Index) Capacity() int { return len(x.slots) }

// Add makes wid (at most MaxMember) a member of the key with fingerprint fp and reports
// whether it was not one already. The table grows at 13/16: a slot carries its hash, so the long runs of a
// dense table are cheap to shift.
func (x *Index) Add(fp uint64, wid uint32) bool {
	added := x.add(fp, wid)
	x.mustCheck(fp)
	return added
}

func (x *Index) add(fp uint64, wid uint32) bool {
	if table.FullDense(x.used, len(x.slots)) {
		x.resize(table.Grown(len(x.slots)))
	}
	n := len(x.slots)
	for i, d := x.home(fp), uint64(0); ; i, d = table.Next(i, n), d+1 {
		s := &x.slots[i]
		if s.m != 0 && s.is(fp) {
			if !x.addMember(s, wid) {
				return false
			}
			x.members++
			return true
		}
		if s.m == 0 || table.Dist(x.home(s.fp()), i, n) < d {
			x.shiftIn(i, newSlot(fp, wid))
			x.used++
			x.members++
			return true
		}
	}
}

// shiftIn puts e at slot i, where the probe for it stopped (the first slot empty or
// nearer to its home than e would be). Robin Hood order keeps every run sorted by home
// (cyclically; insertion and backward-shift deletion both preserve it), so e's place is
// i and each slot from i up to the next empty one moves one step on: a scan for the
// empty slot and a copy, without insertAt's distance test per slot (on the trace-driven
// replay insertAt was a seventh of the replay's time).
func (x *Index) shiftIn(i uint64, e slot) {
	j := i
	for n := len(x.slots); x.slots[j].m != 0; {
		j = table.Next(j, n)
	}
	table.ShiftRight(x.slots, i, j)
	x.slots[i] = e
}

// insertAt puts e at slot i, d slots past its home, where the probe for it stopped:
// Robin Hood order pushes each entry it meets that is nearer to its home one step on.
func (x *Index) insertAt(i, d uint64, e slot) {
	n := len(x.slots)
	for {
		s := &x.slots[i]
		if s.m == 0 {
			*s = e
			return
		}
		if sd := table.Dist(x.home(s.fp()), i, n); sd < d {
			*s, e = e, *s
			d = sd
		}
		i, d = table.Next(i, n), d+1
	}
}

func (x *Index) addMember(s *slot, wid uint32) bool {
	if s.m < ovfBit {
		if s.m == wid+1 {
			return false
		}
		// Spill the inline member and the newcomer into an overflow set.
		o := x.newOverflow()
		set := append(x.ovf[o], s.m-1, wid)
		x.ovfCap += cap(set) - cap(x.ovf[o])
		x.ovf[o] = set
		s.m = ovfBit | o
		return true
	}
	o := s.m - ovfBit
	set := x.ovf[o]
	for _, m := range set {
		if m == wid {
			return false
		}
	}
	grown := append(set, wid)
	x.ovfCap += cap(grown) - cap(set)
	x.ovf[o] = grown
	return true
}

func (x *Index) newOverflow() uint32 {
	if n := len(x.ovfFree); n > 0 {
		o := x.ovfFree[n-1]
		x.ovfFree = x.ovfFree[:n-1]
		return o
	}
	x.ovf = append(x.ovf, make([]uint32, 0, 4))
	x.ovfCap += 4
	return uint32(len(x.ovf) - 1)
}

// Remove drops wid from the key with fingerprint fp and reports whether it was a
// member. A key left with no members is deleted.
func (x *Index) Remove(fp uint64, wid uint32) bool {
	removed := x.remove(fp, wid)
	x.mustCheck(fp)
	return removed
}

func (x *Index) remove(fp uint64, wid uint32) bool {
	i := x.find(fp)
	if i < 0 {
		return false
	}
	s := &x.slots[i]
	if !x.removeMember(s, wid) {
		return false
	}
	x.members--
	if s.m == 0 {
		x.deleteAt(uint64(i))
		x.used--
		if table.Sparse(x.used, len(x.slots), shrinkFloor) {
			x.resize(table.Shrunk(len(x.slots)))
		}
	}
	return true
}

// removeMember drops wid from slot s; a slot left with no member has m == 0.
func (x *Index) removeMember(s *slot, wid uint32) bool {
	if s.m < ovfBit {
		if s.m != wid+1 {
			return false
		}
		s.m = 0
		return true
	}
	o := s.m - ovfBit
	set := x.ovf[o]
	for j, m := range set {
		if m != wid {
			continue
		}
		last := len(set) - 1
		set[j] = set[last]
		set = set[:last]
		if len(set) == 1 {
			s.m = set[0] + 1
			x.ovf[o] = set[:0]
			x.ovfFree = append(x.ovfFree, o)
		} else {
			x.ovf[o] = set
		}
		return true
	}
	return false
}

// deleteAt empties slot i and shifts the rest of its probe run back by one slot, up to
// the first entry that sits at its home (Robin Hood order: nothing after it belongs
// before it), so that every key stays reachable without tombstones.
func (x *Index) deleteAt(i uint64) {
	n := len(x.slots)
	for {
		j := table.Next(i, n)
		s := &x.slots[j]
		if s.m == 0 || x.home(s.fp()) == j {
			x.slots[i] = slot{}
			return
		}
		x.slots[i] = *s
		i = j
	}
}

func (x *Index) resize(c int) {
	old := x.slots
	x.slots = make([]slot, c)
	for k := range old {
		if s := &old[k]; s.m != 0 {
			x.insertAt(x.home(s.fp()), 0, *s)
		}
	}
}

// AppendMembers appends the members of the key with fingerprint fp to dst, in no
// particular order.
func (x *Index) AppendMembers(dst []uint32, fp uint64) []uint32 {
	i := x.find(fp)
	if i < 0 {
		return dst
	}
	s := &x.slots[i]
	if s.m < ovfBit {
		return append(dst, s.m-1)
	}
	return append(dst, x.ovf[s.m-ovfBit]...)
}

// Has reports whether wid is a member of the key with fingerprint fp.
func (x *Index) Has(fp uint64, wid uint32) bool {
	i := x.find(fp)
	if i < 0 {
		return false
	}
	s := &x.slots[i]
	if s.m < ovfBit {
		return s.m == wid+1
	}
	for _, m := range x.ovf[s.m-ovfBit] {
		if m == wid {
			return true
		}
	}
	return false
}

// Bytes estimates the heap the index holds: slots plus overflow sets.
func (x *Index) Bytes() int {
	return len(x.slots)*int(unsafe.Sizeof(slot{})) + len(x.ovf)*24 + x.ovfCap*4 + cap(x.ovfFree)*4
}
