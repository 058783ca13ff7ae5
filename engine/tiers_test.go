package engine_test

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kvindex/kvindex/engine"
	"github.com/kvindex/kvindex/internal/oplog"
	"github.com/kvindex/kvindex/internal/refmodel"
	"github.com/kvindex/kvindex/internal/testsize"
)

func tierEvent(kind engine.EventKind, worker string, tier engine.Tier) *engine.Event {
	return &engine.Event{Kind: kind, Worker: worker, Tier: tier}
}

// TestTiers walks the tier semantics on a small history: copies per tier, a removal on
// one tier, a store whose parent only another tier holds, a gappy host tier, clear and
// removal of the worker.
func TestTiers(t *testing.T) {
	for _, cfg := range []engine.Config{{LockedIndex: true}, {Shards: 1}, {Shards: 3, JumpSize: 2}} {
		t.Run(fmt.Sprintf("locked=%v/shards=%d", cfg.LockedIndex, cfg.Shards), func(t *testing.T) {
			e := newEngine(t, cfg)
			chain := []engine.Block{{Content: 1, Seq: 10}, {Content: 2, Seq: 11}, {Content: 3, Seq: 12}, {Content: 4, Seq: 13}}
			q := []uint64{1, 2, 3, 4}
			require.NoError(t, e.Store("w", chain))
			// The engine offloads the whole chain to host memory: the same seqs, another tier.
			host := tierEvent(engine.EventStored, "w", engine.TierHost)
			host.Blocks = chain
			require.NoError(t, e.Apply(host))
			// The device evicts its tail; the host copy keeps the prefix whole.
			require.NoError(t, e.Remove("w", 12, 13))
			require.NoError(t, e.Barrier(ctx))
			got := match(t, e, "", q...)
			require.Equal(t, []engine.Match{{Worker: "w", Score: 4, Size: 6, Tiers: [3]int{2, 4, 4}}}, got)
			require.InDelta(t, 2+0.75*2, got[0].Weighted(engine.DefaultWeights), 1e-9)
			require.Equal(t, 2.0, got[0].Weighted(engine.Weights{1, 0, 0}))
			st := e.Stats()
			require.Equal(t, [3]int64{2, 4, 0}, st.TierBlocks)
			require.Equal(t, int64(6), st.Blocks)
			require.Equal(t, 1, st.Workers)
			n, ok := e.WorkerSize("w")
			require.True(t, ok)
			require.Equal(t, 6, n)

			// A disk block under a parent only the host holds (13): found on another tier.
			disk := tierEvent(engine.EventStored, "w", engine.TierDisk)
			disk.Parent, disk.HasParent, disk.Blocks = 13, true, []engine.Block{{Content: 5, Seq: 14}}
			require.NoError(t, e.Apply(disk))
			// A removal on the host tier leaves the device's copy of 11 and drops the host's.
			rm := tierEvent(engine.EventRemoved, "w", engine.TierHost)
			rm.Seqs = []uint64{11, 99}
			require.NoError(t, e.Apply(rm))
			require.NoError(t, e.Barrier(ctx))
			// Host holds 0, 2, 3 (gappy); the union with the device (0, 1) is 0..3, and the
			// disk block extends it to 5.
			require.Equal(t, []engine.Match{{Worker: "w", Score: 5, Size: 6, Tiers: [3]int{2, 4, 5}}},
				match(t, e, "", 1, 2, 3, 4, 5))
			require.Equal(t, uint64(1), e.Stats().SkippedRemovals)

			// Cleared covers every tier and takes none.
			bad := tierEvent(engine.EventCleared, "w", engine.TierHost)
			require.ErrorIs(t, e.Apply(bad), engine.ErrInvalidEvent)
			bad = tierEvent(engine.EventStored, "w", engine.NumTiers)
			bad.Blocks = chain
			require.ErrorIs(t, e.Apply(bad), engine.ErrInvalidEvent)
			require.NoError(t, e.Clear("w"))
			require.NoError(t, e.Barrier(ctx))
			require.Empty(t, match(t, e, "", q...))
			require.Equal(t, [3]int64{}, e.Stats().TierBlocks)

			// A worker known only through a host store, then forgotten with its tiers.
			only := tierEvent(engine.EventStored, "h", engine.TierHost)
			only.Blocks = chain[:2]
			require.NoError(t, e.Apply(only))
			require.NoError(t, e.Barrier(ctx))
			require.Equal(t, []engine.Match{{Worker: "h", Score: 2, Size: 2, Tiers: [3]int{0, 2, 2}}}, match(t, e, "", q...))
			require.NoError(t, e.RemoveWorker("h"))
			require.NoError(t, e.RemoveWorker("w"))
			require.NoError(t, e.Barrier(ctx))
			require.Empty(t, match(t, e, "", q...))
			require.Zero(t, e.Stats().Workers)
			require.Equal(t, [3]int64{}, e.Stats().TierBlocks)
		})
	}
}

func TestParseTier(t *testing.T) {
	for tier := range engine.Tier(engine.NumTiers) {
		got, err := engine.ParseTier(tier.String())
		require.NoError(t, err)
		require.Equal(t, tier, got)
	}
	_, err := engine.ParseTier("GPU")
	require.ErrorIs(t, err, engine.ErrInvalidEvent)
	require.NoError(t, engine.DefaultWeights.Validate())
	require.ErrorIs(t, engine.Weights{1, 2, 0}.Validate(), engine.ErrInvalidConfig)
}

