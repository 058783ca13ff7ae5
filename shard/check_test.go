package shard

import (
	"strings"
	"testing"

	"github.com/kvindex/kvindex/internal/invariants"
	"github.com/kvindex/kvindex/internal/table"
)

// checkIndex is an index of 600 keys over three positions, a third of them with
// overflow sets, that checkInvariants accepts.
func checkIndex(t *testing.T) (*Index, []uint64) {
	t.Helper()
	x := New(0)
	seed := table.SeedFrom(5)
	fps := make([]uint64, 600)
	for i := range fps {
		fps[i] = Hash(seed, Key{Prefix: uint64(i / 3), Pos: uint32(i % 3)})
		x.Add(fps[i], uint32(i%7))
		if i%3 == 0 {
			x.Add(fps[i], 100+uint32(i%5))
		}
	}
	for i := 0; i < len(fps); i += 9 {
		x.Remove(fps[i], 100+uint32(i%5)) // back inline: its set on the free list
	}
	if err := x.checkInvariants(); err != nil {
		t.Fatal(err)
	}
	return x, fps
}

// TestCheckInvariantsCatchesCorruption breaks a checked index in each way its check
// names (Robin Hood order, the key and membership counts, a member twice in a set, a
// freed set still named, the overflow capacity) and requires checkInvariants to say so.
func TestCheckInvariantsCatchesCorruption(t *testing.T) {
	for name, corrupt := range map[string]func(x *Index){
		"order":   func(x *Index) { swapInRun(t, x) },
		"used":    func(x *Index) { x.used++ },
		"members": func(x *Index) { x.members-- },
		"ovfCap":  func(x *Index) { x.ovfCap += 4 },
		"twice": func(x *Index) {
			for i := range x.slots {
				if m := x.slots[i].m; m >= ovfBit {
					set := x.ovf[m-ovfBit]
					set[1] = set[0]
					return
				}
			}
			t.Fatal("no overflow set")
		},
		"freed-named": func(x *Index) {
			for i := range x.slots {
				if m := x.slots[i].m; m >= ovfBit {
					x.ovfFree = append(x.ovfFree, m-ovfBit)
					return
				}
			}
			t.Fatal("no overflow set")
		},
	} {
		x, _ := checkIndex(t)
		corrupt(x)
		if err := x.checkInvariants(); err == nil || !strings.HasPrefix(err.Error(), "shard: ") {
			t.Errorf("%s corrupted: checkInvariants says %v", name, err)
		}
	}
}

// TestInvariantsBuildCatchesCorruption: in a -tags invariants build, the first change
// after a corruption panics (a miscounted table at its next full check, a swapped run
// at the change that touches it); skipped without the tag, where the checks compile
// away.
func TestInvariantsBuildCatchesCorruption(t *testing.T) {
	if !invariants.Enabled {
		t.Skip("needs -tags invariants")
	}
	catch := func(f func()) (msg string) {
		defer func() { msg, _ = recover().(string) }()
		f()
		return ""
	}
	x, fps := checkIndex(t)
	x.members += 3
	x.changes = len(x.slots) // the next change checks the whole table
	if msg := catch(func() { x.Add(fps[1], 50) }); !strings.HasPrefix(msg, "shard: invariant broken") {
		t.Fatalf("Add on a miscounted table: panic %q", msg)
	}
	x, _ = checkIndex(t)
	fp := swapInRun(t, x)
	if msg := catch(func() { x.Add(fp, 60) }); !strings.HasPrefix(msg, "shard: invariant broken") {
		t.Fatalf("Add into a run out of order: panic %q", msg)
	}
}

// swapInRun swaps two neighbouring slots of different homes, the second past its home,
// so that the run is out of Robin Hood order, and returns the first one's fingerprint.
func swapInRun(t *testing.T, x *Index) uint64 {
	for i := 0; i+1 < len(x.slots); i++ {
		a, b := &x.slots[i], &x.slots[i+1]
		if a.m != 0 && b.m != 0 && x.home(a.fp()) != x.home(b.fp()) && x.home(b.fp()) != uint64(i+1) {
			fp := a.fp()
			*a, *b = *b, *a
			return fp
		}
	}
	t.Fatal("no run to corrupt")
	return 0
}
