package worker

import (
	"fmt"

	"github.com/kvindex/kvindex/internal/table"
)

// MustCheck panics with what broke if w's bookkeeping does not check (Check). The
// engine calls it after every event in an invariants build. Holder of w's mutex.
func (w *Worker) MustCheck(env *Env, published bool) {
	w.owner.Check("worker event")
	if err := w.Check(env, published); err != nil {
		panic("engine: invariant broken: " + err.Error())
	}
}

// The structural checks of a worker's bookkeeping. They recount what the tables keep
// incrementally and compare; they run after every event in a -tags invariants build
// (see package internal/invariants) and in tests. Each is O(the worker's records): far
// too slow for production, cheap enough for every mutation of a test's small histories.

// Check verifies primary w and its tier components and groups. published says that w
// has just published (Publish), so that its published sizes and gap flags must be
// current. Holder of w's mutex.
func (w *Worker) Check(env *Env, published bool) error {
	seed := &env.Seed
	if err := w.checkTier(seed, published); err != nil {
		return fmt.Errorf("worker %q, device tier: %w", w.name, err)
	}
	if w.hyb != nil {
		if err := w.hyb.checkDigest(); err != nil {
			return fmt.Errorf("worker %q: %w", w.name, err)
		}
	}
	var err error
	w.Components(func(t Tier, c *Worker) {
		if err == nil {
			if cerr := c.checkTier(seed, published); cerr != nil {
				err = fmt.Errorf("worker %q, %s tier: %w", w.name, t, cerr)
			}
		}
	})
	return err
}

// checkTier verifies one tier's tables, its hole count against a recount and, when
// published, its published size and gap flag.
func (w *Worker) checkTier(seed *table.Seed, published bool) error {
	if err := w.seqs.check(seed, &w.keys); err != nil {
		return fmt.Errorf("seq table: %w", err)
	}
	if err := w.keys.check(seed); err != nil {
		return fmt.Errorf("key table: %w", err)
	}
	if w.tl.Load() != nil && !w.keys.full {
		return fmt.Errorf("a worker with tier components has a partially indexed table")
	}
	holes := int32(0)
	w.keys.each(func(ref uint32) {
		if p := w.keys.parentOf(ref); w.keys.seqs(ref) > 0 && p != 0 && w.keys.seqs(p-1) == 0 {
			holes++
		}
	})
	if err := w.checkDigest(seed); err != nil {
		return err
	}
	switch {
	case holes != w.holes:
		return fmt.Errorf("%d holes counted, %d recorded", holes, w.holes)
	case !published:
	case w.gappy.Load() != (holes > 0):
		return fmt.Errorf("gap flag %v with %d holes", w.gappy.Load(), holes)
	case w.size.Load() != int64(w.seqs.n):
		return fmt.Errorf("published size %d, %d seqs held", w.size.Load(), w.seqs.n)
	}
	return nil
}

// check verifies the seq table (checkSlots) and that every slot names a live held block
// of keys, each block named by as many slots as its seq count.
func (t *seqTable) check(seed *table.Seed, keys *keyTable) error {
	if err := t.checkSlots(); err != nil {
		return err
	}
	per := make(map[uint32]uint32)
	for i := range t.slots {
		s := &t.slots[i]
		if s.ref == 0 {
			continue
		}
		ref := s.ref - 1
		if !keys.live(ref) {
			return fmt.Errorf("seq %d names block %#x, which is not live", s.seq(seed), ref)
		}
		per[ref]++
	}
	var err error
	keys.each(func(ref uint32) {
		if err == nil && keys.seqs(ref) != per[ref] {
			err = fmt.Errorf("block %#x counts %d seqs, %d slots name it", ref, keys.seqs(ref), per[ref])
		}
	})
	return err
}

