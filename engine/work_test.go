package engine_test

import (
	"runtime"
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
	blocks, content := chain40()
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
	// pays no round trips and counts neither. A one-shard query that does not get the
	// shard's token (its goroutine descheduled inside a slice, as under the race
	// detector on a loaded machine) runs jump search instead and says so in
	// WalkFallbacks: the test asks until one query walks, and checks that the rounds
	// and probes are exactly the fallbacks' (a fallback pays the jump search's one
	// round of 1 + 16 + 2 probes, as above).
	for _, cfg := range []engine.Config{{LockedIndex: true}, {Shards: 1}} {
		e := newEngine(t, cfg)
		engine.SetDenseLandings(e, 16)
		require.NoError(t, e.Store("w", blocks))
		require.NoError(t, e.Barrier(ctx))
		walked := false
		for try := 0; try < 1000 && !walked; try++ {
			before := e.Stats()
			m, err := e.FindMatches(ctx, content, nil)
			require.NoError(t, err)
			require.Len(t, m, 1)
			require.Equal(t, 40, m[0].Score)
			st := e.Stats()
			fell := st.WalkFallbacks - before.WalkFallbacks
			require.LessOrEqual(t, fell, uint64(1), "%+v", cfg)
			if cfg.LockedIndex {
				require.Zero(t, fell, "the locked index always walks")
			}
			require.Equal(t, fell, st.QueryRounds-before.QueryRounds, "%+v", cfg)
			require.Equal(t, fell*(1+16+2), st.QueryProbes-before.QueryProbes, "%+v", cfg)
			walked = fell == 0
		}
		require.True(t, walked, "%+v: no query walked in 1,000", cfg)
	}
}

// TestWalkFallback: a one-shard query that cannot get the shard's token runs jump
// search (one round of 1 + 16 + 2 probes on this chain), answers the same, and counts
// the fallback. The test holds the token until the query has counted its fallback (the
// query's batch then waits in the shard's channel for the token), then lets it go.
func TestWalkFallback(t *testing.T) {
	blocks, content := chain40()
	e := newEngine(t, engine.Config{Shards: 1})
	engine.SetDenseLandings(e, 16)
	require.NoError(t, e.Store("w", blocks))
	require.NoError(t, e.Barrier(ctx))
	var release func()
	for ok := false; !ok; {
		release, ok = engine.HoldShard(e, 0) // (the shard may be inside a slice: try again)
	}
	type answer struct {
		m   []engine.Match
		err error
	}
	done := make(chan answer, 1)
	go func() {
		m, err := e.FindMatches(ctx, content, nil)
		done <- answer{m, err}
	}()
	for e.Stats().WalkFallbacks == 0 {
		runtime.Gosched()
	}
	release()
	a := <-done
	require.NoError(t, a.err)
	require.Len(t, a.m, 1)
	require.Equal(t, 40, a.m[0].Score)
	st := e.Stats()
	require.Equal(t, uint64(1), st.WalkFallbacks)
	require.Equal(t, uint64(1), st.QueryRounds)
	require.Equal(t, uint64(1+16+2), st.QueryProbes)
}

// chain40 is the 40-block chain of the work tests and its query.
func chain40() ([]engine.Block, []uint64) {
	blocks := make([]engine.Block, 40)
	content := make([]uint64, len(blocks))
	for i := range blocks {
		content[i] = uint64(1000 + i)
		blocks[i] = engine.Block{Content: content[i], Seq: uint64(i + 1)}
	}
	return blocks, content
}
