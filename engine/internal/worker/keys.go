package worker

import (
	"slices"

	"github.com/kvindex/kvindex/internal/table"
	"github.com/kvindex/kvindex/shard"
)

// The key table keeps a worker's keys by segment: a segment is a run of consecutive
// positions of one chain in one namespace, inside one stride of segMax positions (a
// segment never crosses a multiple of segMax), and each of its blocks is one key. A
// block is named by its ref, the segment's id and the block's offset in it
// (refOf), which the seq slots and the key index store; refs stay valid while their
// block lives, whatever moves in the arena.
//
//   - segs, the headers (segHdr, 20 bytes), at stable ids until freed; freed headers
//     go on a free list and are reused.
//   - ar, the arena: each segment's blocks live in one chunk of it, their prefixes
//     first, then their meta bytes (seqs and branch counts, meta), eight to a word, so
//     that a block costs 9 bytes and a chunk's words are next to each other. Chunks
//     come in the capacities of segCaps; a freed chunk goes on its capacity's free list.
//   - idx, the key index: the first block of every segment (and every block of a full
//     table), 6-byte slots (keySlot).
//
// A block's parent key is the block before it in its segment; the first block's is
// named by its segment's parent link while that block is held (a ghost first block keeps
// none). A store that extends the chain of a segment's last
// block appends to the segment; one that extends a block in the middle of a segment
// with another content, or under a segment's last block at a stride's end, starts a
// segment of its own (a branch). Removal trims a segment from its end: a last block
// that is not held and has no held branch child goes, and the ones before it with it.
//
// A block is held (its seqs count > 0), a ghost (not held, with held children, kept so
// that a refill reconnects them), or dead: not held and no held child, kept only
// because a later block of its segment is. Dead blocks are dropped by compaction
// (keyTable.compact), which splits their segments; it runs when the table is mostly
// unheld or its arena mostly free. All of it is owned by whoever holds the worker's
// mutex.

// segBits is the width of a block's offset in its ref: segments hold at most segMax
// blocks, one stride of the default jump size.
const (
	segBits = 6
	segMax  = 1 << segBits
	offMask = segMax - 1
)

// MaxSegments is the most live segments one table names: a segment's id and a block's
// offset share a 32-bit ref, whose value + 1 the seq slots and the key index store. A
// worker reaches it only with tens of millions of one-block chains on one tier; the
// engine refuses the event that would pass it (HasRoom).
const MaxSegments = 1<<(32-segBits) - 1

// segLimit is MaxSegments, or less in tests (SetSegLimitForTest).
var segLimit = MaxSegments

// maxChunk is the largest chunk's words, and arenaLimit the most words an arena takes
// (chunk offsets are 32-bit).
const (
	maxChunk   = segMax + segMax/8
	arenaLimit = 1<<32 - 1
)

// SetSegLimitForTest lowers the segment limit to n and returns what restores it, so
// that tests reach it with a few blocks. Not for concurrent use with anything else.
func SetSegLimitForTest(n int) (restore func()) {
	old := segLimit
	segLimit = n
	return func() { segLimit = old }
}

// refOf is the ref of block off of segment seg.
func refOf(seg, off uint32) uint32 { return seg<<segBits | off }

func segOf(ref uint32) uint32 { return ref >> segBits }
func offOf(ref uint32) uint32 { return ref & offMask }

// segCaps are the chunk capacities, in blocks: each about a third or a half more than
// the one before, so that a chunk has at most that much slack.
var segCaps = [...]uint8{1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64}

const numClasses = len(segCaps)

// chunkWords is the arena words of a chunk of capacity c: c prefixes and their meta bytes.
func chunkWords(c uint8) uint32 { return uint32(c) + (uint32(c)+7)/8 }

// classFor is the smallest class whose capacity holds n blocks (n <= segMax).
func classFor(n int) uint8 {
	for i, c := range segCaps {
		if int(c) >= n {
			return uint8(i)
		}
	}
	panic("engine: segment longer than a stride")
}

// segHdr is one segment's header, 20 bytes. A free header has n == 0 and chains the
// free list through parent.
type segHdr struct {
	at     uint32 // the chunk's first arena word (block 0's prefix)
	parent uint32 // ref + 1 of block 0's parent key while block 0 is held at pos0 > 0, else 0
	pos0   uint32 // block 0's position
	ns     uint32 // the segment's namespace
	n      uint8  // blocks
	class  uint8  // the chunk's capacity class
}

