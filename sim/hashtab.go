package sim

import "math/bits"

// hashTable maps an engine hash to the first block cached under it: an open-addressing
// table with linear probing and backward-shift deletion, at most three quarters full
// (a mock engine caches at most as many hashes as it has blocks; the table has 4/3 of
// that, rounded up to a power of two: small enough that eight engines' tables stay in
// cache, where a probe's one cache miss is most of its cost). It replaces
// a Go map on the simulator's hottest path (every prefix lookup, every block cached or
// evicted): on the default run a map's lookups and assignments were a fifth of the
// profile. Keys are engine hashes, already uniform; the multiply only spreads a
// degenerate input.
type hashTable struct {
	slots []htSlot
	shift uint
	n     int
}

// htSlot keeps a key beside its value: a probe touches one cache line.
type htSlot struct {
	key uint64
	val int32 // none: an empty slot
}

// newHashTable returns a table for up to capacity keys.
func newHashTable(capacity int) hashTable {
	size := 1 << bits.Len(uint(max(capacity+capacity/3+1, 8)-1))
	t := hashTable{slots: make([]htSlot, size), shift: uint(64 - bits.Len(uint(size-1)))}
	for i := range t.slots {
		t.slots[i].val = none
	}
	return t
}

func (t *hashTable) slot(k uint64) int { return int((k * 0x9e3779b97f4a7c15) >> t.shift) }

func (t *hashTable) get(k uint64) (int32, bool) {
	mask := len(t.slots) - 1
	for i := t.slot(k); ; i = (i + 1) & mask {
		s := &t.slots[i]
		if s.val == none {
			return none, false
		}
		if s.key == k {
			return s.val, true
		}
	}
}

// set maps k to v, inserting it if absent. The table must have room for it.
func (t *hashTable) set(k uint64, v int32) {
	mask := len(t.slots) - 1
	for i := t.slot(k); ; i = (i + 1) & mask {
		s := &t.slots[i]
		if s.val == none {
			*s = htSlot{key: k, val: v}
			t.n++
			return
		}
		if s.key == k {
			s.val = v
			return
		}
	}
}

// del removes k if present, shifting back the entries after it that probed past it.
func (t *hashTable) del(k uint64) {
	mask := len(t.slots) - 1
	i := t.slot(k)
	for ; ; i = (i + 1) & mask {
		if t.slots[i].val == none {
			return
		}
		if t.slots[i].key == k {
			break
		}
	}
	t.n--
	for j := (i + 1) & mask; t.slots[j].val != none; j = (j + 1) & mask {
		// The entry at j may move into the hole at i if its home slot is not in (i, j].
		if home := t.slot(t.slots[j].key); (j-home)&mask >= (j-i)&mask {
			t.slots[i] = t.slots[j]
			i = j
		}
	}
	t.slots[i] = htSlot{val: none}
}

func (t *hashTable) len() int { return t.n }

// all yields every key and its value, in slot order.
func (t *hashTable) all(yield func(uint64, int32) bool) {
	for _, s := range t.slots {
		if s.val != none && !yield(s.key, s.val) {
			return
		}
	}
}
