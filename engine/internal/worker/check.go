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
	for i := range w.keys.recs {
		r := &w.keys.recs[i]
		if !r.free() && w.keys.seqs(uint32(i)) > 0 && r.parent != 0 && w.keys.seqs(r.parent-1) == 0 {
			holes++
		}
	}
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

// check verifies the seq table: Robin Hood order, its count, and that every slot names
// a live held record of keys, each record named by as many slots as its seq count.
func (t *seqTable) check(seed *table.Seed, keys *keyTable) error {
	n := len(t.slots)
	if err := table.CheckRobinHood(n, t.n, func(j uint64) (uint64, bool) {
		p := &t.slots[j]
		return table.Dist(t.homeOf(p.mixed()), j, n), p.ref != 0
	}); err != nil {
		return fmt.Errorf("seq table: %w", err)
	}
	per := make(map[uint32]uint32)
	for i := range t.slots {
		s := &t.slots[i]
		if s.ref == 0 {
			continue
		}
		rid := s.ref - 1
		if int(rid) >= len(keys.recs) || keys.recs[rid].free() {
			return fmt.Errorf("seq %d names record %d, which is not live", s.seq(seed), rid)
		}
		per[rid]++
	}
	for i := range keys.recs {
		if rid := uint32(i); !keys.recs[i].free() && keys.seqs(rid) != per[rid] {
			return fmt.Errorf("record %d counts %d seqs, %d slots name it", rid, keys.seqs(rid), per[rid])
		}
	}
	return nil
}

// check verifies the key table: every live record non-empty, each held key's parent
// present one position up in its namespace, its children counted and linked or indexed
// as its child word says, the ghosts counted, and the key index holding exactly the
// records inIdx names, in Robin Hood order with their tags and its count.
func (t *keyTable) check(seed *table.Seed) error {
	live, ghosts := int32(0), int32(0)
	kids := make(map[uint32]uint32)
	for i := range t.recs {
		rid := uint32(i)
		r := &t.recs[i]
		if r.free() {
			continue
		}
		live++
		seqs, nk := t.seqs(rid), t.kids(rid)
		k := t.key(rid)
		switch {
		case seqs == 0 && nk == 0:
			return fmt.Errorf("record %d (%v) is empty but live", rid, k)
		case seqs == 0 && r.parent != 0:
			return fmt.Errorf("ghost %d keeps a parent link", rid)
		case seqs > 0 && k.pos == 0 && r.parent != 0:
			return fmt.Errorf("root %d has a parent link", rid)
		case (r.child != 0) != (nk > 0):
			return fmt.Errorf("record %d has %d held children and child word %#x", rid, nk, r.child)
		case r.child != 0 && r.child != childIndexed && (t.full || nk != 1):
			return fmt.Errorf("record %d links one child, with %d held children, full %v", rid, nk, t.full)
		}
		if seqs == 0 {
			ghosts++
		}
		if seqs > 0 && k.pos > 0 {
			p := r.parent
			if p == 0 || int(p-1) >= len(t.recs) || t.recs[p-1].free() {
				return fmt.Errorf("held key %d (%v) has no parent record", rid, k)
			}
			if pk := t.key(p - 1); pk.pos != k.pos-1 || pk.ns != k.ns {
				return fmt.Errorf("held key %d (%v) names parent %v", rid, k, pk)
			}
			kids[p-1]++
			if c := t.recs[p-1].child; c != childIndexed && c != rid+1 {
				return fmt.Errorf("held key %d is neither its parent's linked child nor indexed (child word %#x)", rid, c)
			}
		}
		got, ok := t.findFP(k, fpOf(seed, k))
		if in := ok && got == rid; in != t.inIdx(rid) {
			return fmt.Errorf("record %d (%v) in the index: %v, belongs there: %v", rid, k, in, t.inIdx(rid))
		}
	}
	for i := range t.recs {
		if rid := uint32(i); !t.recs[i].free() && t.kids(rid) != kids[rid] {
			return fmt.Errorf("record %d counts %d held children, %d name it", rid, t.kids(rid), kids[rid])
		}
	}
	switch {
	case live != t.n:
		return fmt.Errorf("%d live records, count says %d", live, t.n)
	case ghosts != t.ghosts:
		return fmt.Errorf("%d ghosts, count says %d", ghosts, t.ghosts)
	}
	n := len(t.idx)
	for i := range t.idx {
		s := t.idx[i]
		if s.ref() == 0 {
			continue
		}
		rid := s.ref() - 1
		if int(rid) >= len(t.recs) || t.recs[rid].free() {
			return fmt.Errorf("index slot %d names record %d, which is not live", i, rid)
		}
		fp := fpOf(seed, t.key(rid))
		if d := table.Dist(table.Home(fp, n), uint64(i), n); d != s.dist() || s.tag() != keyTag(fp) {
			return fmt.Errorf("index slot %d: dist %d tag %#x, want %d %#x", i, s.dist(), s.tag(), d, keyTag(fp))
		}
	}
	if err := table.CheckRobinHood(n, int(t.nidx), func(j uint64) (uint64, bool) {
		return t.idx[j].dist(), t.idx[j].ref() != 0
	}); err != nil {
		return fmt.Errorf("key index: %w", err)
	}
	return nil
}