// meta is a block's byte: its seqs count in the low two bits and its held branch
// children (first blocks of segments whose parent link names it) above them. A count
// that outgrows its field moves both to keyExt.wide; the byte then reads metaWide.
const (
	metaSeqMax = 2
	metaKidMax = 62
	metaWide   = 0xff
)

// key is a (namespace, position, prefix) triple: one node of one namespace's prefix tree.
type key struct {
	prefix uint64
	pos    uint32
	ns     uint32
}

func (k key) loc() uint64 { return uint64(k.ns)<<32 | uint64(k.pos) }

// shard is k as the positional index names it.
func (k key) shard() shard.Key { return shard.Key{Prefix: k.prefix, Pos: k.pos, NS: k.ns} }

// keySlot is one slot of the key index, 6 bytes: the ref + 1 (0: empty) in two
// halves, and a meta word holding how far the slot lies past its home slot (dist) and
// eight more bits of the key's fingerprint (tag), so a probe reads the arena only for a
// block whose tag matches (one in 256 of the others). The slot stores no hash: its home
// is its position less dist, and growth rehashes the blocks instead.
type keySlot struct {
	lo, hi uint16
	meta   uint16 // dist<<8 | tag
}

// maxKeyDist is the largest dist a slot holds; a probe run that would need more makes
// the index grow (at the index's load, a run that long does not occur by chance, and
// where keys land depends on the engine's secret seed).
const maxKeyDist = 255

func newKeySlot(ref uint32, dist uint64, tag uint8) keySlot {
	r := ref + 1
	return keySlot{lo: uint16(r), hi: uint16(r >> 16), meta: uint16(dist)<<8 | uint16(tag)}
}

func (s keySlot) ref() uint32  { return uint32(s.lo) | uint32(s.hi)<<16 }
func (s keySlot) dist() uint64 { return uint64(s.meta >> 8) }
func (s keySlot) tag() uint8   { return uint8(s.meta) }

// wideCnt holds the counts of a block whose meta byte reads metaWide.
type wideCnt struct{ seqs, kids uint32 }

// keyExt is the part of a key table that few workers need, behind one pointer.
type keyExt struct {
	// wide holds, by ref, the counts that did not fit a meta byte.
	wide map[uint32]wideCnt
}

type keyTable struct {
	segs []segHdr
	ar   []uint64
	idx  []keySlot
	ext  *keyExt
	// freeSeg is the id + 1 of the first free header; freeChunk the arena word + 1 of
	// the first free chunk of each class (its first word holds the next one's).
	freeSeg uint32
	// shrinkSeg is the id + 1 of a segment whose shrink trim put off (settleShrink), 0
	// when none.
	shrinkSeg uint32
	freeChunk [numClasses]uint32
	nsegs     int32 // live segments
	blocks    int32 // blocks of live segments
	held      int32 // held blocks
	// loose counts the live segments whose first block is not held: a branch lookup
	// that its parent's counts do not send to the index must still go there while any
	// exists.
	loose int32
	nidx  int32 // slots used in idx
	// chunks is the arena words of live segments' chunks.
	chunks int32
	// nsOther counts the live segments outside the default namespace, so that a
	// namespace sweep skips a table without any.
	nsOther int32
	// kept is the unheld blocks the last compaction could not drop (ghosts), so that a
	// table of many ghosts does not compact on every removal.
	kept int32
	// full makes every block go in idx, so that any key can be looked up (find) and
	// not only from its parent: the tables of a worker with tier components.
	full bool
}

// prefix returns block ref's prefix.
func (t *keyTable) prefix(ref uint32) uint64 {
	return t.ar[t.segs[segOf(ref)].at+offOf(ref)]
}

// key returns block ref's key.
func (t *keyTable) key(ref uint32) key {
	h := &t.segs[segOf(ref)]
	off := offOf(ref)
	return key{prefix: t.ar[h.at+off], pos: h.pos0 + off, ns: h.ns}
}

// metaWord returns the arena word holding block ref's meta byte, and the byte's shift.
func (t *keyTable) metaWord(ref uint32) (*uint64, uint32) {
	h := &t.segs[segOf(ref)]
	off := offOf(ref)
	return &t.ar[h.at+uint32(segCaps[h.class])+off/8], 8 * (off % 8)
}

func (t *keyTable) meta(ref uint32) uint8 {
	w, sh := t.metaWord(ref)
	return uint8(*w >> sh)
}

func (t *keyTable) setMeta(ref uint32, m uint8) {
	w, sh := t.metaWord(ref)
	*w = *w&^(0xff<<sh) | uint64(m)<<sh
}

// seqs returns block ref's engine-hash count.
func (t *keyTable) seqs(ref uint32) uint32 { return t.seqsOf(ref, t.meta(ref)) }

