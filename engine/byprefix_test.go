package engine_test

import (
	"testing"

	"github.com/kvindex/kvindex/engine"
	"github.com/stretchr/testify/require"
)

// FindMatchesByPrefix is held to the reference model by differentialSteps on every
// engine that runs SPEC's chain (TestDifferential, TestDifferentialTiers,
// TestDifferentialPredictions, TestDifferentialHybrid: every shard count and jump, and
// the locked index), and to zero allocations by TestFindMatchesZeroAllocs.

// TestFindMatchesByPrefixNeedsSpecChain: on the keyed chain a query by prefix hashes
// is refused (its prefixes are the engine's secret), not answered wrongly.
func TestFindMatchesByPrefixNeedsSpecChain(t *testing.T) {
	e := newEngine(t, engine.Config{Shards: 1})
	require.False(t, e.SpecChain())
	require.NoError(t, e.Store("w", []engine.Block{{Content: 1, Seq: 1}}))
	require.NoError(t, e.Barrier(ctx))
	got, err := e.FindMatchesByPrefix(ctx, []uint64{1}, nil)
	require.ErrorIs(t, err, engine.ErrNotSpecChain)
	require.Empty(t, got)
	s := newEngine(t, engine.Config{Shards: 1, SpecChain: true})
	require.True(t, s.SpecChain())
}
