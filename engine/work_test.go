package engine_test

import (
	"testing"

	"github.com/kvindex/kvindex/engine"
	"github.com/stretchr/testify/require"
)

// TestQueryWorkCounters checks Stats.QueryRounds and QueryProbes against the landing
// schedule for two queries of a 40-block chain (dense prefix fixed at 16, JumpSize 64):
// round 1 probes position 0, the dense positions 1..16, then 32 (a stride of 16) and 39
// (the last position), 19 probes. A query the worker holds to its end needs nothing
// more; one that leaves the chain at position 20 drops the worker at landing 32, and
// round 2 probes the stride before it, positions 17..31.
func TestQueryWorkCounters(t *testing.T) {
	blocks := make([]engine.Block, 40)
	content := make([]uint64, len(blocks))
	for i := range blocks {
		content[i] = uint64(1000 + i)
		blocks[i] = engine.Block{Content: content[i], Seq: uint64(i + 1)}
	}
	for _, shards := range []int{2, 3} {
		e := newEngine(t, engine.Config{Shards: shards})
		engine.SetDenseLandings(e, 16)
		require.NoError(t, e.Store("w", blocks))
		require.NoError(t, e.Barrier(ctx))
		diverged := append([]uint64(nil), content...)
		diverged[20] = 1
		for _, q := range []struct {
			content        []uint64
			score          int
			rounds, probes uint64
		}{
			{content, 40, 1, 1 + 16 + 2},
			{diverged, 20, 2, 1 + 16 + 2 + 15},
		} {
			before := e.Stats()
			m, err := e.FindMatches(ctx, q.content, nil)
			require.NoError(t, err)
			require.Len(t, m, 1)
			require.Equal(t, q.score, m[0].Score)
			after := e.Stats()
			require.Equal(t, q.rounds, after.QueryRounds-before.QueryRounds, "shards=%d score %d: rounds", shards, q.score)
			require.Equal(t, q.probes, after.QueryProbes-before.QueryProbes, "shards=%d score %d: probes", shards, q.score)
		}
	}
	// The direct walk (the locked index; one shard, whose table is the whole index)
	// pays no round trips and counts neither.
	for _, cfg := range []engine.Config{{LockedIndex: true}, {Shards: 1}} {
		e := newEngine(t, cfg)
		require.NoError(t, e.Store("w", blocks))
		require.NoError(t, e.Barrier(ctx))
		m, err := e.FindMatches(ctx, content, nil)
		require.NoError(t, err)
		require.Len(t, m, 1)
		require.Equal(t, 40, m[0].Score)
		st := e.Stats()
		require.Zero(t, st.QueryRounds, "%+v", cfg)
		require.Zero(t, st.QueryProbes, "%+v", cfg)
	}
}