// seqsOf is seqs of block ref whose meta byte, read by the caller, is m.
func (t *keyTable) seqsOf(ref uint32, m uint8) uint32 {
	if m == metaWide {
		return t.ext.wide[ref].seqs
	}
	return uint32(m & 3)
}

// kids returns block ref's held branch children: first blocks of other segments whose
// parent link names it (heldKids adds the next block of its own segment).
func (t *keyTable) kids(ref uint32) uint32 {
	m := t.meta(ref)
	if m == metaWide {
		return t.ext.wide[ref].kids
	}
	return uint32(m >> 2)
}

// heldKids returns how many held keys have block ref's key as their parent: its held
// branch children and the next block of its segment if that one is held.
func (t *keyTable) heldKids(ref uint32) uint32 {
	n := t.kids(ref)
	if offOf(ref)+1 < uint32(t.segs[segOf(ref)].n) && t.seqs(ref+1) > 0 {
		n++
	}
	return n
}

// addSeqs adds d (+1 or -1) to block ref's engine-hash count and returns the count.
func (t *keyTable) addSeqs(ref uint32, d int32) uint32 {
	m := t.meta(ref)
	if s := int32(m & 3); m != metaWide && s+d >= 0 && s+d <= metaSeqMax {
		t.setMeta(ref, uint8(int32(m)+d))
		return uint32(s + d)
	}
	return t.addWide(ref, d, 0).seqs
}

// addKids adds d (+1 or -1) to block ref's held branch children and returns the count.
func (t *keyTable) addKids(ref uint32, d int32) uint32 {
	m := t.meta(ref)
	if k := int32(m >> 2); m != metaWide && k+d >= 0 && k+d <= metaKidMax {
		t.setMeta(ref, uint8(int32(m)+d<<2))
		return uint32(k + d)
	}
	return t.addWide(ref, 0, d).kids
}

// addWide is the slow path of addSeqs and addKids: counts that leave the meta byte, or
// a block whose counts are wide. Counts that fit again go back to the byte.
func (t *keyTable) addWide(ref uint32, ds, dk int32) wideCnt {
	m := t.meta(ref)
	var w wideCnt
	if m == metaWide {
		w = t.ext.wide[ref]
	} else {
		w = wideCnt{seqs: uint32(m & 3), kids: uint32(m >> 2)}
	}
	if int64(w.seqs)+int64(ds) < 0 || int64(w.kids)+int64(dk) < 0 {
		panic("engine: worker key table count below zero")
	}
	w.seqs, w.kids = uint32(int64(w.seqs)+int64(ds)), uint32(int64(w.kids)+int64(dk))
	if w.seqs <= metaSeqMax && w.kids <= metaKidMax {
		t.setMeta(ref, uint8(w.seqs|w.kids<<2))
		if m == metaWide {
			delete(t.ext.wide, ref)
		}
		return w
	}
	if t.ext == nil {
		t.ext = &keyExt{wide: make(map[uint32]wideCnt)}
	}
	t.ext.wide[ref] = w
	t.setMeta(ref, metaWide)
	return w
}

// parentOf returns the ref + 1 of block ref's parent key: the block before it, or its
// segment's parent link for a first block (0 for a root or an unlinked first block).
func (t *keyTable) parentOf(ref uint32) uint32 {
	if offOf(ref) > 0 {
		return ref // (ref - 1) + 1
	}
	return t.segs[segOf(ref)].parent
}

// parentPrefix returns the prefix of held block ref's parent key, 0 for a root.
func (t *keyTable) parentPrefix(ref uint32) uint64 {
	if p := t.parentOf(ref); p != 0 {
		return t.prefix(p - 1)
	}
	return 0
}

// is reports whether block ref has key k.
func (t *keyTable) is(ref uint32, k key) bool {
	h := &t.segs[segOf(ref)]
	off := offOf(ref)
	return t.ar[h.at+off] == k.prefix && h.pos0+off == k.pos && h.ns == k.ns
}

// inIdx reports whether block ref belongs in the key index: every block of a full
// table, else the first block of each segment.
func (t *keyTable) inIdx(ref uint32) bool { return t.full || offOf(ref) == 0 }

// child returns the block of key k, whose fingerprint is fp, under parent block p, if
// the table has it: the next block of p's segment, or (when p has held branch children,
// when a segment's first block is unheld, or in a full table) the index's.
func (t *keyTable) child(p uint32, k key, fp uint64) (uint32, bool) {
	h := &t.segs[segOf(p)]
	off := offOf(p)
	if off+1 < uint32(h.n) && t.ar[h.at+off+1] == k.prefix {
		return p + 1, true
	}
	if t.full || t.loose > 0 || t.kids(p) > 0 {
		return t.findFP(k, fp)
	}
	return 0, false
}

