package engine_test

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/kvindex/kvindex/engine"
	"github.com/kvindex/kvindex/internal/oplog"
	"github.com/kvindex/kvindex/internal/refmodel"
	"github.com/kvindex/kvindex/internal/testsize"
	"github.com/stretchr/testify/require"
)

// TestDifferentialHybrid holds hybrid models (KV-cache groups) to the reference model
// on random histories of hybrid and plain workers: windows with holes, Mamba states
// missing at the cut, spans of several units, host copies, redeclarations and the
// events the contract rejects, at every shard count, on the locked index, at several
// jump sizes, one event a call and in batches.
func TestDifferentialHybrid(t *testing.T) {
	n := testsize.Sized(2500, 700, 300) // the race detector's pass checks ownership, not coverage
	if testing.Short() && n > 700 {
		n = 700
	}
	for _, shards := range []int{0, 1, 2, 3} {
		for _, jump := range []int{1, 4, 64} {
			for seed := uint64(1); seed <= 2; seed++ {
				cfg := engine.Config{Shards: shards, JumpSize: jump, QueueSize: 4}
				mode := fmt.Sprintf("shards=%d", shards)
				if shards == 0 {
					cfg, mode = engine.Config{LockedIndex: true, JumpSize: jump}, "locked"
				}
				cfg.SpecChain = seed == 2 // and by prefix hashes (differentialSteps)
				t.Run(fmt.Sprintf("%s/jump=%d/seed=%d", mode, jump, seed), func(t *testing.T) {
					t.Parallel()
					ops := refmodel.RandomHybridOps(rand.New(rand.NewPCG(seed, uint64(jump))), n, refmodel.HybridOptions{Tiers: seed == 2})
					require.Positive(t, differentialMode(t, cfg, ops, false))
					require.Positive(t, differentialMode(t, cfg, ops, true))
				})
			}
		}
	}
}

// TestSnapshotHybrid snapshots an engine in the middle of a hybrid history, restores
// it, and holds the rest of the history on the restored engine to the model; the
// restored engine snapshots to the same bytes, and every truncation and bit flip of the
// snapshot is refused.
func TestSnapshotHybrid(t *testing.T) {
	for seed := uint64(1); seed <= 3; seed++ {
		ops := refmodel.RandomHybridOps(rand.New(rand.NewPCG(seed, 77)), 1500, refmodel.HybridOptions{Tiers: true})
		cut := len(ops) / 2
		e := newEngine(t, engine.Config{Shards: 2, JumpSize: 4})
		m := refmodel.New()
		for i := range ops[:cut] {
			if ops[i].Kind != oplog.Query {
				checkRejection(t, i, m.Apply(&ops[i]), applyOp(e, &ops[i]))
			}
		}
		var snap bytes.Buffer
		require.NoError(t, e.WriteSnapshot(&snap))
		r, err := engine.Restore(engine.Config{Shards: 3}, bytes.NewReader(snap.Bytes()), 0)
		require.NoError(t, err)
		t.Cleanup(func() { r.Close() })
		var again bytes.Buffer
		require.NoError(t, r.WriteSnapshot(&again))
		require.Equal(t, snap.Bytes(), again.Bytes(), "a restored engine snapshots to the same bytes")
		require.Equal(t, e.Stats().Blocks, r.Stats().Blocks)
		var got []engine.Match
		for i := cut; i < len(ops); i++ {
			op := &ops[i]
			if op.Kind != oplog.Query {
				checkRejection(t, i, m.Apply(op), applyOp(r, op))
				continue
			}
			require.NoError(t, r.Barrier(ctx))
			got, err = r.FindMatches(ctx, op.Content, got[:0])
			require.NoError(t, err)
			require.NoError(t, sameAnswer(m.Query(op.Content), got), "op %d", i)
		}
		if seed == 1 {
			good := snap.Bytes()
			for n := 0; n < len(good); n += 1 + n/64 {
				_, err := engine.RestoreBytes(engine.Config{Shards: 1}, good[:n])
				require.ErrorIs(t, err, engine.ErrSnapshot, "truncated to %d bytes", n)
			}
			for i := 0; i < len(good); i += 1 + i/64 {
				bad := bytes.Clone(good)
				bad[i] ^= 0x10
				_, err := engine.RestoreBytes(engine.Config{Shards: 1}, bad)
				require.ErrorIs(t, err, engine.ErrSnapshot, "byte %d flipped", i)
			}
		}
	}
}

