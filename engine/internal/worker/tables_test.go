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

// TestValidateStoreColliding: seqs that all mark the filter's same bit (a peer that
// chose them) are still told apart, by the seeded set once the comparisons pass their
// budget, and a duplicate among them is still found; the filter path and the set path
// are both exercised here (events of 17-512 blocks take the filter).
func TestValidateStoreColliding(t *testing.T) {
	o := &Outbox{}
	env := &Env{Seed: table.SeedFrom(2)}
	for _, n := range []int{17, 40, 300, 512} {
		blocks := make([]Block, n)
		for i := range blocks {
			blocks[i].Seq = uint64(i+1) << 12 // bits 12-28 only: every seq's filter bit is 0
		}
		if !o.ValidStore(env, 0, false, blocks) {
			t.Fatalf("%d distinct colliding seqs rejected", n)
		}
		blocks[n-1].Seq = blocks[n/2].Seq
		if o.ValidStore(env, 0, false, blocks) {
			t.Fatalf("%d colliding seqs with a duplicate accepted", n)
		}
		blocks[n-1].Seq = uint64(n) << 12
		if o.ValidStore(env, blocks[3].Seq, true, blocks) {
			t.Fatalf("%d colliding seqs with the parent among them accepted", n)
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

// delAgainst deletes seq s from st and from model, failing unless st gives back the
// block model has for it (or nothing where model has none).
func delAgainst(t *testing.T, step int, st *seqTable, seed *table.Seed, model map[uint64]uint32, s uint64) {
	t.Helper()
	rid, ok := st.del(seed, s)
	want, had := model[s]
	if ok != had || ok && rid != want {
		t.Fatalf("step %d: del(%d) = %d, %v; model %d, %v", step, s, rid, ok, want, had)
	}
	delete(model, s)
}

// TestSeqTableAgainstMap runs the seq table against a map under random insertions,
// overwrites, deletions and lookups, with checkSlots after every change: dead bytes,
// rebuilds at the same size, growth and shrinking all happen (a key space of a few
// thousand seqs, drained and refilled in waves). A few seqs share their home group and
// their tag on purpose (the seed is known here), so groups fill and probes pass them.
func TestSeqTableAgainstMap(t *testing.T) {
	seed := table.SeedFrom(11)
	r := rand.New(rand.NewPCG(5, 6))
	var st seqTable
	model := map[uint64]uint32{}
	// Seqs whose mixed hashes agree in the home group's bits and the tag: from one
	// mixed hash, vary only bits the home (the top 20) and the tag (the low 7) ignore.
	base := r.Uint64()
	crowd := make([]uint64, 40)
	for i := range crowd {
		crowd[i] = seed.Unmix64(base ^ uint64(i+1)<<7)
	}
	seqOf := func() uint64 {
		if r.IntN(8) == 0 {
			return crowd[r.IntN(len(crowd))]
		}
		return uint64(r.IntN(3000)) * 0x9E3779B97F4A7C15
	}
	for step := range 200_000 {
		wave := step / 20_000 % 2 // even waves fill, odd waves drain
		switch op := r.IntN(10); {
		case op < 5 && wave == 0 || op < 2:
			s := seqOf()
			rid := r.Uint32N(1 << 20)
			i, h, found := st.locate(&seed, s)
			_, had := model[s]
			if found != had {
				t.Fatalf("step %d: locate(%d) found %v, model %v", step, s, found, had)
			}
			st.setAt(i, h, rid)
			model[s] = rid
		case op < 9:
			delAgainst(t, step, &st, &seed, model, seqOf())
		default:
			s := seqOf()
			rid, ok := st.get(&seed, s)
			want, had := model[s]
			if ok != had || ok && rid != want {
				t.Fatalf("step %d: get(%d) = %d, %v; model %d, %v", step, s, rid, ok, want, had)
			}
		}
		if int(st.n) != len(model) {
			t.Fatalf("step %d: %d entries, model %d", step, st.n, len(model))
		}
		if step%97 == 0 || step > 199_000 {
			if err := st.checkSlots(); err != nil {
				t.Fatalf("step %d: %v", step, err)
			}
		}
	}
	seen := 0
	for i := range st.slots {
		if s := &st.slots[i]; s.ref != 0 {
			seen++
			if model[s.seq(&seed)] != s.ref-1 {
				t.Fatalf("slot %d holds seq %d -> %d, model %d", i, s.seq(&seed), s.ref-1, model[s.seq(&seed)])
			}
		}
	}
	if seen != len(model) {
		t.Fatalf("%d slots hold seqs, model %d", seen, len(model))
	}
}

// TestSeqInsertRun: runs inserted by insertRun after reserve and removed by delRun,
// mixed with single insertions and deletions, against a map: a run stops at the first seq the table
// holds (one repeated inside the run included) and inserts everything before it with
// consecutive refs; reserve's growth and rebuilds keep every slot findable.
func TestSeqInsertRun(t *testing.T) {
	seed := table.SeedFrom(13)
	r := rand.New(rand.NewPCG(7, 8))
	var st seqTable
	model := map[uint64]uint32{}
	seqOf := func() uint64 { return uint64(r.IntN(5000)) * 0x9E3779B97F4A7C15 }
	for step := range 20_000 {
		switch op := r.IntN(10); {
		case op < 4:
			run := make([]uint64, 1+r.IntN(TouchGroup))
			hs := make([]uint64, len(run))
			for j := range run {
				run[j] = seqOf()
				hs[j] = seed.Mix64(run[j])
			}
			ref0 := r.Uint32N(1 << 20)
			st.reserve(len(run))
			got := st.insertRun(hs, ref0)
			want := len(run)
			for j, s := range run {
				if _, had := model[s]; had {
					want = j
					break
				}
				model[s] = ref0 + uint32(j)
			}
			if got != want {
				t.Fatalf("step %d: insertRun of %d inserted %d, want %d", step, len(run), got, want)
			}
		case op < 6:
			delAgainst(t, step, &st, &seed, model, seqOf())
		case op < 9: // a window of a removal, a seq in it maybe twice
			run := make([]uint64, 1+r.IntN(TouchGroup))
			hs := make([]uint64, len(run))
			for j := range run {
				if run[j] = seqOf(); j > 0 && r.IntN(8) == 0 {
					run[j] = run[r.IntN(j)]
				}
				hs[j] = seed.Mix64(run[j])
			}
			refs := make([]uint32, TouchGroup)
			st.delRun(hs, refs)
			for j, s := range run {
				want, had := model[s]
				if got := refs[j]; !had && got != 0 || had && got != want+1 {
					t.Fatalf("step %d: delRun's seq %d of %d: ref+1 %d, model %d, %v", step, j, len(run), got, want, had)
				}
				delete(model, s)
			}
			st.shrink()
		default:
			s := seqOf()
			if i, h, found := st.locate(&seed, s); !found {
				rid := r.Uint32N(1 << 20)
				st.setAt(i, h, rid)
				model[s] = rid
			}
		}
		if int(st.n) != len(model) {
			t.Fatalf("step %d: %d entries, model %d", step, st.n, len(model))
		}
		if step%97 == 0 {
			if err := st.checkSlots(); err != nil {
				t.Fatalf("step %d: %v", step, err)
			}
		}
	}
	for s, want := range model {
		if rid, ok := st.get(&seed, s); !ok || rid != want {
			t.Fatalf("seq %d: get %d, %v; model %d", s, rid, ok, want)
		}
	}
}

// TestSeqInsertRunChurn: at the growth load, runs evicted and stored in their place
// leave dead bytes behind; insertRun rebuilds the table at its size before live and
// dead slots pass 7/8 (checkSlots), and grows it no further than the live count asks.
func TestSeqInsertRunChurn(t *testing.T) {
	seed := table.SeedFrom(17)
	var st seqTable
	var live []uint64 // seqs held, oldest first
	next := uint64(1)
	rebuilds := 0
	for round := range 3000 {
		run := make([]uint64, TouchGroup)
		hs := make([]uint64, TouchGroup)
		for j := range run {
			run[j] = next * 0x9E3779B97F4A7C15
			hs[j] = seed.Mix64(run[j])
			next++
		}
		st.reserve(len(run))
		before := len(st.ctrl)
		dead := st.dead
		if got := st.insertRun(hs, uint32(round)); got != len(run) {
			t.Fatalf("round %d: inserted %d of %d new seqs", round, got, len(run))
		}
		if len(st.ctrl) == before && dead > TouchGroup && st.dead == 0 {
			rebuilds++ // (insertions into dead slots lower the count by one each)
		}
		live = append(live, run...)
		if len(live) > 3000 { // evict the oldest run: the table stays near its growth load
			old := live[:TouchGroup]
			ohs := make([]uint64, len(old))
			for j, s := range old {
				ohs[j] = seed.Mix64(s)
			}
			refs := make([]uint32, TouchGroup)
			st.delRun(ohs, refs)
			for j := range refs {
				if refs[j] == 0 {
					t.Fatalf("round %d: held seq %d not found", round, j)
				}
			}
			live = live[TouchGroup:]
		}
		if err := st.checkSlots(); err != nil {
			t.Fatalf("round %d: %v", round, err)
		}
	}
	if int(st.n) != len(live) || table.Full(int(st.n)-1, len(st.slots)) {
		t.Fatalf("%d entries in %d slots, %d held", st.n, len(st.slots), len(live))
	}
	if rebuilds == 0 {
		t.Fatal("no rebuild at the same size: the churn left too few dead slots to test it")
	}
	t.Logf("%d slots, %d live, %d dead, %d rebuilds at the same size", len(st.slots), st.n, st.dead, rebuilds)
}

// TestSeqInsertRunPastReserve: insertRun given more seqs than reserve made room for
// grows the table where it must instead of probing for room forever.
func TestSeqInsertRunPastReserve(t *testing.T) {
	seed := table.SeedFrom(19)
	var st seqTable
	for round := range 50 {
		hs := make([]uint64, TouchGroup)
		for j := range hs {
			hs[j] = seed.Mix64(uint64(round*TouchGroup + j + 1))
		}
		st.reserve(1)
		if got := st.insertRun(hs, 0); got != len(hs) {
			t.Fatalf("round %d: inserted %d of %d", round, got, len(hs))
		}
		if err := st.checkSlots(); err != nil {
			t.Fatalf("round %d: %v", round, err)
		}
	}
	if int(st.n) != 50*TouchGroup {
		t.Fatalf("%d entries, want %d", st.n, 50*TouchGroup)
	}
}

// BenchmarkSeqSteady measures the seq table at a steady size (4,096 seqs: one deletion
// and one insertion per op, as a worker that evicts what it stores) and growing from
// empty to 4,096 seqs (per op: the whole growth).
func BenchmarkSeqSteady(b *testing.B) {
	const n = 4096
	seed := table.SeedFrom(7)
	r := rand.New(rand.NewPCG(1, 2))
	keys := make([]uint64, 64*n)
	for i := range keys {
		keys[i] = seed.Mix64(r.Uint64())
	}
	b.Run("op=steady", func(b *testing.B) {
		var t seqTable
		for _, h := range keys[:n] {
			i, _ := t.locateMixed(h)
			t.setAt(i, h, 1)
		}
		j := 0
		for b.Loop() {
			t.delMixed(keys[j%len(keys)])
			h := keys[(j+n)%len(keys)]
			if i, found := t.locateMixed(h); !found {
				t.setAt(i, h, 1)
			}
			j++
		}
	})
	b.Run("op=grow", func(b *testing.B) {
		for b.Loop() {
			var t seqTable
			for _, h := range keys[:n] {
				if i, found := t.locateMixed(h); !found {
					t.setAt(i, h, 1)
				}
			}
		}
	})
}

// TestSeqTableDeadBytes: deletions from full groups leave dead bytes, which a probe
// passes and an insertion reuses; once live and dead slots reach 7/8 of the table below
// its growth load, the next insertion rebuilds it at the same size without them.
func TestSeqTableDeadBytes(t *testing.T) {
	seed := table.SeedFrom(13)
	var st seqTable
	// 40 seqs of one home group (their mixed hashes differ only below the home's bits)
	// fill five groups in a table of 64 slots.
	base := seed.Mix64(12345)
	crowd := make([]uint64, 40)
	for i := range crowd {
		crowd[i] = seed.Unmix64(base ^ uint64(i+1)<<16)
	}
	put := func(s uint64, rid uint32) {
		t.Helper()
		i, h, found := st.locate(&seed, s)
		if found {
			t.Fatalf("seq %d found before it was put", s)
		}
		st.setAt(i, h, rid)
		if err := st.checkSlots(); err != nil {
			t.Fatal(err)
		}
	}
	for i, s := range crowd {
		put(s, uint32(i))
	}
	if len(st.slots) != 64 {
		t.Fatalf("%d slots for 40 seqs, want 64", len(st.slots))
	}
	home := st.homeOf(base)
	// The last seq sits four groups past its home: found through four full groups.
	if rid, ok := st.get(&seed, crowd[39]); !ok || rid != 39 {
		t.Fatalf("get(crowd[39]) = %d, %v", rid, ok)
	}
	for i, s := range crowd[:39] {
		if rid, ok := st.del(&seed, s); !ok || rid != uint32(i) {
			t.Fatalf("del(crowd[%d]) = %d, %v", i, rid, ok)
		}
		if err := st.checkSlots(); err != nil {
			t.Fatal(err)
		}
	}
	if st.dead != 39 {
		t.Fatalf("%d dead bytes after 39 deletions from full groups, want 39", st.dead)
	}
	if rid, ok := st.get(&seed, crowd[39]); !ok || rid != 39 {
		t.Fatalf("get(crowd[39]) past dead bytes = %d, %v", rid, ok)
	}
	// Seqs homed outside the crowd's groups reuse no dead byte: the 17th makes 17 live
	// and 39 dead, past 7/8 of 64 and below the growth load (48): a rebuild in place.
	r := rand.New(rand.NewPCG(7, 8))
	added := 0
	for added < 17 {
		s := r.Uint64()
		if g := st.homeOf(seed.Mix64(s)); (g+8-home)%8 < 5 {
			continue
		}
		put(s, 1000)
		added++
	}
	if len(st.slots) != 64 || st.dead != 0 || st.n != 18 {
		t.Fatalf("after the rebuild: %d slots, %d dead, %d live; want 64, 0, 18", len(st.slots), st.dead, st.n)
	}
}

// BenchmarkValidStore measures the duplicate check of a 92-block stored event (the
// conversation trace's average) by the filter (ValidStore) and by the seeded set alone
// (validSet).
func BenchmarkValidStore(b *testing.B) {
	o := &Outbox{}
	env := &Env{Seed: table.SeedFrom(1)}
	r := rand.New(rand.NewPCG(5, 6))
	blocks := make([]Block, 92)
	for i := range blocks {
		blocks[i].Seq = r.Uint64()
	}
	b.Run("check=filter", func(b *testing.B) {
		for b.Loop() {
			if !o.ValidStore(env, 0, false, blocks) {
				b.Fatal("rejected")
			}
		}
	})
	b.Run("check=set", func(b *testing.B) {
		for b.Loop() {
			if !o.validSet(env, 0, false, blocks) {
				b.Fatal("rejected")
			}
		}
	})
}
