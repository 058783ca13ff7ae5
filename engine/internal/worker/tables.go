package worker

import (
	"github.com/kvindex/kvindex/internal/table"
	"github.com/kvindex/kvindex/shard"
)

// A worker's bookkeeping is two tables over one slab of key records:
//
//   - keyTable.recs, the slab: one 20-byte record per key (namespace, position, prefix)
//     the worker holds or keeps as a ghost, at a stable index (its record id) until it
//     is deleted; a deleted record goes on a free list and is reused.
//   - seqTable: engine hash -> record id, 12-byte slots.
//   - keyTable.idx: key -> record id for the records that cannot be reached from their
//     parent's record, 6-byte slots (the id, its distance from home and an 8-bit hash
//     tag), so a probe compares tags and reads the slab only for records that match (one
//     in 256 of the others).
//
// A record names its parent key by record id, so a removal finds the parent's child
// count without hashing, and a snapshot reads the parent's prefix from it. A parent
// names its child the same way while it has exactly one held child: a store that
// extends a chain finds the key it stores (or learns that it is new) in the parent's
// record, which it updates anyway, instead of in a third table, and a removal that
// drops a leaf unlinks it there. The key index holds only the rest (keyTable.inIdx):
// roots, ghosts, and the held children of branch points, whose parent's child word
// says so (childIndexed). On the trace-driven logs that is a few percent of the records
// (one branch point per conversation, past the shared system prompt), and the event
// path touches two tables per stored block (the seq table and the positional index)
// instead of three. A worker with tier components (tiers.go) looks keys up by key alone
// (a store whose parent is on another tier, a copy, a query's tier walk), so its tables
// index every record (keyTable.full), as Restore's do while it loads.
//
// All of it is owned by whoever holds the worker's mutex. The tables are built from
// package internal/table (seeded hash, sizing, backward-shift deletion) like
// shard.Index.

// tableFloor is the size below which a worker's tables do not shrink, so a worker that
// stores and evicts a few blocks in a loop does not reallocate.
const tableFloor = 64

// seqSlot maps one engine hash to a key record. It holds the hash mixed by the engine's
// seed (table.Seed.Mix64, a bijection: seq recovers the hash), whose top bits give its
// home slot, so that growth and deletion's backward shift move slots without rehashing
// (on the trace-driven replay, rehashing the shifted slots was most of a removal's
// seq-table time) and the table keeps Robin Hood order, as the key index does. ref is
// the record id + 1; 0 marks an empty slot. The mixed hash is split in two words so
// that a slot is 12 bytes.
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

// get returns the record id of seq.
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
		t.resize(table.Grown(len(t.slots)))
	}
	return t.find(h)
}

// setAt points slot i, found by locate for the seq of mixed hash h, at record rid.
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

// del removes seq and returns its record id, if it was there.
func (t *seqTable) del(seed *table.Seed, seq uint64) (rid uint32, ok bool) {
	return t.delMixed(seed.Mix64(seq))
}

// delMixed removes the seq of mixed hash h and returns its record id, if it was there.
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

// keyRec is one key a worker holds or used to hold, 20 bytes.
//
//   - seqs counts the worker's engine hashes with this key; the key is "held" while
//     seqs > 0, and only the 0 <-> 1 transitions reach the positional index.
//   - kids counts held keys one position deeper whose parent is this key. A record with
//     seqs == 0 and kids > 0 is a ghost: its children are holes (held, but unreachable
//     through this key) and it is kept so that a refill of this key reconnects them.
//   - parent is the record id + 1 of the parent key while this key is held at a
//     position > 0, else 0. A held key's parent record exists: its kids count is > 0.
//   - child says where this key's held children are: 0 while it has none, the record
//     id + 1 of its one held child when that child is linked here and not in the key
//     index, and childIndexed when every held child is in the key index (a branch point,
//     or a record of a full table). child != 0 exactly while kids > 0.
//
// One word, st, packs the key's location and both counts for the common case, with a
// way out for the rest, so that nothing is bounded by the packing:
//
//   - its low stLocBits bits are the location: the position (below 2^stPosBits) and
//     the worker's local id of the namespace (keyTable.nss: 0 is the default namespace,
//     1..locNSMax the others in the order the worker met them). A deeper key, or one in
//     a namespace past the worker's locNSMax-th, has the location locWide and its
//     position and namespace in keyTable.wide.
//   - above them, seqs (stSeqBits bits) and kids (stKidBits bits). A count that
//     outgrows its field (a key under more than cntSeqMax engine hashes, a branch point
//     with more than cntKidMax held children) moves both counts to keyTable.wide; the
//     seqs field then holds stSeqWide and the kids field 0.
//   - a free record has st == stFree (a wide location with wide counts and kids bits
//     set, which no live record has) and chains the free list through parent.
//
// Read the packed fields through keyTable (pos, ns, key, is, seqs, kids, addSeqs,
// addKids). A record with seqs == 0 and kids == 0 is deleted. 20 bytes instead of the
// 24 of separate location and count words: 4 bytes less per membership.
type keyRec struct {
	plo, phi uint32 // prefix
	parent   uint32
	st       uint32 // kids<<stKidShift | seqs<<stSeqShift | location, or stFree
	child    uint32
}