// TestStressHybrid is TestStress on a hybrid history: producers owning disjoint
// workers, readers querying meanwhile (each declared worker's groups are read under its
// lock while its events apply), then every answer at rest against the model.
func TestStressHybrid(t *testing.T) {
	for _, shards := range []int{0, 1, 3} {
		cfg := engine.Config{Shards: shards, QueueSize: 2, QueryQueue: 1}
		if shards == 0 {
			cfg = engine.Config{LockedIndex: true}
		}
		t.Run(fmt.Sprintf("shards=%d", shards), func(t *testing.T) {
			hist := refmodel.RandomHybridOps(rand.New(rand.NewPCG(uint64(shards), 3)), 1200, refmodel.HybridOptions{Workers: 8, Tiers: true})
			stress(t, cfg, hist, 4, 4)
		})
	}
}

// BenchmarkHybridQuery times a query of a 256-block prefix that each of 16 workers
// holds: dense workers (through the shards' jump search) against hybrid ones (full
// attention plus a 4,096-token sliding window, both of the index's block size: their
// groups' tables, evaluated per worker under its lock), and a query of a prefix no
// worker holds. go test -run '^$' -bench HybridQuery ./engine/
func BenchmarkHybridQuery(b *testing.B) {
	const workers, depth = 16, 256
	q := make([]uint64, depth)
	for i := range q {
		q[i] = uint64(i)*0x9e3779b97f4a7c15 + 1
	}
	miss := append([]uint64{12345}, q[1:]...)
	for _, hybrid := range []bool{false, true} {
		e, err := engine.New(engine.Config{Shards: 2})
		require.NoError(b, err)
		blocks := make([]engine.Block, depth)
		for i := range blocks {
			blocks[i] = engine.Block{Content: q[i], Seq: uint64(i + 1)}
		}
		for w := 0; w < workers; w++ {
			name := fmt.Sprintf("w%d", w)
			if hybrid {
				require.NoError(b, e.Apply(&engine.Event{Kind: engine.EventGroups, Worker: name, Unit: 16, Groups: []engine.Group{
					{Kind: engine.GroupFull, BlockSize: 16}, {Kind: engine.GroupSlidingWindow, BlockSize: 16, Window: 4096}}}))
				require.NoError(b, e.Apply(&engine.Event{Kind: engine.EventStored, Worker: name, Group: 1, Blocks: blocks}))
			}
			require.NoError(b, e.Store(name, blocks))
		}
		require.NoError(b, e.Barrier(ctx))
		for _, c := range []struct {
			name string
			q    []uint64
		}{{"held", q}, {"miss", miss}} {
			b.Run(fmt.Sprintf("hybrid=%v/%s", hybrid, c.name), func(b *testing.B) {
				var dst []engine.Match
				b.ReportAllocs()
				for b.Loop() {
					dst, _ = e.FindMatches(ctx, c.q, dst[:0])
				}
			})
		}
		e.Close()
	}
}

// TestGroupsOf: Groups returns a worker's declaration as given, through a snapshot; a
// dense declaration, an undeclared worker and an unknown one have none.
func TestGroupsOf(t *testing.T) {
	e := newEngine(t, engine.Config{Shards: 1})
	decl := []engine.Group{{Kind: engine.GroupFull, BlockSize: 16}, {Kind: engine.GroupSlidingWindow, BlockSize: 32, Window: 100}, {Kind: engine.GroupMamba, BlockSize: 64}}
	require.NoError(t, e.Apply(&engine.Event{Kind: engine.EventGroups, Worker: "h", Unit: 16, Groups: decl}))
	require.NoError(t, e.Apply(&engine.Event{Kind: engine.EventGroups, Worker: "d", Unit: 16, Groups: decl[:1]}))
	require.NoError(t, e.Store("p", []engine.Block{{Content: 1, Seq: 1}}))
	var snap bytes.Buffer
	require.NoError(t, e.WriteSnapshot(&snap))
	r, err := engine.Restore(engine.Config{Shards: 1}, &snap, 0)
	require.NoError(t, err)
	t.Cleanup(func() { r.Close() })
	for _, x := range []*engine.Engine{e, r} {
		unit, got, ok := x.Groups("h")
		require.True(t, ok)
		require.Equal(t, 16, unit)
		require.Equal(t, decl, got)
		for _, w := range []string{"d", "p", "nobody"} {
			_, _, ok := x.Groups(w)
			require.False(t, ok, w)
		}
	}
}
