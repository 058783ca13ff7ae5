package engine

import "math/bits"

// The two per-worker tables below are flat, pointer-free, open-addressing tables with
// linear probing and backward-shift deletion, like shard.Index. They are owned by whoever
// holds the worker's mutex.

const tableMinCap = 8

// Tables grow at load 3/4 and shrink to half at load 1/16, never below shrinkFloor
// slots. The gap between the two thresholds keeps a worker that stores and evicts the
// same number of blocks in a loop from reallocating its tables on every cycle, while a
// worker that drains for good still gives its memory back.
const shrinkFloor = 64

func shouldShrink(n, slots int) bool { return slots > shrinkFloor && n*16 < slots }

func mix64(x uint64) uint64 {
	x ^= x >> 33
	x *= 0xff51afd7ed558ccd
	x ^= x >> 33
	x *= 0xc4ceb9fe1a85ec53
	x ^= x >> 33
	return x
}

func tableShift(c int) uint8 { return uint8(64 - bits.TrailingZeros(uint(c))) }

// inRun reports whether home h lies cyclically in (i, j]: an entry at j whose home is
// there must not move back to the hole at i.
func inRun(h, i, j uint64) bool {
	if i < j {
		return h > i && h <= j
	}
	return h > i || h <= j
}

// seqEntry records where one engine hash of a worker sits. pos1 is position+1, so that
// zero marks an empty slot.
type seqEntry struct {
	seq    uint64
	prefix uint64
	pos1   uint32
	ns     uint32
}

type seqTable struct {
	slots []seqEntry
	mask  uint64
	shift uint8
	n     int
}

func (t *seqTable) init(c int) {
	t.slots = make([]seqEntry, c)
	t.mask = uint64(c - 1)
	t.shift = tableShift(c)
	t.n = 0
}

func (t *seqTable) home(seq uint64) uint64 { return (mix64(seq) * 0x9e3779b97f4a7c15) >> t.shift }

// get returns the key of seq.
func (t *seqTable) get(seq uint64) (k key, ok bool) {
	if t.n == 0 {
		return key{}, false
	}
	for i := t.home(seq); ; i = (i + 1) & t.mask {
		e := &t.slots[i]
		if e.pos1 == 0 {
			return key{}, false
		}
		if e.seq == seq {
			return key{prefix: e.prefix, pos: e.pos1 - 1, ns: e.ns}, true
		}
	}
}

// put inserts or overwrites seq and returns the key it had, if any.
func (t *seqTable) put(seq uint64, k key) (old key, had bool) {
	if len(t.slots) == 0 {
		t.init(tableMinCap)
	}
	if (t.n+1)*4 > len(t.slots)*3 {
		t.resize(len(t.slots) * 2)
	}
	for i := t.home(seq); ; i = (i + 1) & t.mask {
		e := &t.slots[i]
		if e.pos1 == 0 {
			*e = seqEntry{seq: seq, prefix: k.prefix, pos1: k.pos + 1, ns: k.ns}
			t.n++
			return key{}, false
		}
		if e.seq == seq {
			old = key{prefix: e.prefix, pos: e.pos1 - 1, ns: e.ns}
			e.prefix, e.pos1, e.ns = k.prefix, k.pos+1, k.ns
			return old, true
		}
	}
}

// del removes seq and returns the key it had, if it was there.
func (t *seqTable) del(seq uint64) (k key, ok bool) {
	if t.n == 0 {
		return key{}, false
	}
	i := t.home(seq)
	for ; ; i = (i + 1) & t.mask {
		e := &t.slots[i]
		if e.pos1 == 0 {
			return key{}, false
		}
		if e.seq == seq {
			k = key{prefix: e.prefix, pos: e.pos1 - 1, ns: e.ns}
			break
		}
	}
	for {
		t.slots[i] = seqEntry{}
		j := i
		for {
			j = (j + 1) & t.mask
			e := &t.slots[j]
			if e.pos1 == 0 {
				t.n--
				if shouldShrink(t.n, len(t.slots)) {
					t.resize(len(t.slots) / 2)
				}
				return k, true
			}
			if !inRun(t.home(e.seq), i, j) {
				t.slots[i] = *e
				i = j
				break
			}
		}
	}
}