// childIndexed in a record's child word says that its held children are in the key
// index.
const childIndexed = ^uint32(0)

// The state word of a key record. On the trace-driven logs every record stays packed
// but each worker's few branch points with more than cntKidMax children (the ends of
// shared system prompts).
const (
	stPosBits  = 18
	stNSBits   = 6
	stLocBits  = stPosBits + stNSBits
	stSeqBits  = 2
	stKidBits  = 32 - stLocBits - stSeqBits
	stSeqShift = stLocBits
	stKidShift = stLocBits + stSeqBits

	locPosMask = 1<<stPosBits - 1
	stLocMask  = 1<<stLocBits - 1
	stSeqMask  = 1<<stSeqBits - 1
	// locNSMax is the largest local namespace id: the one after it marks locWide.
	locNSMax = 1<<stNSBits - 2
	locWide  = (locNSMax + 1) << stPosBits
	// stSeqWide in the seqs field marks counts kept in keyTable.wide.
	stSeqWide = stSeqMask
	cntSeqMax = stSeqWide - 1
	cntKidMax = 1<<stKidBits - 1
	stFree    = ^uint32(0)
)

// wideRec holds what a record could not pack: its position and namespace when its
// location is locWide, its counts when they are wide.
type wideRec struct{ pos, ns, seqs, kids uint32 }

func (r *keyRec) loc() uint32 { return r.st & stLocMask }

func (r *keyRec) wideCounts() bool { return r.st>>stSeqShift&stSeqMask == stSeqWide }

func (r *keyRec) prefix() uint64 { return uint64(r.plo) | uint64(r.phi)<<32 }

func (r *keyRec) free() bool { return r.st == stFree }

// key is a (namespace, position, prefix) triple: one node of one namespace's prefix tree.
type key struct {
	prefix uint64
	pos    uint32
	ns     uint32
}

func (k key) loc() uint64 { return uint64(k.ns)<<32 | uint64(k.pos) }

// shard is k as the positional index names it.
func (k key) shard() shard.Key { return shard.Key{Prefix: k.prefix, Pos: k.pos, NS: k.ns} }

// keySlot is one slot of the key index, 6 bytes: the record id + 1 (0: empty) in two
// halves, and a meta word holding how far the slot lies past its home slot (dist) and
// eight more bits of the key's fingerprint (tag), so a probe reads the slab only for a
// record whose tag matches (one in 256 of the others). The slot stores no hash: its home
// is its position less dist, and growth rehashes the slab's records instead.
type keySlot struct {
	lo, hi uint16
	meta   uint16 // dist<<8 | tag
}

// maxKeyDist is the largest dist a slot holds; a probe run that would need more makes
// the index grow (at the index's load, a run that long does not occur by chance, and
// where keys land depends on the engine's secret seed).
const maxKeyDist = 255

func newKeySlot(rid uint32, dist uint64, tag uint8) keySlot {
	ref := rid + 1
	return keySlot{lo: uint16(ref), hi: uint16(ref >> 16), meta: uint16(dist)<<8 | uint16(tag)}
}

func (s keySlot) ref() uint32  { return uint32(s.lo) | uint32(s.hi)<<16 }
func (s keySlot) dist() uint64 { return uint64(s.meta >> 8) }
func (s keySlot) tag() uint8   { return uint8(s.meta) }

type keyTable struct {
	recs []keyRec
	idx  []keySlot
	// ext is what few workers need, behind one pointer so that the rest do not pay for
	// it (nil until needed).
	ext  *keyExt
	free uint32 // record id + 1 of the first free record, 0 if none
	n    int32  // live records (int32 keeps the worker struct in a smaller size class)
	nidx int32  // records in idx
	// ghosts counts the records with seqs == 0 (kept for their held children): they
	// are all in idx, and while there are none a key that its parent's record does not
	// name has no record.
	ghosts int32
	// full makes every record go in idx, so that any key can be looked up (find) and
	// not only from its parent's record: the tables of a worker with tier components.
	full bool
}

