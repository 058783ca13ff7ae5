package engine

import (
	"github.com/kvindex/kvindex/internal/invariants"
	"math/rand/v2"
	"testing"

	"github.com/kvindex/kvindex/internal/table"
	"github.com/kvindex/kvindex/shard"
)

// TestHashFloodingNeedsTheSeed plays a client that knows an engine's seed: it brute-
// forces root contents whose positional-index hash agrees on its top 12 bits (the bits
// that choose the home slot, so all of them pile into one probe run) and engine hashes
// whose seq-table hash does the same, as an attacker who could compute an unkeyed
// table hash would. Stored into an engine with that seed, they make every table probe
// long runs; stored into an engine with another seed (every engine draws its own), they
// must cost no more than twice what random keys cost. The cost is counted, not timed: the
// probes a lookup of every stored key takes in the index, the key index and the seq
// table.
func TestHashFloodingNeedsTheSeed(t *testing.T) {
	n := 20_000
	if testing.Short() || underRace {
		n = 3_000 // the crafted set costs n^2/2 probes to store
	}
	if invariants.Enabled {
		n = 200 // and a recount of the crafted run after each store: n^3 probes
	}
	known := table.SeedFrom(1)
	const topBits = 12
	var contents, seqs []uint64
	for c := uint64(1); len(contents) < n; c++ {
		if shard.Hash(known, shard.Key{Prefix: c})>>(64-topBits) == 0 {
			contents = append(contents, c)
		}
	}
	for s := uint64(1); len(seqs) < n; s++ {
		if known.Mix64(s)>>(64-topBits) == 0 { // the seq table homes a seq by its mixed hash
			seqs = append(seqs, s)
		}
	}
	r := rand.New(rand.NewPCG(1, 2))
	randContents, randSeqs := make([]uint64, n), make([]uint64, n)
	for i := range randContents {
		randContents[i], randSeqs[i] = r.Uint64(), r.Uint64()
	}
	crafted := func(seed table.Seed) float64 { return floodProbes(t, seed, contents, seqs) }
	random := floodProbes(t, table.SeedFrom(2), randContents, randSeqs)
	victim, other := crafted(known), crafted(table.SeedFrom(2))
	t.Logf("probes per stored block (index + key index + seq table): random keys %.2f, crafted keys against their seed %.1f, against another seed %.2f", random, victim, other)
	if victim < 20*random {
		t.Fatalf("the crafted keys do not collide under their seed (%.1f probes against %.2f): the test has no teeth", victim, random)
	}
	if other > 2*random {
		t.Fatalf("crafted keys cost %.2f probes per block under another seed, random keys %.2f", other, random)
	}
}

// floodProbes stores one root block per (content, seq) pair on one worker of a locked
// engine with the given seed and returns the mean number of slots that looking each of
// them up again reads, summed over the three tables.
func floodProbes(t *testing.T, seed table.Seed, contents, seqs []uint64) float64 {
	e, err := newSeeded(Config{LockedIndex: true}, seed)
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	for i := range contents {
		if err := e.Store("victim", []Block{{Content: contents[i], Seq: seqs[i]}}); err != nil {
			t.Fatal(err)
		}
		// The tables must check while the runs grow past maxKeyDist: a key index probe
		// of more than maxKeyDist slots once wrapped the new slot's dist byte, losing
		// the key (the 257th crafted root) until the next rebuild.
		if i < 600 {
			w := e.lookup("victim")
			e.lockWorker(w)
			err := w.Check(&e.env, true)
			e.unlockWorker(w)
			if err != nil {
				t.Fatalf("store %d: %v", i, err)
			}
		}
	}
	w := e.lookup("victim")
	idx := e.shards[0].Index()
	total := 0
	for i := range contents {
		k := shard.Key{Prefix: contents[i]}
		kp, sp := w.Probes(&e.env, k, seqs[i])
		total += idx.Probes(e.fingerprint(k)) + kp + sp
	}
	return float64(total) / float64(len(contents))
}

// TestSnapshotDoesNotDependOnSeed applies one history to engines with different seeds
// (different table layouts) and requires byte-identical snapshots.
func TestSnapshotDoesNotDependOnSeed(t *testing.T) {
	var snaps []string
	events := 3000
	if invariants.Enabled {
		events = 300 // each event recounts every table
	}
	for _, seed := range []uint64{1, 2, 3} {
		e, err := newSeeded(Config{Shards: 2}, table.SeedFrom(seed))
		if err != nil {
			t.Fatal(err)
		}
		r := rand.New(rand.NewPCG(9, 9))
		for i := 0; i < events; i++ {
			w := []string{"a", "b", "c"}[r.IntN(3)]
			if r.IntN(3) == 0 {
				_ = e.Remove(w, uint64(r.IntN(2000)))
				continue
			}
			blocks := make([]Block, 1+r.IntN(8))
			for j := range blocks {
				blocks[j] = Block{Content: uint64(r.IntN(50)), Seq: uint64(r.IntN(2000))}
			}
			_ = e.Apply(&Event{Kind: EventStored, Worker: w, Namespace: []string{"", "x"}[r.IntN(2)], Blocks: blocks})
		}
		var b bytesBuffer
		if err := e.WriteSnapshot(&b); err != nil {
			t.Fatal(err)
		}
		e.Close()
		snaps = append(snaps, string(b))
	}
	if snaps[0] != snaps[1] || snaps[0] != snaps[2] {
		t.Fatal("snapshots of one history differ between seeds")
	}
}

type bytesBuffer []byte

func (b *bytesBuffer) Write(p []byte) (int, error) { *b = append(*b, p...); return len(p), nil }
