package shard

import "math/bits"

// Inline is the number of members a slot stores without an overflow allocation.
const Inline = 3

const (
	minCapacity = 16
	// shrinkFloor and the 1/16 shrink threshold (growth is at 3/4) keep a steady churn
	// of adds and removes from reallocating the table, yet return memory after a drain.
	shrinkFloor = 1024
	// maxLoadNum/maxLoadDen is the load factor that triggers growth.
	maxLoadNum = 3
	maxLoadDen = 4
)

// Key names one position of one prefix chain in one namespace. Keys of different
// namespaces never compare equal, whatever their prefix hashes.
type Key struct {
	Prefix uint64
	Pos    uint32
	NS     uint32
}

// loc packs a key's namespace and position into the word a slot stores.
func (k Key) loc() uint64 { return uint64(k.NS)<<32 | uint64(k.Pos) }

// slot is one table cell; n == 0 marks it empty.
type slot struct {
	prefix uint64
	loc    uint64 // namespace << 32 | position
	n      uint32
	m      [Inline]uint32
}

// Index is a positional index owned by one goroutine. The zero value is not usable;
// call New.
type Index struct {
	slots   []slot
	mask    uint64
	shift   uint8
	used    int
	members int
	ovf     [][]uint32
	ovfFree []uint32
	// ovfCap is the total capacity of the overflow sets, kept so that Bytes is O(1).
	ovfCap int
}

// New returns an empty index sized for about hint keys.
func New(hint int) *Index {
	x := &Index{}
	x.alloc(capacityFor(hint))
	return x
}

func capacityFor(n int) int {
	c := minCapacity
	for c*maxLoadNum/maxLoadDen < n {
		c <<= 1
	}
	return c
}

func (x *Index) alloc(c int) {
	x.slots = make([]slot, c)
	x.mask = uint64(c - 1)
	x.shift = uint8(64 - bits.TrailingZeros(uint(c)))
}

// KeyHash mixes a key into 64 well-distributed bits. Prefix hashes of deeper blocks are
// already XXH3 outputs, but roots carry raw content values (often small integers), so the
// position and namespace are folded in and the result goes through a strong mixer.
func KeyHash(k Key) uint64 { return keyHash(k.Prefix, k.loc()) }

func keyHash(prefix, loc uint64) uint64 {
	h := prefix ^ (loc+1)*0x9e3779b97f4a7c15
	h ^= h >> 32
	h *= 0xd6e8feb86659fd93
	h ^= h >> 32
	return h
}

func (x *Index) home(prefix, loc uint64) uint64 {
	return (keyHash(prefix, loc) * 0x9e3779b97f4a7c15) >> x.shift
}

// find returns the slot index of k, or -1.
func (x *Index) find(k Key) int {
	prefix, loc := k.Prefix, k.loc()
	i := x.home(prefix, loc)
	for {
		s := &x.slots[i]
		if s.n == 0 {
			return -1
		}
		if s.prefix == prefix && s.loc == loc {
			return int(i)
		}
		i = (i + 1) & x.mask
	}
}

// Len returns the number of keys with at least one member.
func (x *Index) Len() int { return x.used }

// Memberships returns the total number of (key, worker) memberships.
func (x *Index) Memberships() int { return x.members }

// Capacity returns the number of slots, for memory accounting.
func (x *Index) Capacity() int { return len(x.slots) }

// Add makes wid a member of k and reports whether it was not one already.
func (x *Index) Add(k Key, wid uint32) bool {
	if (x.used+1)*maxLoadDen > len(x.slots)*maxLoadNum {
		x.resize(len(x.slots) * 2)
	}
	loc := k.loc()
	i := x.home(k.Prefix, loc)
	for {
		s := &x.slots[i]
		if s.n == 0 {
			*s = slot{prefix: k.Prefix, loc: loc, n: 1}
			s.m[0] = wid
			x.used++
			x.members++
			return true
		}
		if s.prefix == k.Prefix && s.loc == loc {
			if !x.addMember(s, wid) {
				return false
			}
			x.members++
			return true
		}
		i = (i + 1) & x.mask
	}
}