// keyExt is the part of a key table that records do not pack.
type keyExt struct {
	// wide holds, by record id, what the records whose location is locWide or whose
	// counts are wide could not pack.
	wide map[uint32]wideRec
	// nss maps the local namespace ids 1..len(nss) of loc to engine namespace ids. It
	// only grows (until the worker is cleared), so a namespace keeps its local id.
	nss []uint32
}

// extra returns t.ext, creating it with its side table.
func (t *keyTable) extra() *keyExt {
	if t.ext == nil {
		t.ext = &keyExt{wide: make(map[uint32]wideRec)}
	}
	return t.ext
}

// localNS returns the local id of namespace ns, if it has one.
func (t *keyTable) localNS(ns uint32) (uint32, bool) {
	if ns == 0 {
		return 0, true
	}
	if t.ext == nil {
		return 0, false
	}
	for i, g := range t.ext.nss {
		if g == ns {
			return uint32(i) + 1, true
		}
	}
	return 0, false
}

// locOf returns k's location word: packed, or locWide when k's position does not fit or
// its namespace has no local id. With create set, a namespace without one gets the next
// free local id, if any is left.
func (t *keyTable) locOf(k key, create bool) uint32 {
	if k.pos > locPosMask {
		return locWide
	}
	l, ok := t.localNS(k.ns)
	if !ok {
		if !create || t.ext != nil && len(t.ext.nss) >= locNSMax {
			return locWide
		}
		x := t.extra()
		x.nss = append(x.nss, k.ns)
		l = uint32(len(x.nss))
	}
	return l<<stPosBits | k.pos
}

// pos returns record rid's position.
func (t *keyTable) pos(rid uint32) uint32 {
	if l := t.recs[rid].loc(); l < locWide {
		return l & locPosMask
	}
	return t.ext.wide[rid].pos
}

// ns returns record rid's namespace.
func (t *keyTable) ns(rid uint32) uint32 {
	l := t.recs[rid].loc()
	switch {
	case l <= locPosMask:
		return 0
	case l < locWide:
		return t.ext.nss[l>>stPosBits-1]
	}
	return t.ext.wide[rid].ns
}

// key returns record rid's key.
func (t *keyTable) key(rid uint32) key {
	r := &t.recs[rid]
	if l := r.loc(); l <= locPosMask { // the default namespace, packed: most records
		return key{prefix: r.prefix(), pos: l}
	}
	return key{prefix: r.prefix(), pos: t.pos(rid), ns: t.ns(rid)}
}

// is reports whether record rid has key k, whose location word (locOf without create)
// is loc.
func (t *keyTable) is(rid uint32, k key, loc uint32) bool {
	r := &t.recs[rid]
	if r.plo != uint32(k.prefix) || r.phi != uint32(k.prefix>>32) || r.loc() != loc {
		return false
	}
	if loc != locWide {
		return true
	}
	w := t.ext.wide[rid]
	return w.pos == k.pos && w.ns == k.ns
}

// seqs returns record rid's engine-hash count.
func (t *keyTable) seqs(rid uint32) uint32 {
	r := &t.recs[rid]
	if r.wideCounts() {
		return t.ext.wide[rid].seqs
	}
	return r.st >> stSeqShift & stSeqMask
}

// kids returns record rid's held-children count.
func (t *keyTable) kids(rid uint32) uint32 {
	r := &t.recs[rid]
	if r.wideCounts() {
		return t.ext.wide[rid].kids
	}
	return r.st >> stKidShift
}

// addSeqs adds d (+1 or -1) to record rid's engine-hash count and returns the count.
// The count must not go below 0.
func (t *keyTable) addSeqs(rid uint32, d int32) uint32 {
	r := &t.recs[rid]
	if s := int32(r.st >> stSeqShift & stSeqMask); s != stSeqWide && s+d >= 0 && s+d <= cntSeqMax {
		r.st = uint32(int32(r.st) + d<<stSeqShift)
		return uint32(s + d)
	}
	return t.addWide(rid, d, 0).seqs
}

