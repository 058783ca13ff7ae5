package engine

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/kvindex/kvindex/internal/table"
)

// TestValidateStoreLarge checks the duplicate check of events too long for the pairwise
// loop against a plain map, across many events on one worker (the scratch set is reused
// and emptied by its generation stamp), through a stamp wraparound, and past a huge event
// whose set is dropped afterwards.
func TestValidateStoreLarge(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	w := worker{out: &outbox{}}
	seed := table.SeedFrom(1)
	check := func(parent uint64, hasParent bool, blocks []Block) {
		t.Helper()
		want := true
		seen := map[uint64]bool{}
		for _, b := range blocks {
			if hasParent && b.Seq == parent || seen[b.Seq] {
				want = false
			}
			seen[b.Seq] = true
		}
		if got := w.validateStore(&seed, parent, hasParent, blocks); got != want {
			t.Fatalf("validateStore(%d blocks, parent %d/%v) = %v, want %v", len(blocks), parent, hasParent, got, want)
		}
	}
	for round := 0; round < 2000; round++ {
		if round == 1000 {
			w.out.seen.gen = math.MaxUint32 - 1 // the next resets wrap the stamps
		}
		n := 17 + r.IntN(300)
		if round%500 == 7 {
			n = 3 * seqSetKeep
		}
		blocks := make([]Block, n)
		for i := range blocks {
			blocks[i].Seq = uint64(i) * 0x9e3779b97f4a7c15 // distinct, and the same in every round
		}
		parent, hasParent := r.Uint64(), r.IntN(2) == 0
		switch r.IntN(4) {
		case 0: // a duplicate somewhere
			i, j := r.IntN(n), r.IntN(n)
			blocks[i].Seq = blocks[j].Seq
		case 1: // the parent among the blocks
			hasParent = true
			parent = blocks[r.IntN(n)].Seq
		}
		check(parent, hasParent, blocks)
		if len(w.out.seen.slots) > seqSetKeep {
			t.Fatalf("scratch set of %d slots kept after an event of %d blocks", len(w.out.seen.slots), n)
		}
	}
}
