package engine_test

import (
	"testing"

	"github.com/kvindex/kvindex/engine"
	"github.com/stretchr/testify/require"
)

func TestNamespaces(t *testing.T) {
	e := newEngine(t, engine.Config{Shards: 3, JumpSize: 2})
	chain := func(seq0 uint64, contents ...uint64) []engine.Block {
		out := make([]engine.Block, len(contents))
		for i, c := range contents {
			out[i] = engine.Block{Content: c, Seq: seq0 + uint64(i)}
		}
		return out
	}
	// The same content on three workers, in three namespaces.
	require.NoError(t, e.Store("base", chain(100, 1, 2, 3, 4)))
	require.NoError(t, e.Apply(&engine.Event{Kind: engine.EventStored, Worker: "lora", Namespace: "lora=a", Blocks: chain(200, 1, 2, 3, 4)}))
	require.NoError(t, e.Apply(&engine.Event{Kind: engine.EventStored, Worker: "both", Namespace: "lora=a", Blocks: chain(300, 1, 2)}))
	require.NoError(t, e.Store("both", chain(400, 1, 2, 3)))
	// A parent held in another namespace is not a parent here.
	err := e.Apply(&engine.Event{Kind: engine.EventStored, Worker: "both", Namespace: "lora=a", Parent: 402, HasParent: true, Blocks: chain(500, 4)})
	require.ErrorIs(t, err, engine.ErrParentNotFound)
	require.NoError(t, e.Apply(&engine.Event{Kind: engine.EventStored, Worker: "both", Namespace: "lora=a", Parent: 301, HasParent: true, Blocks: chain(302, 3)}))
	require.NoError(t, e.Barrier(ctx))

	q := []uint64{1, 2, 3, 4}
	got, err := e.FindMatches(ctx, q, nil)
	require.NoError(t, err)
	require.Equal(t, []engine.Match{{Worker: "base", Score: 4, Size: 4, Tiers: [3]int{4, 4, 4}}, {Worker: "both", Score: 3, Size: 6, Tiers: [3]int{3, 3, 3}}}, got)
	got, err = e.FindMatchesIn(ctx, "lora=a", q, nil)
	require.NoError(t, err)
	require.Equal(t, []engine.Match{{Worker: "lora", Score: 4, Size: 4, Tiers: [3]int{4, 4, 4}}, {Worker: "both", Score: 3, Size: 6, Tiers: [3]int{3, 3, 3}}}, got)
	got, err = e.FindMatchesIn(ctx, "never-stored", q, nil)
	require.NoError(t, err)
	require.Empty(t, got)
	got, err = e.FindMatchesIn(ctx, "", q, nil)
	require.NoError(t, err)
	require.Len(t, got, 2, `"" is the default namespace`)

	// A seq re-stored in another namespace moves there (last write wins).
	require.NoError(t, e.Store("lora", chain(200, 1)))
	require.NoError(t, e.Barrier(ctx))
	got, err = e.FindMatchesIn(ctx, "lora=a", q, nil)
	require.NoError(t, err)
	require.Equal(t, []engine.Match{{Worker: "both", Score: 3, Size: 6, Tiers: [3]int{3, 3, 3}}}, got, "lora lost its namespaced root")
	got, err = e.FindMatches(ctx, q, nil)
	require.NoError(t, err)
	require.Contains(t, got, engine.Match{Worker: "lora", Score: 1, Size: 4, Tiers: [3]int{1, 1, 1}})

	require.ErrorIs(t, e.Apply(&engine.Event{Kind: 99, Worker: "x"}), engine.ErrInvalidEvent)
}