// addKids adds d (+1 or -1) to record rid's held-children count and returns the count.
func (t *keyTable) addKids(rid uint32, d int32) uint32 {
	r := &t.recs[rid]
	if k := int32(r.st >> stKidShift); !r.wideCounts() && k+d >= 0 && k+d <= cntKidMax {
		r.st = uint32(int64(r.st) + int64(d)<<stKidShift)
		return uint32(k + d)
	}
	return t.addWide(rid, 0, d).kids
}

// addWide is the slow path of addSeqs and addKids: a count that leaves its inline
// field, or a record whose counts are wide. Counts that fit inline again go back, and a
// record's entry in wide goes once nothing of it is wide.
func (t *keyTable) addWide(rid uint32, ds, dk int32) wideRec {
	r := &t.recs[rid]
	locWideRec := r.loc() == locWide
	var w wideRec
	if r.wideCounts() || locWideRec {
		w = t.ext.wide[rid]
	}
	if !r.wideCounts() {
		w.seqs, w.kids = r.st>>stSeqShift&stSeqMask, r.st>>stKidShift
	}
	if int64(w.seqs)+int64(ds) < 0 || int64(w.kids)+int64(dk) < 0 {
		panic("engine: worker key table count below zero")
	}
	w.seqs, w.kids = uint32(int64(w.seqs)+int64(ds)), uint32(int64(w.kids)+int64(dk))
	if w.seqs <= cntSeqMax && w.kids <= cntKidMax {
		r.st = r.loc() | w.seqs<<stSeqShift | w.kids<<stKidShift
		switch {
		case locWideRec:
			t.ext.wide[rid] = wideRec{pos: w.pos, ns: w.ns}
		case t.ext != nil:
			delete(t.ext.wide, rid)
		}
		return w
	}
	t.extra().wide[rid] = w
	r.st = r.loc() | stSeqWide<<stSeqShift
	return w
}

// keyTag is the key index's tag of the key whose fingerprint (Env.fingerprint) is fp;
// the home slot comes from its top bits.
func keyTag(fp uint64) uint8 { return uint8(fp) }

// The key index keeps Robin Hood order (see table.Dist): a probe stops at the first slot
// nearer to its home than the probe is, and a deletion shifts back only up to the first
// slot at its home, which keeps the dense index's long runs cheap.

// fpOf is k's fingerprint, the key index's hash of k (Env.fingerprint, the same
// hash as the positional index's).
func fpOf(seed *table.Seed, k key) uint64 { return seed.Hash128(k.prefix, k.loc()) }

// inIdx reports whether live record rid belongs in the key index: every record of a full
// table; else a root, a ghost, or a held key whose parent's held children are indexed.
// A held key at a position > 0 whose parent's child word names it is reached from the
// parent's record instead.
func (t *keyTable) inIdx(rid uint32) bool {
	if t.full || t.seqs(rid) == 0 {
		return true
	}
	p := t.recs[rid].parent
	return p == 0 || t.recs[p-1].child == childIndexed
}

// lookup returns the record of k, whose fingerprint is fp, if the table has one (held
// or a ghost). parent is the record id + 1 of k's parent key, which must exist, when k
// is not a root; 0 for a root, or when the caller does not know it (full tables only).
// A held k at a position > 0 is its parent's linked child or, when its parent's
// children are indexed, in the index; a ghost is in the index.
func (t *keyTable) lookup(k key, fp uint64, parent uint32) (uint32, bool) {
	if k.pos > 0 && parent != 0 && !t.full {
		switch c := t.recs[parent-1].child; {
		case c == childIndexed:
		case c != 0 && t.is(c-1, k, t.locOf(k, false)):
			return c - 1, true
		case t.ghosts == 0:
			return 0, false
		}
	}
	return t.findFP(k, fp)
}

// find returns the record id of k if the key index has it: any record of a full table,
// a root or a ghost of any table.
func (t *keyTable) find(seed *table.Seed, k key) (uint32, bool) { return t.findFP(k, fpOf(seed, k)) }

func (t *keyTable) findFP(k key, fp uint64) (uint32, bool) {
	if len(t.idx) == 0 {
		return 0, false
	}
	_, _, rid, ok := t.probe(k, t.locOf(k, false), fp, keyTag(fp))
	return rid, ok
}

// findOrAdd returns the record id of k in a full table, creating a record with zero
// counts, in the index (which the caller must make non-empty before any other table
// operation). It may move the slab: pointers into recs do not survive it.
func (t *keyTable) findOrAdd(seed *table.Seed, k key) uint32 {
	fp := fpOf(seed, k)
	if rid, ok := t.findFP(k, fp); ok {
		return rid
	}
	rid := t.newRec(k)
	t.index(seed, rid, k, fp)
	return rid
}