// extend is the common store's shortcut: when held block p ends its segment with room
// for k in its chunk and its stride, and no block of k can exist elsewhere (p has no
// held branch child and no segment's first block is unheld: the caller checks
// loose), it appends k as a held block with one seq and returns it. Otherwise it
// changes nothing and reports false. Not for full tables.
func (t *keyTable) extend(p uint32, k key) (uint32, bool) {
	seg, n, ok := t.runRoom(p, k.pos-1)
	if !ok {
		return 0, false
	}
	h := &t.segs[seg]
	c := uint32(segCaps[h.class])
	if n == c {
		return 0, false // its chunk is full: attach grows it
	}
	t.ar[h.at+n] = k.prefix
	t.ar[h.at+c+n/8] |= 1 << (8 * (n % 8)) // one seq (the byte was 0: past the end)
	h.n++
	t.blocks++
	return refOf(seg, n), true
}

// runRoom reports whether blocks may extend the segment of block p, at position pos
// (extend's one block, Worker.storeRun's run): p ends its segment, holds a seq, has no
// branch child, and pos+1 is in the same stride (ok); seg is the segment, n0 the
// offset of the first block to come. Nothing changes.
func (t *keyTable) runRoom(p, pos uint32) (seg, n0 uint32, ok bool) {
	seg = segOf(p)
	h := &t.segs[seg]
	off := offOf(p)
	if off+1 != uint32(h.n) || (pos+1)/segMax != h.pos0/segMax {
		return 0, 0, false
	}
	mw := t.ar[h.at+uint32(segCaps[h.class])+off/8]
	if m := uint8(mw >> (8 * (off % 8))); m == 0 || m == metaWide || m>>2 != 0 {
		return 0, 0, false // not held, or a branch parent
	}
	return seg, off + 1, true
}

// growFor moves segment seg to a chunk of at least n blocks if its own is smaller, and
// returns its header (the arena and the headers may have moved).
func (t *keyTable) growFor(seg uint32, n int) *segHdr {
	if h := &t.segs[seg]; n > int(segCaps[h.class]) {
		t.move(seg, classFor(n))
	}
	return &t.segs[seg]
}

// attach makes a block of key k (fingerprint fp) under parent block p, which has no
// block of that key: appended to p's segment when p ends it and k is in the same
// stride, else the first of a new segment. hint is how many blocks the caller is about
// to add along this chain (k's included), for the chunk's size. The block is not held.
func (t *keyTable) attach(seed *table.Seed, p uint32, k key, fp uint64, hint int) uint32 {
	seg := segOf(p)
	h := &t.segs[seg]
	if offOf(p)+1 == uint32(h.n) && k.pos/segMax == h.pos0/segMax {
		return t.appendBlock(seed, seg, k, fp, hint)
	}
	return t.newSeg(seed, k, fp, hint)
}

// newSeg makes a segment whose one block has key k (fingerprint fp), not held, in the
// index, and returns the block's ref. hint sizes its chunk (see attach). It may move
// the arena and the headers.
func (t *keyTable) newSeg(seed *table.Seed, k key, fp uint64, hint int) uint32 {
	room := segMax - int(k.pos%segMax)
	class := classFor(max(1, min(hint, room)))
	at := t.allocChunk(class)
	var seg uint32
	if t.freeSeg != 0 {
		seg = t.freeSeg - 1
		t.freeSeg = t.segs[seg].parent
	} else {
		seg = uint32(len(t.segs))
		if seg >= MaxSegments {
			panic("engine: worker key table has too many segments") // HasRoom says no first
		}
		t.segs = append(t.segs, segHdr{})
	}
	t.segs[seg] = segHdr{at: at, pos0: k.pos, ns: k.ns, n: 1, class: class}
	t.ar[at] = k.prefix
	t.nsegs++
	if k.ns != 0 {
		t.nsOther++
	}
	t.blocks++
	t.loose++
	ref := refOf(seg, 0)
	t.index(seed, ref, k, fp)
	return ref
}

