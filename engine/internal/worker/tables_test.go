package worker

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
	o := &Outbox{}
	env := &Env{Seed: table.SeedFrom(1)}
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
		if got := o.ValidStore(env, parent, hasParent, blocks); got != want {
			t.Fatalf("ValidStore(%d blocks, parent %d/%v) = %v, want %v", len(blocks), parent, hasParent, got, want)
		}
	}
	for round := 0; round < 2000; round++ {
		if round == 1000 {
			o.seen.gen = math.MaxUint32 - 1 // the next resets wrap the stamps
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
		if len(o.seen.slots) > seqSetKeep {
			t.Fatalf("scratch set of %d slots kept after an event of %d blocks", len(o.seen.slots), n)
		}
	}
}

// TestKeyRecordCounts drives a record's counts past what its count word holds inline
// (to the side table and back) and checks each step against plain integers.
func TestKeyRecordCounts(t *testing.T) {
	// A key whose location packs, and one whose position does not (its side-table entry
	// then holds the counts beside its position).
	for _, k := range []key{{prefix: 1, pos: 3}, {prefix: 2, pos: locPosMask + 1, ns: 7}} {
		testKeyRecordCounts(t, k)
	}
}

func testKeyRecordCounts(t *testing.T, k key) {
	kt := keyTable{full: true}
	seed := table.SeedFrom(2)
	rid := kt.findOrAdd(&seed, k)
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
		if wide := seqs > cntSeqMax || kids > cntKidMax || k.pos > locPosMask; wide != (kt.ext != nil && len(kt.ext.wide) == 1) {
			t.Fatalf("counts %d/%d: wide %v, side table %v", seqs, kids, wide, kt.ext)
		}
		if kt.key(rid) != k {
			t.Fatalf("record is %v, want %v", kt.key(rid), k)
		}
	}
	for range cntSeqMax + 3 {
		step(1, 0)
	}
	for range cntSeqMax + 3 {
		step(-1, 1)
	}
	for kids < cntKidMax-3 { // to near the field's end without the checks
		kt.addKids(rid, 1)
		kids++
	}
	for kids < cntKidMax+3 {
		step(0, 1)
	}
	step(1, 0)
	for kids > cntKidMax-3 {
		step(0, -1)
	}
	for kids > 3 {
		kt.addKids(rid, -1)
		kids--
	}
	for kids > 0 {
		step(0, -1)
	}
	step(-1, 0)
}

// TestKeyTableAgainstMap drives a worker's key table with keys whose positions and
// namespaces do not all pack (positions past 2^stPosBits, more namespaces than local ids) and
// counts that do not all fit inline, and compares lookups, keys and counts with a map.
func TestKeyTableAgainstMap(t *testing.T) {
	r := rand.New(rand.NewPCG(8, 9))
	seed := table.SeedFrom(3)
	kt := keyTable{full: true}
	type counts struct{ seqs, kids uint32 }
	model := map[key]uint32{}
	cnt := map[uint32]counts{}
	positions := []uint32{0, 1, 2, locPosMask - 1, locPosMask, locPosMask + 1, 1<<30 - 1} // the last, the engine's MaxDepth - 1
	randKey := func() key {
		return key{prefix: uint64(r.IntN(40)), pos: positions[r.IntN(len(positions))], ns: uint32(r.IntN(300))}
	}
	for step := range 40_000 {
		k := randKey()
		rid, had := model[k]
		switch op := r.IntN(10); {
		case op < 5: // add one seq
			got := kt.findOrAdd(&seed, k)
			if had && got != rid {
				t.Fatalf("step %d: %v found as %d, want %d", step, k, got, rid)
			}
			rid = got
			model[k] = rid
			c := cnt[rid]
			c.seqs++
			cnt[rid] = c
			if kt.addSeqs(rid, 1) != c.seqs {
				t.Fatalf("step %d: seqs of %v", step, k)
			}
		case had: // drop one seq, and the record once it is empty
			c := cnt[rid]
			c.seqs--
			cnt[rid] = c
			if kt.addSeqs(rid, -1) != c.seqs {
				t.Fatalf("step %d: seqs of %v", step, k)
			}
			if c.seqs == 0 && c.kids == 0 {
				kt.del(&seed, rid)
				delete(model, k)
				delete(cnt, rid)
			}
		}
		if step%1000 == 0 {
			n := kt.n
			for k, rid := range model {
				if kt.key(rid) != k || kt.findOrAdd(&seed, k) != rid {
					t.Fatalf("step %d: record %d is %v, want %v", step, rid, kt.key(rid), k)
				}
				if c := cnt[rid]; kt.seqs(rid) != c.seqs || kt.kids(rid) != c.kids {
					t.Fatalf("step %d: counts of %v", step, k)
				}
			}
			if kt.n != n || int(n) != len(model) {
				t.Fatalf("step %d: %d records, model has %d", step, kt.n, len(model))
			}
		}
	}
	wide := 0
	for rid := range cnt {
		if kt.recs[rid].loc() == locWide || kt.recs[rid].wideCounts() {
			wide++
		}
	}
	if wide != len(kt.ext.wide) || wide == 0 || len(kt.ext.nss) != locNSMax {
		t.Fatalf("%d wide records, side table %d, %d local namespaces", wide, len(kt.ext.wide), len(kt.ext.nss))
	}
}

// TestKeyIndexLongRun stores keys that share a home slot under a known seed, more of
// them than a slot's dist can count, so that the key index must grow past its load
// limit to place them; every key stays findable and deletable.
func TestKeyIndexLongRun(t *testing.T) {
	seed := table.SeedFrom(4)
	var keys []key
	for p := uint64(0); len(keys) < maxKeyDist+60; p++ {
		k := key{prefix: p, pos: 1}
		if seed.Hash128(k.prefix, k.loc())>>52 == 0 { // the same top 12 bits
			keys = append(keys, k)
		}
	}
	kt := keyTable{full: true}
	rids := map[key]uint32{}
	for _, k := range keys {
		rid := kt.findOrAdd(&seed, k)
		kt.addSeqs(rid, 1)
		rids[k] = rid
	}
	if len(kt.idx) < 1<<12 {
		t.Fatalf("%d keys of one home in %d slots", len(keys), len(kt.idx))
	}
	for i, k := range keys {
		if got := kt.findOrAdd(&seed, k); got != rids[k] || kt.key(got) != k {
			t.Fatalf("key %d found as %d, want %d", i, got, rids[k])
		}
		if i%2 == 0 {
			kt.addSeqs(rids[k], -1)
			kt.del(&seed, rids[k])
		}
	}
	for i, k := range keys {
		if i%2 == 1 && kt.findOrAdd(&seed, k) != rids[k] {
			t.Fatalf("key %d lost", i)
		}
	}
	if int(kt.n) != len(keys)/2 {
		t.Fatalf("%d records, want %d", kt.n, len(keys)/2)
	}
}