// checkSlots verifies the seq table on its own: each control byte against its slot, the
// counts, and that a lookup of every seq finds its slot.
func (t *seqTable) checkSlots() error {
	if len(t.slots) != 8*len(t.ctrl) && (len(t.ctrl) != 1 || len(t.slots) >= 8) {
		return fmt.Errorf("seq table: %d slots for %d groups", len(t.slots), len(t.ctrl))
	}
	for i := len(t.slots); i < 8*len(t.ctrl); i++ {
		if b := uint8(t.ctrl[0] >> (8 * i)); b != ctrlNone {
			return fmt.Errorf("seq table: byte %d past the %d slots reads %#x", i, len(t.slots), b)
		}
	}
	nlive, ndead := 0, 0
	for i := range t.slots {
		s := &t.slots[i]
		b := uint8(t.ctrl[i/8] >> (8 * (i % 8)))
		switch {
		case b&0xc0 == 0xc0:
			nlive++
			if s.ref == 0 || uint64(b) != tagOf(s.mixed()) {
				return fmt.Errorf("seq table: slot %d reads %#x, holds ref %d, tag %#x", i, b, s.ref, tagOf(s.mixed()))
			}
			if j, ok := t.find(s.mixed()); !ok || j != uint64(i) {
				return fmt.Errorf("seq table: a lookup of slot %d's seq finds slot %d (%v)", i, j, ok)
			}
		case b == ctrlDead || b == ctrlEmpty:
			if *s != (seqSlot{}) {
				return fmt.Errorf("seq table: slot %d reads %#x and holds ref %d", i, b, s.ref)
			}
			if b == ctrlDead {
				ndead++
			}
		default:
			return fmt.Errorf("seq table: slot %d's control byte reads %#x", i, b)
		}
	}
	if nlive != int(t.n) || ndead != int(t.dead) {
		return fmt.Errorf("seq table: %d live and %d dead slots, counts say %d and %d", nlive, ndead, t.n, t.dead)
	}
	if len(t.slots) >= 8 && (nlive+ndead)*8 > len(t.slots)*7 {
		return fmt.Errorf("seq table: %d live and %d dead slots in %d, past 7/8", nlive, ndead, len(t.slots))
	}
	return nil
}

// live reports whether ref names a block of a live segment.
func (t *keyTable) live(ref uint32) bool {
	seg := segOf(ref)
	return int(seg) < len(t.segs) && offOf(ref) < uint32(t.segs[seg].n)
}

// each calls f with every block of every live segment, in header order.
func (t *keyTable) each(f func(ref uint32)) {
	for seg := range t.segs {
		for off := uint32(0); off < uint32(t.segs[seg].n); off++ {
			f(refOf(uint32(seg), off))
		}
	}
}