// appendBlock adds a block of key k (fingerprint fp) at the end of segment seg, not
// held, and returns its ref; the chunk grows to hold hint more blocks when it is full.
func (t *keyTable) appendBlock(seed *table.Seed, seg uint32, k key, fp uint64, hint int) uint32 {
	h := &t.segs[seg]
	n := int(h.n)
	if n == int(segCaps[h.class]) {
		room := segMax - int(h.pos0%segMax)
		t.move(seg, classFor(min(n+max(hint, 1), room)))
		h = &t.segs[seg]
	}
	ref := refOf(seg, uint32(n))
	h.n++
	t.ar[h.at+uint32(n)] = k.prefix
	t.setMeta(ref, 0)
	t.blocks++
	if t.full {
		t.index(seed, ref, k, fp)
	}
	return ref
}

// trim drops the blocks at the end of segment seg that are not held and have no held
// branch child, and frees the segment once it is empty; a chunk left with room to
// spare moves to a smaller one (shrink) when the caller settles (settleShrink), or
// when a trim of another segment comes first: a removal that drains a segment's tail
// block by block moves it once, not once per size class on the way down.
func (t *keyTable) trim(seed *table.Seed, seg uint32) {
	h := &t.segs[seg]
	for h.n > 0 {
		ref := refOf(seg, uint32(h.n)-1)
		if t.meta(ref) != 0 { // held, or a held branch child (a wide byte is never 0)
			break
		}
		if t.inIdx(ref) {
			t.unindex(ref, fpOf(seed, t.key(ref)))
		}
		if h.n == 1 {
			t.loose-- // the first block, not held
		}
		h.n--
		t.blocks--
	}
	if h.n == 0 {
		if h.ns != 0 {
			t.nsOther--
		}
		if t.shrinkSeg == seg+1 {
			t.shrinkSeg = 0
		}
		t.freeChunkAt(h.at, h.class)
		*h = segHdr{parent: t.freeSeg}
		t.freeSeg = seg + 1
		t.nsegs--
		return
	}
	t.putOffShrink(seg)
}

// putOffShrink records that segment seg, trimmed and not empty, may have to shrink: a
// removal of many blocks of one segment shrinks it once, when it is done with it or
// moves on to another segment (settleShrink).
func (t *keyTable) putOffShrink(seg uint32) {
	if t.shrinkSeg != seg+1 {
		t.settleShrink()
		t.shrinkSeg = seg + 1
	}
}

// settleShrink shrinks the segment whose shrink trim put off, if any. Whoever trims
// settles before the table is read by anyone else (the worker's event methods that
// drop keys do before they return).
func (t *keyTable) settleShrink() {
	if s := t.shrinkSeg; s != 0 {
		t.shrinkSeg = 0
		t.shrink(s - 1)
	}
}

// shrink moves segment seg to a smaller chunk once it is under a quarter full, to the
// smallest class that holds its blocks with one to spare (the spare keeps a segment
// that loses and regains its last block from moving each time). A segment that a
// removal per event drains block by block (vLLM evicts a chain's tail leaf first)
// moves twice on its way from 64 blocks to none, not at every class: shrinking at the
// next smaller class instead (chunks at least about two thirds full) moved eight times
// (TestDrainMovesTwice counts them): a per-event pass of the conversation trace took
// 211.7M instructions that way against 196.3-201.4M (scripts/instructions.sh events), for the
// same heap per membership at the end of both trace logs' replays (41 and 39 B,
// kvindex bench).
func (t *keyTable) shrink(seg uint32) {
	h := &t.segs[seg]
	if h.class >= 3 && int(h.n)*4 < int(segCaps[h.class]) {
		t.move(seg, classFor(int(h.n)+1))
	}
}

// move gives segment seg a chunk of class class and copies its blocks there.
func (t *keyTable) move(seg uint32, class uint8) {
	at := t.allocChunk(class) // (may move the arena)
	h := &t.segs[seg]
	old, oc := h.at, segCaps[h.class]
	nc := segCaps[class]
	copy(t.ar[at:at+uint32(h.n)], t.ar[old:old+uint32(h.n)])
	for off := uint32(0); off < uint32(h.n); off++ {
		m := uint8(t.ar[old+uint32(oc)+off/8] >> (8 * (off % 8)))
		w := &t.ar[at+uint32(nc)+off/8]
		*w |= uint64(m) << (8 * (off % 8))
	}
	t.freeChunkAt(old, h.class)
	h.at, h.class = at, class
}