func (x *Index) addMember(s *slot, wid uint32) bool {
	if s.n <= Inline {
		for _, m := range s.m[:s.n] {
			if m == wid {
				return false
			}
		}
		if s.n < Inline {
			s.m[s.n] = wid
			s.n++
			return true
		}
		// Spill the inline members and the newcomer into an overflow set.
		o := x.newOverflow()
		set := append(append(x.ovf[o], s.m[:]...), wid)
		x.ovfCap += cap(set) - cap(x.ovf[o])
		x.ovf[o] = set
		s.m = [Inline]uint32{o}
		s.n++
		return true
	}
	set := x.ovf[s.m[0]]
	for _, m := range set {
		if m == wid {
			return false
		}
	}
	grown := append(set, wid)
	x.ovfCap += cap(grown) - cap(set)
	x.ovf[s.m[0]] = grown
	s.n++
	return true
}

func (x *Index) newOverflow() uint32 {
	if n := len(x.ovfFree); n > 0 {
		o := x.ovfFree[n-1]
		x.ovfFree = x.ovfFree[:n-1]
		return o
	}
	x.ovf = append(x.ovf, make([]uint32, 0, 2*Inline))
	x.ovfCap += 2 * Inline
	return uint32(len(x.ovf) - 1)
}

// Remove drops wid from k and reports whether it was a member. A key left with no
// members is deleted.
func (x *Index) Remove(k Key, wid uint32) bool {
	i := x.find(k)
	if i < 0 {
		return false
	}
	s := &x.slots[i]
	if !x.removeMember(s, wid) {
		return false
	}
	x.members--
	if s.n == 0 {
		x.deleteAt(uint64(i))
		x.used--
		if len(x.slots) > shrinkFloor && x.used*16 < len(x.slots) {
			x.resize(len(x.slots) / 2)
		}
	}
	return true
}

func (x *Index) removeMember(s *slot, wid uint32) bool {
	if s.n <= Inline {
		for j := uint32(0); j < s.n; j++ {
			if s.m[j] == wid {
				s.n--
				s.m[j] = s.m[s.n]
				s.m[s.n] = 0
				return true
			}
		}
		return false
	}
	o := s.m[0]
	set := x.ovf[o]
	for j, m := range set {
		if m != wid {
			continue
		}
		last := len(set) - 1
		set[j] = set[last]
		set = set[:last]
		s.n--
		if s.n == Inline {
			copy(s.m[:], set)
			x.ovf[o] = set[:0]
			x.ovfFree = append(x.ovfFree, o)
		} else {
			x.ovf[o] = set
		}
		return true
	}
	return false
}

// deleteAt empties slot i and shifts later members of its probe run back, so that every
// key stays reachable from its home slot without tombstones.
func (x *Index) deleteAt(i uint64) {
	for {
		x.slots[i] = slot{}
		j := i
		for {
			j = (j + 1) & x.mask
			s := &x.slots[j]
			if s.n == 0 {
				return
			}
			h := x.home(s.prefix, s.loc)
			// Move s back to i unless its home lies cyclically in (i, j].
			if (j > i && (h <= i || h > j)) || (j < i && (h <= i && h > j)) {
				x.slots[i] = *s
				i = j
				break
			}
		}
	}
}

func (x *Index) resize(c int) {
	if c < minCapacity {
		c = minCapacity
	}
	old := x.slots
	x.alloc(c)
	for k := range old {
		s := &old[k]
		if s.n == 0 {
			continue
		}
		i := x.home(s.prefix, s.loc)
		for x.slots[i].n != 0 {
			i = (i + 1) & x.mask
		}
		x.slots[i] = *s
	}
}

// AppendMembers appends the members of k to dst, in no particular order.
func (x *Index) AppendMembers(dst []uint32, k Key) []uint32 {
	i := x.find(k)
	if i < 0 {
		return dst
	}
	s := &x.slots[i]
	if s.n <= Inline {
		return append(dst, s.m[:s.n]...)
	}
	return append(dst, x.ovf[s.m[0]]...)
}

// Has reports whether wid is a member of k.
func (x *Index) Has(k Key, wid uint32) bool {
	i := x.find(k)
	if i < 0 {
		return false
	}
	s := &x.slots[i]
	set := s.m[:min(s.n, Inline)]
	if s.n > Inline {
		set = x.ovf[s.m[0]]
	}
	for _, m := range set {
		if m == wid {
			return true
		}
	}
	return false
}

// Bytes estimates the heap the index holds: slots plus overflow sets.
func (x *Index) Bytes() int {
	return len(x.slots)*32 + len(x.ovf)*24 + x.ovfCap*4 + cap(x.ovfFree)*4
}