// TestTiersSnapshotRoundTrip restores snapshots of tiered histories and checks that the
// restored engine answers as the model does, and that its snapshot is the same bytes.
func TestTiersSnapshotRoundTrip(t *testing.T) {
	for seed := uint64(1); seed <= 3; seed++ {
		ops := refmodel.RandomOps(rand.New(rand.NewPCG(seed, 55)), 2000, refmodel.RandomOptions{MaxChain: 60, Tiers: true})
		e := newEngine(t, engine.Config{Shards: 2})
		m := refmodel.New()
		for i := range ops {
			if ops[i].Kind == oplog.Query {
				continue
			}
			werr := m.Apply(&ops[i])
			checkRejection(t, i, werr, applyOp(e, &ops[i]))
		}
		var a bytes.Buffer
		require.NoError(t, e.WriteSnapshot(&a))
		r, err := engine.RestoreBytes(engine.Config{LockedIndex: true}, a.Bytes())
		require.NoError(t, err)
		t.Cleanup(func() { r.Close() })
		var b bytes.Buffer
		require.NoError(t, r.WriteSnapshot(&b))
		require.Equal(t, a.Bytes(), b.Bytes())
		require.Equal(t, int64(m.Blocks()), r.Stats().Blocks)
		compared := 0
		for i := range ops {
			if ops[i].Kind != oplog.Query {
				continue
			}
			want := m.Query(ops[i].Content)
			got := match(t, r, "", ops[i].Content...)
			require.Equal(t, len(want), len(got))
			for j := range want {
				require.Equal(t, want[j], refmodel.Answer(got[j]))
			}
			compared++
		}
		require.Positive(t, compared)
	}
}

// TestFindMatchesZeroAllocsTiers: a query over tiered workers, one of them gappy (the
// fallback path), allocates nothing in steady state.
func TestFindMatchesZeroAllocsTiers(t *testing.T) {
	testsize.SkipAllocs(t)
	e := newEngine(t, engine.Config{Shards: 2, JumpSize: 8})
	chain := make([]engine.Block, 100)
	q := make([]uint64, 100)
	for i := range chain {
		chain[i] = engine.Block{Content: uint64(i), Seq: uint64(1000 + i)}
		q[i] = uint64(i)
	}
	for w := 0; w < 6; w++ {
		name := fmt.Sprintf("w%d", w)
		require.NoError(t, e.Store(name, chain[:20+10*w]))
		host := tierEvent(engine.EventStored, name, engine.TierHost)
		host.Blocks = chain[:30+10*w]
		require.NoError(t, e.Apply(host))
	}
	require.NoError(t, e.Remove("w2", 1005)) // a gappy device tier: the fallback path
	require.NoError(t, e.Barrier(ctx))
	dst := make([]engine.Match, 0, 16)
	allocs := testing.AllocsPerRun(200, func() {
		var err error
		if dst, err = e.FindMatches(ctx, q, dst[:0]); err != nil {
			t.Fatal(err)
		}
	})
	require.Len(t, dst, 6)
	require.Equal(t, [3]int{5, 50, 50}, dst[len(dst)-3].Tiers) // w2
	require.Zero(t, allocs)
}

// TestCopied: an offload by engine hash (no content, no parent) copies the keys of the
// fastest other tier; a seq held nowhere is skipped and counted.
func TestCopied(t *testing.T) {
	e := newEngine(t, engine.Config{Shards: 2, JumpSize: 2})
	chain := []engine.Block{{Content: 1, Seq: 10}, {Content: 2, Seq: 11}, {Content: 3, Seq: 12}}
	require.NoError(t, e.StoreUnder("w", 10, nil)) // nothing, and w stays unknown
	require.NoError(t, e.Store("w", chain))
	cp := tierEvent(engine.EventCopied, "w", engine.TierHost)
	cp.Seqs = []uint64{11, 12, 77}
	require.NoError(t, e.Apply(cp))
	require.NoError(t, e.Remove("w", 11, 12))
	// The disk gets a copy of the host's 12 (no other tier has it any more).
	cp = tierEvent(engine.EventCopied, "w", engine.TierDisk)
	cp.Seqs = []uint64{12}
	require.NoError(t, e.Apply(cp))
	require.NoError(t, e.Barrier(ctx))
	require.Equal(t, []engine.Match{{Worker: "w", Score: 3, Size: 4, Tiers: [3]int{1, 3, 3}}}, match(t, e, "", 1, 2, 3))
	require.Equal(t, uint64(1), e.Stats().SkippedCopies)
	bad := tierEvent(engine.EventCopied, "w", engine.TierDevice)
	require.ErrorIs(t, e.Apply(bad), engine.ErrInvalidEvent)
	// An unknown worker skips every seq and stays unknown.
	cp = tierEvent(engine.EventCopied, "nobody", engine.TierHost)
	cp.Seqs = []uint64{1, 2}
	require.NoError(t, e.Apply(cp))
	require.Equal(t, uint64(3), e.Stats().SkippedCopies)
	require.Equal(t, 1, e.Stats().Workers)
}
