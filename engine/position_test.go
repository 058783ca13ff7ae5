package engine_test

import (
	"bytes"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kvindex/kvindex/engine"
	"github.com/kvindex/kvindex/internal/invariants"
)

// TestPosition: an event with a cursor sets the worker's position (cursor and mark); one
// without leaves it; a clear or removal sets it whatever it carries, so a made-up clear
// (Cursor 0) leaves no position to resume from. Snapshots keep positions.
func TestPosition(t *testing.T) {
	e := newEngine(t, engine.Config{Shards: 2})
	store := func(w string, seq, cursor, mark uint64) {
		t.Helper()
		require.NoError(t, e.Apply(&engine.Event{Kind: engine.EventStored, Worker: w,
			Blocks: []engine.Block{{Content: seq, Seq: seq}}, Cursor: cursor, Mark: mark}))
	}
	store("a", 1, 10, 100)
	store("a", 2, 0, 0) // no cursor: the position stays
	store("b", 3, 20, 200)
	store("c", 4, 30, 300)
	require.NoError(t, e.Apply(&engine.Event{Kind: engine.EventCleared, Worker: "b"}))
	require.NoError(t, e.Apply(&engine.Event{Kind: engine.EventCleared, Worker: "c", Cursor: 31, Mark: 301}))
	want := map[string]engine.Position{"a": {10, 100}, "b": {}, "c": {31, 301}}
	require.Equal(t, want, e.Positions())
	require.Equal(t, map[string]uint64{"a": 10, "b": 0, "c": 31}, e.Cursors())
	var snap bytes.Buffer
	require.NoError(t, e.WriteSnapshot(&snap))
	r, err := engine.RestoreBytes(engine.Config{Shards: 1}, snap.Bytes())
	require.NoError(t, err)
	defer r.Close()
	require.Equal(t, want, r.Positions())
}

// TestSnapshotCutsPositionWithBlocks: while a producer applies one block per event,
// event i carrying cursor i and mark 3i, snapshots written concurrently each hold, for
// the worker, exactly the blocks of the events up to its cursor, and its mark: one
// consistent cut, taken under the worker's lock.
func TestSnapshotCutsPositionWithBlocks(t *testing.T) {
	e := newEngine(t, engine.Config{Shards: 2})
	n := uint64(3000)
	if invariants.Enabled {
		n = 1000 // each event recounts the worker's tables: n^2
	}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := uint64(1); i <= n; i++ {
			ev := engine.Event{Kind: engine.EventStored, Worker: "w", Parent: i - 1, HasParent: i > 1,
				Blocks: []engine.Block{{Content: i, Seq: i}}, Cursor: i, Mark: 3 * i}
			if err := e.Apply(&ev); err != nil {
				panic(err)
			}
		}
	}()
	var snaps [][]byte
	for len(snaps) < 40 {
		var b bytes.Buffer
		require.NoError(t, e.WriteSnapshot(&b))
		snaps = append(snaps, b.Bytes())
	}
	wg.Wait()
	for _, s := range snaps {
		r, err := engine.RestoreBytes(engine.Config{Shards: 1}, s)
		require.NoError(t, err)
		p := r.Positions()["w"]
		require.Equal(t, 3*p.Cursor, p.Mark)
		require.Equal(t, int64(p.Cursor), r.Stats().Blocks, "blocks of the events up to the cursor")
		r.Close()
	}
}

// TestNameLimits: the engine refuses worker ids and namespaces over their bounds; names
// at the bounds snapshot and restore (the writer never emits what the reader refuses),
// and a snapshot naming a longer one is refused.
func TestNameLimits(t *testing.T) {
	e := newEngine(t, engine.Config{Shards: 1})
	blocks := []engine.Block{{Content: 1, Seq: 1}}
	longW, longNS := strings.Repeat("w", engine.MaxWorkerLen+1), strings.Repeat("n", engine.MaxNamespaceLen+1)
	require.ErrorIs(t, e.Apply(&engine.Event{Kind: engine.EventStored, Worker: longW, Blocks: blocks}), engine.ErrInvalidEvent)
	require.ErrorIs(t, e.Apply(&engine.Event{Kind: engine.EventStored, Worker: "w", Namespace: longNS, Blocks: blocks}), engine.ErrInvalidEvent)
	require.ErrorIs(t, e.Predict(ctx, longW, "", []uint64{1}, 0), engine.ErrInvalidEvent)
	require.ErrorIs(t, e.Predict(ctx, "w", longNS, []uint64{1}, 0), engine.ErrInvalidEvent)
	got, err := e.FindMatchesIn(ctx, longNS, []uint64{1}, nil)
	require.NoError(t, err)
	require.Empty(t, got)
	require.Equal(t, int64(0), e.Stats().Blocks)

	w, ns := longW[1:], longNS[1:]
	require.NoError(t, e.Apply(&engine.Event{Kind: engine.EventStored, Worker: w, Namespace: ns, Blocks: blocks}))
	var snap bytes.Buffer
	require.NoError(t, e.WriteSnapshot(&snap))
	r, err := engine.RestoreBytes(engine.Config{Shards: 1}, snap.Bytes())
	require.NoError(t, err)
	require.NoError(t, r.Barrier(ctx))
	got, err = r.FindMatchesIn(ctx, ns, []uint64{1}, nil)
	require.NoError(t, err)
	require.Len(t, got, 1)
	r.Close()

	for _, c := range []struct {
		namespaces []string
		worker     string
	}{{[]string{longNS}, "w"}, {nil, longW}} {
		_, err := engine.RestoreBytes(engine.Config{Shards: 1}, buildSnapshot(c.namespaces, []snapWorker{{name: c.worker}}))
		require.ErrorIs(t, err, engine.ErrSnapshot)
		require.ErrorContains(t, err, "limit")
	}
}