// check verifies the key table: segments inside one stride and their chunks, each
// segment ending in a block that is held or has a held branch child, first blocks
// linked to a parent one position up in their namespace exactly while they are held
// past position 0, the branch counts, the counters (segments, blocks, held, loose,
// arena words), the free lists, and the key index holding exactly the blocks inIdx
// names, in Robin Hood order with their tags and its count.
func (t *keyTable) check(seed *table.Seed) error {
	if t.shrinkSeg != 0 {
		return fmt.Errorf("segment %d's shrink was put off and never settled", t.shrinkSeg-1)
	}
	var nsegs, blocks, held, loose, chunks, nsOther int32
	kids := make(map[uint32]uint32)
	freeSegs := 0
	for seg := range t.segs {
		h := &t.segs[seg]
		if h.n == 0 {
			freeSegs++
			continue
		}
		nsegs++
		blocks += int32(h.n)
		if h.ns != 0 {
			nsOther++
		}
		if int(h.class) >= numClasses || h.n > segCaps[h.class] {
			return fmt.Errorf("segment %d: %d blocks in class %d", seg, h.n, h.class)
		}
		chunks += int32(chunkWords(segCaps[h.class]))
		if int(h.at)+int(chunkWords(segCaps[h.class])) > len(t.ar) {
			return fmt.Errorf("segment %d: chunk past the arena", seg)
		}
		if int(h.pos0%segMax)+int(h.n) > segMax {
			return fmt.Errorf("segment %d: positions %d..%d cross a stride", seg, h.pos0, h.pos0+uint32(h.n)-1)
		}
		if last := refOf(uint32(seg), uint32(h.n)-1); t.seqs(last) == 0 && t.kids(last) == 0 {
			return fmt.Errorf("segment %d ends in a block neither held nor a branch parent", seg)
		}
		for off := uint32(h.n); off < uint32(segCaps[h.class]); off++ {
			// keyTable.extend sets a new last block's byte by or-ing it in.
			if t.meta(refOf(uint32(seg), off)) != 0 {
				return fmt.Errorf("segment %d: meta byte past its end at offset %d", seg, off)
			}
		}
		first := refOf(uint32(seg), 0)
		if t.seqs(first) == 0 {
			loose++
		}
		switch {
		case t.seqs(first) == 0 || h.pos0 == 0:
			if h.parent != 0 {
				return fmt.Errorf("segment %d links a parent with its first block unheld or a root", seg)
			}
		case h.parent == 0:
			return fmt.Errorf("segment %d: held first block at position %d without a parent", seg, h.pos0)
		case !t.live(h.parent - 1):
			return fmt.Errorf("segment %d: parent %#x not live", seg, h.parent-1)
		default:
			if pk := t.key(h.parent - 1); pk.pos != h.pos0-1 || pk.ns != h.ns {
				return fmt.Errorf("segment %d at %d/%d names parent %v", seg, h.pos0, h.ns, pk)
			}
			kids[h.parent-1]++
		}
		for off := uint32(0); off < uint32(h.n); off++ {
			ref := refOf(uint32(seg), off)
			if t.seqs(ref) > 0 {
				held++
			}
			if t.meta(ref) == metaWide {
				if w := t.ext.wide[ref]; w.seqs <= metaSeqMax && w.kids <= metaKidMax {
					return fmt.Errorf("block %#x: wide counts %+v that fit", ref, w)
				}
			}
			k := t.key(ref)
			got, ok := t.find(seed, k)
			if in := ok && got == ref; in != t.inIdx(ref) {
				return fmt.Errorf("block %#x (%v) in the index: %v, belongs there: %v", ref, k, in, t.inIdx(ref))
			}
		}
	}
	var err error
	t.each(func(ref uint32) {
		if err == nil && t.kids(ref) != kids[ref] {
			err = fmt.Errorf("block %#x counts %d branch children, %d name it", ref, t.kids(ref), kids[ref])
		}
	})
	if err != nil {
		return err
	}
	switch {
	case nsegs != t.nsegs || blocks != t.blocks || held != t.held || loose != t.loose || chunks != t.chunks || nsOther != t.nsOther:
		return fmt.Errorf("counted %d segments, %d blocks, %d held, %d loose, %d chunk words, %d outside namespace 0; recorded %d, %d, %d, %d, %d, %d",
			nsegs, blocks, held, loose, chunks, nsOther, t.nsegs, t.blocks, t.held, t.loose, t.chunks, t.nsOther)
	}
	for f, n := t.freeSeg, 0; f != 0; f, n = t.segs[f-1].parent, n+1 {
		if n > freeSegs || int(f-1) >= len(t.segs) || t.segs[f-1].n != 0 {
			return fmt.Errorf("broken free list of headers")
		}
	}
	free := 0
	for c := range t.freeChunk {
		for f, n := t.freeChunk[c], 0; f != 0; f, n = uint32(t.ar[f-1]), n+1 {
			if n > len(t.ar) || int(f-1) >= len(t.ar) {
				return fmt.Errorf("broken free list of class %d", c)
			}
			free += int(chunkWords(segCaps[c]))
		}
	}
	if int(chunks)+free > len(t.ar) {
		return fmt.Errorf("%d chunk words and %d free in an arena of %d", chunks, free, len(t.ar))
	}
	n := len(t.idx)
	for i := range t.idx {
		s := t.idx[i]
		if s.ref() == 0 {
			continue
		}
		ref := s.ref() - 1
		if !t.live(ref) || !t.inIdx(ref) {
			return fmt.Errorf("index slot %d names block %#x, which is not live or not indexed", i, ref)
		}
		fp := fpOf(seed, t.key(ref))
		if d := table.Dist(table.Home(fp, n), uint64(i), n); d != s.dist() || s.tag() != keyTag(fp) {
			return fmt.Errorf("index slot %d: dist %d tag %#x, want %d %#x", i, s.dist(), s.tag(), d, keyTag(fp))
		}
	}
	if int(t.nidx) != t.indexed() {
		return fmt.Errorf("%d blocks indexed, %d belong there", t.nidx, t.indexed())
	}
	if err := table.CheckRobinHood(n, int(t.nidx), func(j uint64) (uint64, bool) {
		return t.idx[j].dist(), t.idx[j].ref() != 0
	}); err != nil {
		return fmt.Errorf("key index: %w", err)
	}
	return nil
}
