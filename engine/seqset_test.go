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

// TestKeyRecordCounts drives a record's counts past what its count word holds inline
// (to the side table and back) and checks each step against plain integers.
func TestKeyRecordCounts(t *testing.T) {
	var kt keyTable
	seed := table.SeedFrom(2)
	rid := kt.findOrAdd(&seed, key{prefix: 1, pos: 3})
	var seqs, kids uint32
	step := func(ds, dk int32) {
		t.Helper()
		if ds != 0 {
			seqs = uint32(int32(seqs) + ds)
			if got := kt.addSeqs(rid, ds); got != seqs {
				t.Fatalf("addSeqs = %d, want %d", got, seqs)
			}
		}
		if dk != 0 {
			kids = uint32(int32(kids) + dk)
			if got := kt.addKids(rid, dk); got != kids {
				t.Fatalf("addKids = %d, want %d", got, kids)
			}
		}
		if kt.seqs(rid) != seqs || kt.kids(rid) != kids {
			t.Fatalf("counts %d/%d, want %d/%d", kt.seqs(rid), kt.kids(rid), seqs, kids)
		}
		if wide := seqs > cntSeqMax || kids > cntKidMax; wide != (len(kt.wide) == 1) {
			t.Fatalf("counts %d/%d: %d wide records", seqs, kids, len(kt.wide))
		}
	}
	for range cntSeqMax + 3 {
		step(1, 0)
	}
	for range cntSeqMax + 3 {
		step(-1, 1)
	}
	for kids < cntKidMax+3 {
		step(0, 1)
	}
	step(1, 0)
	for kids > 0 {
		step(0, -1)
	}
	step(-1, 0)
}
