package engine_test

import (
	"bytes"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kvindex/kvindex/engine"
	"github.com/kvindex/kvindex/engine/internal/worker"
)

// TestSegmentLimit lowers the number of segments a worker's table may name (each
// one-block root is a segment of its own) and checks that a store, a copy and a restore
// that could pass it are refused with the engine's errors, changing nothing, and that
// removals make room again. The real limit, worker.MaxSegments (2^26 - 1), takes tens of
// millions of one-block chains on one tier to reach.
func TestSegmentLimit(t *testing.T) {
	defer worker.SetSegLimitForTest(21)()
	e := newEngine(t, engine.Config{LockedIndex: true})
	stored := 0
	var err error
	for i := 0; err == nil && i < 100; i++ {
		if err = e.Store("w", []engine.Block{{Content: uint64(1000 + i), Seq: uint64(i + 1)}}); err == nil {
			stored++
		}
	}
	require.ErrorIs(t, err, engine.ErrInvalidEvent)
	require.Equal(t, 19, stored, "a store is taken while its blocks' segments, two each at most, fit")
	require.Equal(t, int64(stored), e.Stats().Blocks, "the refused store changed nothing")
	require.Equal(t, uint64(1), e.Stats().RejectedInvalid)

	seqs := func(n int) []uint64 {
		s := make([]uint64, n)
		for i := range s {
			s[i] = uint64(i + 1)
		}
		return s
	}
	require.ErrorIs(t, e.Apply(&engine.Event{Kind: engine.EventCopied, Worker: "w", Tier: engine.TierHost, Seqs: seqs(11)}), engine.ErrInvalidEvent)
	require.Equal(t, int64(stored), e.Stats().Blocks)
	require.NoError(t, e.Apply(&engine.Event{Kind: engine.EventCopied, Worker: "w", Tier: engine.TierHost, Seqs: seqs(3)}))
	require.Equal(t, int64(stored+3), e.Stats().Blocks)

	require.NoError(t, e.Remove("w", 1, 2, 3))
	require.NoError(t, e.Store("w", []engine.Block{{Content: 5000, Seq: 5000}}), "removals made room")

	var snap bytes.Buffer
	require.NoError(t, e.WriteSnapshot(&snap))
	defer worker.SetSegLimitForTest(10)()
	_, err = engine.Restore(engine.Config{LockedIndex: true}, bytes.NewReader(snap.Bytes()), 0)
	require.ErrorIs(t, err, engine.ErrSnapshot)
}