// newRec creates a record of k with zero counts and no links, not in the index, and
// returns its id. It may move the slab.
func (t *keyTable) newRec(k key) uint32 {
	loc := t.locOf(k, true) // a namespace new to the worker gets a local id
	r := keyRec{plo: uint32(k.prefix), phi: uint32(k.prefix >> 32), st: loc}
	var rid uint32
	if t.free != 0 {
		rid = t.free - 1
		t.free = t.recs[rid].parent
		t.recs[rid] = r
	} else {
		rid = uint32(len(t.recs))
		if len(t.recs) == cap(t.recs) {
			t.growRecs()
		}
		t.recs = append(t.recs, r)
	}
	if loc == locWide {
		t.extra().wide[rid] = wideRec{pos: k.pos, ns: k.ns}
	}
	t.n++
	return rid
}

// index puts record rid, of key k and fingerprint fp, in the key index unless it is
// there already. The record's state must already say it belongs there (inIdx): a
// growth rebuilds the index from the slab, and a rebuild puts in every such record.
func (t *keyTable) index(seed *table.Seed, rid uint32, k key, fp uint64) {
	if table.FullDense(int(t.nidx), len(t.idx)) {
		t.resizeIdx(seed, table.Grown(len(t.idx)))
	}
	tag := keyTag(fp)
	i, d, _, found := t.probe(k, t.locOf(k, false), fp, tag)
	if found {
		return
	}
	t.nidx++
	// (d past maxKeyDist would not fit the slot's dist byte: newKeySlot would wrap it.)
	if d > maxKeyDist || !t.shiftIn(i, newKeySlot(rid, d, tag)) {
		// A probe run would outgrow dist: grow (the rebuild indexes rid).
		t.resizeIdx(seed, table.Grown(len(t.idx)))
	}
}

// release frees record rid, which has no counts left and is not in the index.
func (t *keyTable) release(rid uint32) {
	if t.recs[rid].loc() == locWide {
		delete(t.ext.wide, rid) // its counts are 0: inline
	}
	t.recs[rid] = keyRec{st: stFree, parent: t.free}
	t.free = rid + 1
	t.n--
}

// del deletes record rid of a full table, which the caller has just made empty.
func (t *keyTable) del(seed *table.Seed, rid uint32) {
	t.unindex(rid, fpOf(seed, t.key(rid)))
	t.release(rid)
}

// growRecs makes room for more records: an eighth more (at least slabStep), instead of
// the quarter that append gives a large slice, since a slab, unlike an open-addressing
// table, is full up to its length, and the slack past it is all its overhead. Growth
// copies the slab (20-byte records), about eight copies per record over its life.
func (t *keyTable) growRecs() {
	n := len(t.recs)
	t.recs = append(t.recs[:n:n], make([]keyRec, max(n/8, slabStep))...)[:n]
}

// slabStep is the least a slab grows by: 64 records, 1 KiB.
const slabStep = 64

// probe looks k (location word loc, fingerprint fp, tag tag) up: its record id if
// found, else the slot where it belongs (empty, or the first one nearer to its home
// than k would be: Robin Hood order) and k's dist there.
func (t *keyTable) probe(k key, loc uint32, fp uint64, tag uint8) (i, d uint64, rid uint32, found bool) {
	n := len(t.idx)
	for i = table.Home(fp, n); ; i, d = table.Next(i, n), d+1 {
		s := t.idx[i]
		ref := s.ref()
		if ref == 0 || s.dist() < d {
			return i, d, 0, false
		}
		if s.dist() == d && s.tag() == tag && t.is(ref-1, k, loc) {
			return i, d, ref - 1, true
		}
	}
}

// shiftIn puts e at slot i, where the probe for it stopped: the index's runs are sorted
// by home (Robin Hood order), so the slots from i up to the next empty one each move one
// step on, one slot farther from home. It reports false, changing nothing, when e or a
// moved slot would lie more than maxKeyDist past its home.
func (t *keyTable) shiftIn(i uint64, e keySlot) bool {
	n := len(t.idx)
	if e.dist() > maxKeyDist {
		return false
	}
	j := i
	for ; t.idx[j].ref() != 0; j = table.Next(j, n) {
		if t.idx[j].dist() == maxKeyDist {
			return false
		}
	}
	for j != i {
		p := j - 1
		if j == 0 {
			p = uint64(n - 1)
		}
		s := t.idx[p]
		s.meta += 1 << 8
		t.idx[j] = s
		j = p
	}
	t.idx[i] = e
	return true
}