// allocChunk returns the first word of a zeroed chunk of class class. It may move the
// arena.
func (t *keyTable) allocChunk(class uint8) uint32 {
	w := chunkWords(segCaps[class])
	t.chunks += int32(w)
	if f := t.freeChunk[class]; f != 0 {
		at := f - 1
		t.freeChunk[class] = uint32(t.ar[at])
		clear(t.ar[at : at+w])
		return at
	}
	at := uint32(len(t.ar))
	if uint64(len(t.ar))+uint64(w) > arenaLimit {
		panic("engine: worker key table arena past 2^32 words") // HasRoom says no first
	}
	if len(t.ar)+int(w) > cap(t.ar) {
		t.growArena(int(w))
	}
	t.ar = t.ar[:len(t.ar)+int(w)]
	clear(t.ar[at : at+w])
	return at
}

// arenaFloor is the arena size, in words, below which its free chunks never make it
// compact: a worker that stores and evicts one chain in a loop frees a chunk of each
// size its segment shrinks through, about 250 words for a 64-block chain, and must not
// compact (and allocate) every round.
const arenaFloor = 2048

// growArena makes room for w more words: doubling while the arena is under arenaStep
// words (from a chunk's size: a worker with one short chain holds no more than it
// needs), by an eighth past that. The arena is full up to its length, and the slack
// past it is all its overhead; append would grow a large slice by a quarter, so the
// new arena is made at its capacity and copied.
func (t *keyTable) growArena(w int) {
	n := len(t.ar)
	grow := n / 8
	if n < arenaStep {
		grow = n
	}
	// slices.Grow rounds the capacity up to the allocation's size, which make would
	// leave unused (up to a page of a large arena).
	ar := slices.Grow([]uint64(nil), n+max(grow, w))[:n]
	copy(ar, t.ar)
	t.ar = ar
}

// arenaStep is the arena size, in words, past which it grows by an eighth (1 KiB).
const arenaStep = 128

// freeChunkAt puts the chunk at word at, of class class, on its free list.
func (t *keyTable) freeChunkAt(at uint32, class uint8) {
	t.chunks -= int32(chunkWords(segCaps[class]))
	t.ar[at] = uint64(t.freeChunk[class])
	t.freeChunk[class] = at + 1
}

// keyTag is the key index's tag of the key whose fingerprint (Env.fingerprint) is fp;
// the home slot comes from its top bits.
func keyTag(fp uint64) uint8 { return uint8(fp) }

// fpOf is k's fingerprint, the key index's hash of k (Env.fingerprint, the same
// hash as the positional index's).
func fpOf(seed *table.Seed, k key) uint64 { return seed.Hash128(k.prefix, k.loc()) }

// find returns the block of k if the key index has it: any block of a full table, the
// first block of a segment of any table.
func (t *keyTable) find(seed *table.Seed, k key) (uint32, bool) { return t.findFP(k, fpOf(seed, k)) }

func (t *keyTable) findFP(k key, fp uint64) (uint32, bool) {
	if len(t.idx) == 0 {
		return 0, false
	}
	_, _, ref, ok := t.probe(k, fp, keyTag(fp))
	return ref, ok
}

// The key index keeps Robin Hood order (see table.Dist): a probe stops at the first slot
// nearer to its home than the probe is, and a deletion shifts back only up to the first
// slot at its home.

// index puts block ref, of key k and fingerprint fp, in the key index unless it is
// there already. The block must belong there (inIdx): a growth rebuilds the index from
// the segments, and a rebuild puts in every such block.
func (t *keyTable) index(seed *table.Seed, ref uint32, k key, fp uint64) {
	if table.FullDense(int(t.nidx), len(t.idx)) {
		t.resizeIdx(seed, table.Grown(len(t.idx)))
	}
	tag := keyTag(fp)
	i, d, _, found := t.probe(k, fp, tag)
	if found {
		return
	}
	t.nidx++
	if d > maxKeyDist || !t.shiftIn(i, newKeySlot(ref, d, tag)) {
		// A probe run would outgrow dist: grow (the rebuild indexes ref).
		t.resizeIdx(seed, table.Grown(len(t.idx)))
	}
}

