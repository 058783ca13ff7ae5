package subscriber

import (
	"context"
	"encoding/binary"
	"testing"
	"time"

	"github.com/kvindex/kvindex/engine"
)

// FuzzApplyBatch feeds a subscriber whatever a publisher can put in a payload: tiered
// media, hash-only stores, removals per medium, garbage. Nothing may panic or fail the
// subscriber (only the index failing is fatal), and the index stays consistent: its
// blocks per tier sum to its blocks.
func FuzzApplyBatch(f *testing.F) {
	a, _ := stored(nil, [2]uint64{1, 100}, [2]uint64{2, 101})
	h, _ := stored(p64(101), [2]uint64{3, 102})
	h.medium = "CPU_TIER1"
	for _, b := range [][]byte{
		batch(a, ev{kind: "stored", seqs: []uint64{100, 101, 7}, bs: testBS, medium: "CPU"},
			ev{kind: "removed", seqs: []uint64{100}}, ev{kind: "removed", seqs: []uint64{101}, medium: "CPU"}),
		batch(a, h, ev{kind: "stored", seqs: []uint64{102}, bs: 4 * testBS, medium: "STORAGE"}, ev{kind: "cleared"}),
		batch(ev{kind: "stored", seqs: []uint64{5}, bs: testBS, medium: "GPU"}, ev{kind: "stored", seqs: []uint64{5}, bs: testBS, medium: "\x00"}),
		batch(a, ev{kind: "stored", seqs: []uint64{100}, parent: 101, hasParent: true, bs: testBS, medium: "DISK"}),
	} {
		f.Add(b)
	}
	e, err := engine.New(engine.Config{Shards: 2, JumpSize: 4})
	if err != nil {
		f.Fatal(err)
	}
	defer e.Close()
	s, err := New(Config{Endpoint: "tcp://127.0.0.1:1", Worker: "w", Model: "m", Index: e, BlockSize: testBS,
		Tiers: map[string]engine.Tier{"NVME": engine.TierDisk}})
	if err != nil {
		f.Fatal(err)
	}
	s.up()
	s.synced = true
	var seq uint64
	f.Fuzz(func(t *testing.T, payload []byte) {
		var sb [8]byte
		binary.BigEndian.PutUint64(sb[:], seq)
		seq++
		if err := s.handle(context.Background(), [][]byte{nil, sb[:], payload}); err != nil {
			t.Fatalf("handle: %v", err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := e.Barrier(ctx); err != nil {
			t.Fatal(err)
		}
		st := e.Stats()
		if st.TierBlocks[0]+st.TierBlocks[1]+st.TierBlocks[2] != st.Blocks {
			t.Fatalf("tier blocks %v, blocks %d", st.TierBlocks, st.Blocks)
		}
		if n, ok := e.WorkerSize("w"); ok && int64(n) != st.Blocks {
			t.Fatalf("worker size %d, blocks %d", n, st.Blocks)
		}
	})
}
