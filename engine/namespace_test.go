package engine_test

import (
	"bytes"
	"strconv"
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

// TestManyNamespacesOnOneWorker stores one chain on one worker in more namespaces than a
// key record numbers inline (the worker's 255th and later are kept in its side table),
// removes some of them, and checks every namespace's answer, before and after a
// snapshot round trip.
func TestManyNamespacesOnOneWorker(t *testing.T) {
	const spaces = 300
	e := newEngine(t, engine.Config{Shards: 2, JumpSize: 2})
	name := func(i int) string { return "lora-" + strconv.Itoa(i) }
	seq := func(i, j int) uint64 { return uint64(i*10 + j + 1) }
	held := map[uint64]bool{1 << 40: true, 1<<40 + 1: true} // the default namespace's chain
	for i := range spaces {
		blocks := []engine.Block{{Content: 1, Seq: seq(i, 0)}, {Content: 2, Seq: seq(i, 1)}, {Content: 3, Seq: seq(i, 2)}}
		require.NoError(t, e.Apply(&engine.Event{Kind: engine.EventStored, Worker: "w", Namespace: name(i), Blocks: blocks}))
		held[seq(i, 0)], held[seq(i, 1)], held[seq(i, 2)] = true, true, true
		if i%3 == 0 {
			held[seq(i, 3)] = true
			require.NoError(t, e.Apply(&engine.Event{Kind: engine.EventStored, Worker: "w", Namespace: name(i),
				Parent: seq(i, 2), HasParent: true, Blocks: []engine.Block{{Content: 4, Seq: seq(i, 3)}}}))
		}
	}
	require.NoError(t, e.Store("w", []engine.Block{{Content: 5, Seq: 1 << 40}, {Content: 6, Seq: 1<<40 + 1}}))
	for i := 0; i < spaces; i += 7 {
		require.NoError(t, e.Remove("w", seq(i, 1))) // a gap at position 1
		delete(held, seq(i, 1))
	}
	for i := 5; i < spaces; i += 11 {
		require.NoError(t, e.Remove("w", seq(i, 3), seq(i, 2), seq(i, 1), seq(i, 0))) // all of it
		for j := range 4 {
			delete(held, seq(i, j))
		}
	}
	check := func(e *engine.Engine) {
		t.Helper()
		require.NoError(t, e.Barrier(ctx))
		for i := range spaces {
			want := 3
			if i%3 == 0 {
				want = 4
			}
			if i%7 == 0 {
				want = 1
			}
			got, err := e.FindMatchesIn(ctx, name(i), []uint64{1, 2, 3, 4}, nil)
			require.NoError(t, err)
			if i%11 == 5 {
				require.Empty(t, got, "namespace %d", i)
				continue
			}
			require.Len(t, got, 1, "namespace %d", i)
			require.Equal(t, want, got[0].Score, "namespace %d", i)
		}
		got, err := e.FindMatches(ctx, []uint64{1, 2, 3}, nil)
		require.NoError(t, err)
		require.Empty(t, got, "not in the default namespace")
		got, err = e.FindMatches(ctx, []uint64{5, 6}, nil)
		require.NoError(t, err)
		require.Len(t, got, 1)
		require.Equal(t, "w", got[0].Worker)
		require.Equal(t, 2, got[0].Score)
		require.Equal(t, len(held), got[0].Size)
	}
	check(e)
	var buf bytes.Buffer
	require.NoError(t, e.WriteSnapshot(&buf))
	r, err := engine.RestoreBytes(engine.Config{Shards: 3}, buf.Bytes())
	require.NoError(t, err)
	defer r.Close()
	check(r)
}