func (t *seqTable) resize(c int) {
	old := t.slots
	n := t.n
	t.init(c)
	t.n = n
	for k := range old {
		e := &old[k]
		if e.pos1 == 0 {
			continue
		}
		i := t.home(e.seq)
		for t.slots[i].pos1 != 0 {
			i = (i + 1) & t.mask
		}
		t.slots[i] = *e
	}
}

// keyEntry is one (position, prefix) a worker holds or used to hold.
//
//   - seqs counts the worker's engine hashes with this key; the key is "held" while
//     seqs > 0, and only the 0 <-> 1 transitions reach the positional index.
//   - kids counts held keys one position deeper whose parent is this key. An entry with
//     seqs == 0 and kids > 0 is a ghost: its children are holes (held, but unreachable
//     through this key) and it is kept so that a refill of this key reconnects them.
//   - parent is the prefix hash of the key's parent (meaningless at position 0). A prefix
//     hash determines its parent's up to a 64-bit collision, so it is fixed per key.
//
// An entry with seqs == 0 and kids == 0 is deleted, which is also the empty-slot marker.
type keyEntry struct {
	prefix uint64
	parent uint64
	pos    uint32
	ns     uint32
	seqs   uint32
	kids   uint32
}

func (e *keyEntry) key() key { return key{prefix: e.prefix, pos: e.pos, ns: e.ns} }

// key is a (namespace, position, prefix) triple: one node of one namespace's prefix tree.
type key struct {
	prefix uint64
	pos    uint32
	ns     uint32
}

func (e *keyEntry) empty() bool { return e.seqs == 0 && e.kids == 0 }

type keyTable struct {
	slots []keyEntry
	mask  uint64
	shift uint8
	n     int
}

func (t *keyTable) init(c int) {
	t.slots = make([]keyEntry, c)
	t.mask = uint64(c - 1)
	t.shift = tableShift(c)
	t.n = 0
}

func (t *keyTable) home(k key) uint64 {
	return (mix64(k.prefix^(uint64(k.ns)<<32|uint64(k.pos))*0x9e3779b97f4a7c15) * 0x9e3779b97f4a7c15) >> t.shift
}

// find returns the slot of k, or -1.
func (t *keyTable) find(k key) int {
	if t.n == 0 {
		return -1
	}
	for i := t.home(k); ; i = (i + 1) & t.mask {
		e := &t.slots[i]
		if e.empty() {
			return -1
		}
		if e.prefix == k.prefix && e.pos == k.pos && e.ns == k.ns {
			return int(i)
		}
	}
}

// findOrAdd returns the slot of k, creating an entry with zero counts (which the caller
// must make non-empty before any other table operation).
func (t *keyTable) findOrAdd(k key, parent uint64) int {
	if len(t.slots) == 0 {
		t.init(tableMinCap)
	}
	if (t.n+1)*4 > len(t.slots)*3 {
		t.resize(len(t.slots) * 2)
	}
	for i := t.home(k); ; i = (i + 1) & t.mask {
		e := &t.slots[i]
		if e.empty() {
			*e = keyEntry{prefix: k.prefix, parent: parent, pos: k.pos, ns: k.ns}
			t.n++
			return int(i)
		}
		if e.prefix == k.prefix && e.pos == k.pos && e.ns == k.ns {
			return int(i)
		}
	}
}

// delAt removes the entry at slot i, which the caller has just made empty.
func (t *keyTable) delAt(i uint64) {
	for {
		t.slots[i] = keyEntry{}
		j := i
		for {
			j = (j + 1) & t.mask
			e := &t.slots[j]
			if e.empty() {
				t.n--
				return
			}
			if !inRun(t.home(e.key()), i, j) {
				t.slots[i] = *e
				i = j
				break
			}
		}
	}
}

// maybeShrink halves the table when it is mostly empty; call it only between
// operations, never while holding a slot index.
func (t *keyTable) maybeShrink() {
	if shouldShrink(t.n, len(t.slots)) {
		t.resize(len(t.slots) / 2)
	}
}

func (t *keyTable) resize(c int) {
	old := t.slots
	n := t.n
	t.init(c)
	t.n = n
	for k := range old {
		e := &old[k]
		if e.empty() {
			continue
		}
		i := t.home(e.key())
		for !t.slots[i].empty() {
			i = (i + 1) & t.mask
		}
		t.slots[i] = *e
	}
}
