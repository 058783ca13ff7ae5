package engine_test

import (
	"runtime"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kvindex/kvindex/engine"
)

// TestDefaultIndexByCores pins the zero Config's choice of index to the cores it may use
// (Config.Shards): the locked index on one or two, one shard per core above, at most 8;
// and an explicit Shards or LockedIndex is never overridden.
func TestDefaultIndexByCores(t *testing.T) {
	for _, tc := range []struct {
		procs, shards int
		locked        bool
	}{
		{1, 1, true}, {2, 1, true}, {3, 3, false}, {4, 4, false}, {8, 8, false}, {16, 8, false}, {256, 8, false},
	} {
		shards, locked := engine.DefaultIndex(tc.procs)
		require.Equal(t, tc.shards, shards, "procs %d", tc.procs)
		require.Equal(t, tc.locked, locked, "procs %d", tc.procs)
		require.NoError(t, engine.Config{Shards: shards, LockedIndex: locked}.Validate(), "procs %d", tc.procs)
	}

	procs := runtime.GOMAXPROCS(0)
	wantShards, wantLocked := engine.DefaultIndex(procs)
	got := engine.Config{}.WithDefaults()
	require.Equal(t, wantShards, got.Shards, "GOMAXPROCS %d", procs)
	require.Equal(t, wantLocked, got.LockedIndex, "GOMAXPROCS %d", procs)

	for _, cfg := range []engine.Config{{Shards: 1}, {Shards: 2}, {Shards: 3}} {
		got := cfg.WithDefaults()
		require.False(t, got.LockedIndex, "Shards %d asks for shard goroutines", cfg.Shards)
		require.Equal(t, cfg.Shards, got.Shards)
	}
	got = engine.Config{LockedIndex: true}.WithDefaults()
	require.True(t, got.LockedIndex)
	require.Equal(t, 1, got.Shards)
}

// TestDefaultIndexRuns runs the zero Config at one, two and four cores (GOMAXPROCS at
// New) and checks that each engine answers a stored chain: the locked default and the
// sharded one both work end to end.
func TestDefaultIndexRuns(t *testing.T) {
	for _, procs := range []int{1, 2, 4} {
		prev := runtime.GOMAXPROCS(procs)
		e, err := engine.New(engine.Config{})
		runtime.GOMAXPROCS(prev)
		require.NoError(t, err)
		wantShards, wantLocked := engine.DefaultIndex(procs)
		require.Equal(t, wantLocked, e.Config().LockedIndex, "procs %d", procs)
		require.Equal(t, wantShards, e.Config().Shards, "procs %d", procs)
		require.NoError(t, e.Apply(&engine.Event{Kind: engine.EventStored, Worker: "w", Blocks: []engine.Block{{Seq: 1, Content: 11}, {Seq: 2, Content: 12}}}))
		require.NoError(t, e.Barrier(t.Context()))
		m, err := e.FindMatches(t.Context(), []uint64{11, 12, 13}, nil)
		require.NoError(t, err)
		require.Len(t, m, 1)
		require.Equal(t, 2, m[0].Score)
		require.NoError(t, e.Close())
	}
}