// place puts e, whose dist is its distance from home at slot i, in Robin Hood order
// (each slot it meets that is nearer to its home than e gives way and moves on). It
// reports false when a slot would lie more than maxKeyDist past its home; the index is
// then inconsistent and must be rebuilt bigger.
func (t *keyTable) place(i uint64, e keySlot) bool {
	n := len(t.idx)
	for {
		s := &t.idx[i]
		if s.ref() == 0 {
			*s = e
			return true
		}
		if s.dist() < e.dist() {
			*s, e = e, *s
		}
		if e.dist() == maxKeyDist {
			return false
		}
		e.meta += 1 << 8
		i = table.Next(i, n)
	}
}

// unindex takes record rid, whose fingerprint is fp and which is in the key index, out
// of it. The slots after it shift back, each one step nearer to its home, up to the
// first one at its home.
func (t *keyTable) unindex(rid uint32, fp uint64) {
	n := len(t.idx)
	i := table.Home(fp, n)
	for t.idx[i].ref() != rid+1 {
		if t.idx[i].ref() == 0 {
			panic("engine: worker key index lost a record")
		}
		i = table.Next(i, n)
	}
	for {
		j := table.Next(i, n)
		s := t.idx[j]
		if s.ref() == 0 || s.dist() == 0 {
			break
		}
		s.meta -= 1 << 8
		t.idx[i] = s
		i = j
	}
	t.idx[i] = keySlot{}
	t.nidx--
}

// resizeIdx rebuilds the key index with at least c slots from the slab: the slots store
// no hash, so each live record's fingerprint is computed again (records are read in
// slab order).
func (t *keyTable) resizeIdx(seed *table.Seed, c int) {
	for {
		t.idx = make([]keySlot, c)
		if t.reindex(seed) {
			return
		}
		c = table.Grown(c)
	}
}

// reindex indexes every live record that belongs in the (empty) index (inIdx); false
// if a run outgrew dist.
func (t *keyTable) reindex(seed *table.Seed) bool {
	n := len(t.idx)
	t.nidx = 0
	for rid := range t.recs {
		if t.recs[rid].free() || !t.inIdx(uint32(rid)) {
			continue
		}
		fp := fpOf(seed, t.key(uint32(rid)))
		if !t.place(table.Home(fp, n), newKeySlot(uint32(rid), 0, keyTag(fp))) {
			return false
		}
		t.nidx++
	}
	return true
}

// relink recomputes every record's child word from the parent links (a parent with one
// held child links it, unless the table is full; one with more indexes them), recounts
// the ghosts and rebuilds the key index: after compact renumbers the records, and when
// a table becomes full or partial (setFull).
func (t *keyTable) relink(seed *table.Seed) {
	t.ghosts = 0
	for i := range t.recs {
		t.recs[i].child = 0
	}
	for i := range t.recs {
		r := &t.recs[i]
		switch {
		case r.free():
		case t.seqs(uint32(i)) == 0:
			t.ghosts++
		case r.parent != 0:
			if p := &t.recs[r.parent-1]; t.full || p.child != 0 {
				p.child = childIndexed
			} else {
				p.child = uint32(i) + 1
			}
		}
	}
	n := 0
	for i := range t.recs {
		if !t.recs[i].free() && t.inIdx(uint32(i)) {
			n++
		}
	}
	t.resizeIdx(seed, table.ForEntries(n))
}

// setFull makes the table index every record (full) or only those its parents cannot
// reach (not full). O(records).
func (t *keyTable) setFull(seed *table.Seed, full bool) {
	if t.full == full {
		return
	}
	t.full = full
	if t.n > 0 {
		t.relink(seed)
	}
}

// sparse reports whether the slab or the index is mostly empty, so that compact would
// give memory back.
func (t *keyTable) sparse() bool {
	return table.Sparse(int(t.nidx), len(t.idx), tableFloor) || len(t.recs) > tableFloor && int(t.n)*4 < len(t.recs)
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

// probes returns the number of key-index slots a lookup of k reads.
func (t *keyTable) probes(seed *table.Seed, k key) int {
	fp := fpOf(seed, k)
	_, d, _, _ := t.probe(k, t.locOf(k, false), fp, keyTag(fp))
	return int(d) + 1
}
