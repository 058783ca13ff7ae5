package shard

import (
	"fmt"

	"github.com/kvindex/kvindex/internal/invariants"
	"github.com/kvindex/kvindex/internal/table"
)

// checkInvariants verifies the table's structure against a recount (Go's
// internal/runtime/maps table_debug.go is the model): Robin Hood order and the key
// count (table.CheckRobinHood), every fingerprint found where it sits (so no key is
// twice in the table), every overflow set named by exactly one slot, with at least two
// members and none twice, the free sets empty and named by no slot, the membership count
// and the overflow capacity as the sets add up. O(slots + members): tests, and every
// mutation in a -tags invariants build (mustCheck).
func (x *Index) checkInvariants() error {
	n := len(x.slots)
	if err := table.CheckRobinHood(n, x.used, func(i uint64) (uint64, bool) {
		s := &x.slots[i]
		return table.Dist(x.home(s.fp()), i, n), s.m != 0
	}); err != nil {
		return fmt.Errorf("shard: %w", err)
	}
	free := make(map[uint32]bool, len(x.ovfFree))
	for _, o := range x.ovfFree {
		switch {
		case int(o) >= len(x.ovf):
			return fmt.Errorf("shard: free overflow set %d of %d", o, len(x.ovf))
		case free[o]:
			return fmt.Errorf("shard: overflow set %d freed twice", o)
		case len(x.ovf[o]) != 0:
			return fmt.Errorf("shard: free overflow set %d holds %d members", o, len(x.ovf[o]))
		}
		free[o] = true
	}
	named := make(map[uint32]bool)
	members := 0
	for i := range x.slots {
		s := &x.slots[i]
		if s.m == 0 {
			continue
		}
		if got := x.find(s.fp()); got != i {
			return fmt.Errorf("shard: slot %d's fingerprint %#x is found at %d", i, s.fp(), got)
		}
		if s.m < ovfBit {
			members++
			continue
		}
		o := s.m - ovfBit
		switch {
		case int(o) >= len(x.ovf):
			return fmt.Errorf("shard: slot %d names overflow set %d of %d", i, o, len(x.ovf))
		case free[o] || named[o]:
			return fmt.Errorf("shard: slot %d names overflow set %d, free %v or named twice", i, o, free[o])
		case len(x.ovf[o]) < 2:
			return fmt.Errorf("shard: slot %d's overflow set %d has %d members", i, o, len(x.ovf[o]))
		}
		named[o] = true
		seen := make(map[uint32]bool, len(x.ovf[o]))
		for _, m := range x.ovf[o] {
			if seen[m] || m > MaxMember {
				return fmt.Errorf("shard: slot %d lists member %d twice or past MaxMember", i, m)
			}
			seen[m] = true
		}
		members += len(x.ovf[o])
	}
	if len(named)+len(free) != len(x.ovf) {
		return fmt.Errorf("shard: %d overflow sets, %d named and %d free", len(x.ovf), len(named), len(free))
	}
	c := 0
	for _, set := range x.ovf {
		c += cap(set)
	}
	switch {
	case members != x.members:
		return fmt.Errorf("shard: %d memberships counted, count says %d", members, x.members)
	case c != x.ovfCap:
		return fmt.Errorf("shard: overflow capacity %d, count says %d", c, x.ovfCap)
	}
	return nil
}

// checkRun verifies the run of used slots around fp's home slot, where a change of
// fp's key moved slots (an insertion shifts the run on, a deletion shifts it back, both
// stopping at its end): Robin Hood order, each fingerprint found where it sits, each
// overflow set of at least two distinct members. O(the run).
func (x *Index) checkRun(fp uint64) error {
	n := len(x.slots)
	start := x.home(fp)
	for k := 0; k < n && x.slots[start].m != 0; k++ {
		start = (start + uint64(n) - 1) % uint64(n)
	}
	for i, k := table.Next(start, n), 0; k < n && x.slots[i].m != 0; i, k = table.Next(i, n), k+1 {
		s := &x.slots[i]
		d := table.Dist(x.home(s.fp()), i, n)
		if d > 0 {
			p := &x.slots[(i+uint64(n)-1)%uint64(n)]
			if pd := table.Dist(x.home(p.fp()), (i+uint64(n)-1)%uint64(n), n); p.m == 0 || pd+1 < d {
				return fmt.Errorf("shard: slot %d lies %d past its home after a slot %d past its own (used %v)", i, d, pd, p.m != 0)
			}
		}
		if got := x.find(s.fp()); got != int(i) {
			return fmt.Errorf("shard: slot %d's fingerprint %#x is found at %d", i, s.fp(), got)
		}
		if s.m >= ovfBit {
			o := s.m - ovfBit
			if int(o) >= len(x.ovf) || len(x.ovf[o]) < 2 {
				return fmt.Errorf("shard: slot %d names overflow set %d, not a set of two or more", i, o)
			}
			set := x.ovf[o]
			for a := range set {
				for b := a + 1; b < len(set); b++ {
					if set[a] == set[b] {
						return fmt.Errorf("shard: slot %d lists member %d twice", i, set[a])
					}
				}
			}
		}
	}
	return nil
}

// fullEvery is how many slots' worth of changes pass between two full checks of a
// table in an invariants build: each change checks its own run (checkRun) and every
// len(slots)/fullEvery changes the whole table is recounted (checkInvariants), so
// that the check costs O(fullEvery) per change amortised and the race tests can afford
// it with the tag.
const fullEvery = 64

// mustCheck panics with what broke unless fp's run checks, and, every
// len(slots)/fullEvery changes, the whole table; Add and Remove call it after every
// change in a -tags invariants build.
func (x *Index) mustCheck(fp uint64) {
	if !invariants.Enabled {
		return
	}
	err := x.checkRun(fp)
	if x.changes++; err == nil && x.changes >= len(x.slots)/fullEvery {
		x.changes = 0
		err = x.checkInvariants()
	}
	if err != nil {
		panic("shard: invariant broken: " + err.Error())
	}
}
