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

// TestKeyRecordCounts drives a block's counts past what its meta byte holds (to the
// side table and back) and checks each step against plain integers, for a block at the
// start of a segment and one in its middle (whose neighbours' bytes share its word).
func TestKeyRecordCounts(t *testing.T) {
	for _, off := range []int{0, 5} {
		testKeyRecordCounts(t, off)
	}
}

func testKeyRecordCounts(t *testing.T, at int) {
	kt := keyTable{full: true}
	seed := table.SeedFrom(2)
	k0 := key{prefix: 1, pos: 64 * 3, ns: 7}
	ref := kt.newSeg(&seed, k0, fpOf(&seed, k0), 8)
	for i := 1; i <= 7; i++ {
		k := key{prefix: uint64(100 + i), pos: k0.pos + uint32(i), ns: 7}
		kt.appendBlock(&seed, segOf(ref), k, fpOf(&seed, k), 1)
	}
	ref += uint32(at)
	k := kt.key(ref)
	neighbours := func() uint64 { // the other blocks' meta bytes
		w, sh := kt.metaWord(ref)
		return *w &^ (0xff << sh)
	}
	kt.setMeta(ref+1, 0x55)
	before := neighbours()
	var seqs, kids uint32
	step := func(ds, dk int32) {
		t.Helper()
		if ds != 0 {
			seqs = uint32(int32(seqs) + ds)
			if got := kt.addSeqs(ref, ds); got != seqs {
				t.Fatalf("addSeqs = %d, want %d", got, seqs)
			}
		}
		if dk != 0 {
			kids = uint32(int32(kids) + dk)
			if got := kt.addKids(ref, dk); got != kids {
				t.Fatalf("addKids = %d, want %d", got, kids)
			}
		}
		if kt.seqs(ref) != seqs || kt.kids(ref) != kids {
			t.Fatalf("counts %d/%d, want %d/%d", kt.seqs(ref), kt.kids(ref), seqs, kids)
		}
		if wide := seqs > metaSeqMax || kids > metaKidMax; wide != (kt.ext != nil && len(kt.ext.wide) == 1) {
			t.Fatalf("counts %d/%d: wide %v, side table %v", seqs, kids, wide, kt.ext)
		}
		if kt.key(ref) != k || neighbours() != before {
			t.Fatalf("block is %v, want %v; neighbours %#x, want %#x", kt.key(ref), k, neighbours(), before)
		}
	}
	for range metaSeqMax + 3 {
		step(1, 0)
	}
	for range metaSeqMax + 3 {
		step(-1, 1)
	}
	for kids < metaKidMax-3 { // to near the field's end without the checks
		kt.addKids(ref, 1)
		kids++
	}
	for kids < metaKidMax+3 {
		step(0, 1)
	}
	step(1, 0)
	for kids > metaKidMax-3 {
		step(0, -1)
	}
	for kids > 3 {
		kt.addKids(ref, -1)
		kids--
	}
	for kids > 0 {
		step(0, -1)
	}
	step(-1, 0)
}

// TestKeyTableAgainstMap drives a worker's full key table with keys at positions across
// strides and up to the engine's deepest (parents found by key, made as ghosts when
// missing, as a tier's store and Restore do), in hundreds of namespaces, some held under
// more engine hashes than a meta byte counts, and compares each key's count with a map
// and the table with its invariants (keyTable.check) as it goes.
func TestKeyTableAgainstMap(t *testing.T) {
	r := rand.New(rand.NewPCG(8, 9))
	env := &Env{Seed: table.SeedFrom(3), Shards: 1}
	w := New("w", 0)
	w.keys.full = true
	w.SetOutbox(NewOutbox(1))
	model := map[key]uint32{}
	bases := []uint32{0, 1, 62, 63, 64, 65, 127, 1<<30 - 3} // the last, near the engine's MaxDepth
	randKey := func() key {
		pos := bases[r.IntN(len(bases))] + uint32(r.IntN(3))
		return key{prefix: uint64(r.IntN(6)), pos: pos, ns: uint32(r.IntN(300))}
	}
	for step := range 40_000 {
		k := randKey()
		if r.IntN(10) < 5 || model[k] == 0 {
			ref := w.addKey(env, k, uint64(k.pos)*7+1, 0, 1+r.IntN(4)) // a parent prefix per position
			model[k]++
			if w.keys.key(ref) != k || w.keys.seqs(ref) != model[k] {
				t.Fatalf("step %d: %v added as %v with %d seqs, want %d", step, k, w.keys.key(ref), w.keys.seqs(ref), model[k])
			}
		} else {
			ref, ok := w.keys.find(&env.Seed, k)
			if !ok {
				t.Fatalf("step %d: %v lost", step, k)
			}
			w.dropKey(env, ref, k)
			w.keys.settleShrink() // as the worker's event methods do
			if model[k]--; model[k] == 0 {
				delete(model, k)
			}
		}
		w.out.Pend[0] = w.out.Pend[0][:0]
		if step%1000 == 0 {
			if err := w.keys.check(&env.Seed); err != nil {
				t.Fatalf("step %d: %v", step, err)
			}
			for k, n := range model {
				if ref, ok := w.keys.find(&env.Seed, k); !ok || w.keys.seqs(ref) != n {
					t.Fatalf("step %d: %v not held %d times", step, k, n)
				}
			}
			if int(w.keys.held) != len(model) {
				t.Fatalf("step %d: %d blocks held, model has %d", step, w.keys.held, len(model))
			}
		}
	}
	if w.keys.ext == nil || len(w.keys.ext.wide) == 0 {
		t.Fatalf("no block's counts went wide")
	}
}

// TestKeyIndexLongRun stores keys that share a home slot under a known seed, more of
// them than a slot's dist can count, so that the key index must grow past its load
// limit to place them; every key stays findable and deletable.
func TestKeyIndexLongRun(t *testing.T) {
	seed := table.SeedFrom(4)
	var keys []key
	for p := uint64(0); len(keys) < maxKeyDist+60; p++ {
		k := key{prefix: p}
		if seed.Hash128(k.prefix, k.loc())>>52 == 0 { // the same top 12 bits
			keys = append(keys, k)
		}
	}
	kt := keyTable{full: true}
	refs := map[key]uint32{}
	for _, k := range keys {
		ref := kt.newSeg(&seed, k, fpOf(&seed, k), 1)
		kt.addSeqs(ref, 1)
		kt.held++
		kt.loose--
		refs[k] = ref
	}
	if len(kt.idx) < 1<<12 {
		t.Fatalf("%d keys of one home in %d slots", len(keys), len(kt.idx))
	}
	for i, k := range keys {
		if got, ok := kt.find(&seed, k); !ok || got != refs[k] || kt.key(got) != k {
			t.Fatalf("key %d found as %d, want %d", i, got, refs[k])
		}
		if i%2 == 0 {
			kt.addSeqs(refs[k], -1)
			kt.held--
			kt.loose++
			kt.trim(&seed, segOf(refs[k]))
		}
	}
	for i, k := range keys {
		if got, ok := kt.find(&seed, k); ok != (i%2 == 1) || ok && got != refs[k] {
			t.Fatalf("key %d: found %v", i, ok)
		}
	}
	if int(kt.nsegs) != len(keys)/2 {
		t.Fatalf("%d segments, want %d", kt.nsegs, len(keys)/2)
	}
	if err := kt.check(&seed); err != nil {
		t.Fatal(err)
	}
}