// probe looks k (fingerprint fp, tag tag) up: its ref if found, else the slot where it
// belongs (empty, or the first one nearer to its home than k would be: Robin Hood
// order) and k's dist there.
func (t *keyTable) probe(k key, fp uint64, tag uint8) (i, d uint64, ref uint32, found bool) {
	n := len(t.idx)
	for i = table.Home(fp, n); ; i, d = table.Next(i, n), d+1 {
		s := t.idx[i]
		r := s.ref()
		if r == 0 || s.dist() < d {
			return i, d, 0, false
		}
		if s.dist() == d && s.tag() == tag && t.is(r-1, k) {
			return i, d, r - 1, true
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

// place puts e, whose dist is its distance from home at slot i, in Robin Hood order. It
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

// unindex takes block ref, whose fingerprint is fp and which is in the key index, out
// of it. The slots after it shift back, each one step nearer to its home, up to the
// first one at its home.
func (t *keyTable) unindex(ref uint32, fp uint64) {
	n := len(t.idx)
	i := table.Home(fp, n)
	for t.idx[i].ref() != ref+1 {
		if t.idx[i].ref() == 0 {
			panic("engine: worker key index lost a block")
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

// resizeIdx rebuilds the key index with at least c slots from the segments (each
// indexed block's fingerprint is computed again).
func (t *keyTable) resizeIdx(seed *table.Seed, c int) {
	for {
		t.idx = make([]keySlot, c)
		if t.reindex(seed) {
			return
		}
		c = table.Grown(c)
	}
}

// reindex indexes every block that belongs in the (empty) index (inIdx); false if a
// run outgrew dist.
func (t *keyTable) reindex(seed *table.Seed) bool {
	n := len(t.idx)
	t.nidx = 0
	for seg := range t.segs {
		h := &t.segs[seg]
		for off := uint32(0); off < uint32(h.n); off++ {
			ref := refOf(uint32(seg), off)
			if !t.inIdx(ref) {
				break // (only first blocks, unless full)
			}
			fp := fpOf(seed, t.key(ref))
			if !t.place(table.Home(fp, n), newKeySlot(ref, 0, keyTag(fp))) {
				return false
			}
			t.nidx++
		}
	}
	return true
}

// indexed is how many blocks belong in the index.
func (t *keyTable) indexed() int {
	if t.full {
		return int(t.blocks)
	}
	return int(t.nsegs)
}

// setFull makes the table index every block (full) or only first blocks (not full).
// O(blocks).
func (t *keyTable) setFull(seed *table.Seed, full bool) {
	if t.full == full {
		return
	}
	t.full = full
	if t.nsegs > 0 {
		t.resizeIdx(seed, table.ForEntries(t.indexed()))
	} else {
		t.idx, t.nidx = nil, 0
	}
}

// sparse reports whether compact would give memory back: the index, the headers or
// the arena mostly empty, or most blocks unheld (dead blocks, which compaction drops,
// beyond the ghosts the last one kept).
func (t *keyTable) sparse() bool {
	unheld := t.blocks - t.held
	return table.Sparse(int(t.nidx), len(t.idx), tableFloor) ||
		len(t.segs) > tableFloor && int(t.nsegs)*4 < len(t.segs) ||
		len(t.ar) > arenaFloor && int(t.chunks)*4 < len(t.ar) ||
		unheld > tableFloor && unheld > t.held && unheld > 2*t.kept
}

// compact rebuilds the table densely: dead blocks dropped (their segments split), each
// segment in a chunk of its size, headers renumbered in order, the index rebuilt at the
// size it needs; ref maps are returned through remap, called with each old ref of a
// held block and its new ref, for the seq table. O(blocks).
func (t *keyTable) compact(seed *table.Seed, remap func(old func(uint32) uint32)) {
	if t.nsegs == 0 {
		*t = keyTable{full: t.full}
		remap(func(uint32) uint32 { panic("engine: compact of an empty table remapped a ref") })
		return
	}
	// newRef[base[seg]+off]: the new ref + 1 of each old block that stays.
	base := make([]uint32, len(t.segs)) // old segment -> index of its block 0 in newRef
	total := 0
	for seg := range t.segs {
		base[seg] = uint32(total)
		total += int(t.segs[seg].n)
	}
	newRef := make([]uint32, total)
	var segs []segHdr
	words := 0
	// First pass: split each segment into runs of blocks that stay, numbering them.
	type run struct{ seg, from, to uint32 }
	var runs []run
	for seg := range t.segs {
		h := &t.segs[seg]
		from := -1
		for off := 0; off <= int(h.n); off++ {
			stay := false
			if off < int(h.n) {
				ref := refOf(uint32(seg), uint32(off))
				stay = t.seqs(ref) > 0 || t.heldKids(ref) > 0 // else dead
			}
			switch {
			case stay && from < 0:
				from = off
			case !stay && from >= 0:
				runs = append(runs, run{uint32(seg), uint32(from), uint32(off)})
				from = -1
			}
		}
	}
	for _, r := range runs {
		id := uint32(len(segs)) // the run's new segment
		class := classFor(int(r.to - r.from))
		segs = append(segs, segHdr{at: uint32(words), pos0: t.segs[r.seg].pos0 + r.from, ns: t.segs[r.seg].ns,
			n: uint8(r.to - r.from), class: class})
		words += int(chunkWords(segCaps[class]))
		for off := r.from; off < r.to; off++ {
			newRef[base[r.seg]+off] = refOf(id, off-r.from) + 1
		}
	}
	ar := make([]uint64, words)
	var wide map[uint32]wideCnt
	if t.ext != nil && len(t.ext.wide) > 0 {
		wide = make(map[uint32]wideCnt, len(t.ext.wide))
	}
	held, loose, unheld, nsOther := int32(0), int32(0), int32(0), int32(0)
	for i, r := range runs {
		h := &segs[i]
		if h.ns != 0 {
			nsOther++
		}
		old := &t.segs[r.seg]
		if r.from == 0 && old.parent != 0 {
			p := old.parent - 1
			h.parent = newRef[base[segOf(p)]+offOf(p)]
		}
		c := uint32(segCaps[h.class])
		for off := r.from; off < r.to; off++ {
			oref := refOf(r.seg, off)
			no := off - r.from
			ar[h.at+no] = t.ar[old.at+off]
			m := t.meta(oref)
			ar[h.at+c+no/8] |= uint64(m) << (8 * (no % 8))
			if m == metaWide {
				wide[refOf(uint32(i), no)] = t.ext.wide[oref]
			}
			if t.seqs(oref) > 0 {
				held++
			} else {
				unheld++
				if no == 0 {
					loose++
				}
			}
		}
	}
	remap(func(old uint32) uint32 { return newRef[base[segOf(old)]+offOf(old)] - 1 })
	var ext *keyExt
	if wide != nil {
		ext = &keyExt{wide: wide}
	}
	*t = keyTable{segs: segs, ar: ar, ext: ext, nsegs: int32(len(segs)), blocks: held + unheld,
		held: held, loose: loose, chunks: int32(words), nsOther: nsOther, kept: unheld, full: t.full}
	t.resizeIdx(seed, table.ForEntries(t.indexed()))
}

// namespacesInUse adds the namespaces of t's segments to used.
func (t *keyTable) namespacesInUse(used map[uint32]bool) {
	if t.nsOther == 0 {
		return
	}
	for i := range t.segs {
		if t.segs[i].n > 0 {
			used[t.segs[i].ns] = true
		}
	}
}

// probes returns the number of key-index slots a lookup of k reads.
func (t *keyTable) probes(seed *table.Seed, k key) int {
	if len(t.idx) == 0 {
		return 1
	}
	fp := fpOf(seed, k)
	_, d, _, _ := t.probe(k, fp, keyTag(fp))
	return int(d) + 1
}

// heldRun returns how many of the positions x0, x0+1, ... the table holds along the
// chain whose prefixes are pre (pre[i] at position x0+i) in namespace ns: the count of
// leading ones it holds a block of. x0 must start a stride (every block there is the
// first of its segment, so the key index has it). Along the chain the block after a
// held block b is the next block of b's segment when its prefix matches, else the
// first block of another segment (a branch child, or the next stride's), which the key
// index has; a block's key names its parent's, so no other block can hold it. Inside a
// segment a position costs one compare and one meta byte, both in its chunk. closed
// says that the table's held keys are prefix-closed (no holes): a held block's parent
// is held, so inside a segment the blocks that match and are held come first, and a
// binary search finds where they end (log2 of the segment's length, not its length:
// what a query pays per candidate when many share a deep prefix).
func (t *keyTable) heldRun(seed *table.Seed, ns uint32, x0 uint32, pre []uint64, closed bool) int {
	n := 0
	for n < len(pre) {
		ref, ok := t.find(seed, key{prefix: pre[n], pos: x0 + uint32(n), ns: ns})
		if !ok || t.seqs(ref) == 0 {
			return n
		}
		n++
		h := &t.segs[segOf(ref)]
		ar := t.ar[h.at : h.at+chunkWords(segCaps[h.class])]
		metas := ar[segCaps[h.class]:] // (read here, not through the header per block)
		held := func(off uint32) bool {
			return t.seqsOf(ref&^offMask|off, uint8(metas[off/8]>>(8*(off%8)))) > 0
		}
		lo := offOf(ref) + 1
		hi := min(uint32(h.n), lo+uint32(len(pre)-n))
		if closed {
			l, r := lo, hi
			for l < r {
				if m := l + (r-l)/2; ar[m] == pre[n+int(m-lo)] && held(m) {
					l = m + 1
				} else {
					r = m
				}
			}
			n += int(l - lo)
			continue
		}
		for off := lo; off < hi && ar[off] == pre[n] && held(off); off++ {
			n++
		}
	}
	return n
}
