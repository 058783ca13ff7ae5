package refmodel

import (
	"bytes"
	"errors"
	"os"
	"testing"

	"github.com/kvindex/kvindex/internal/oplog"
	"github.com/stretchr/testify/require"
)

// TestSpecHybridExample is SPEC's worked example: the full group holding ends 1..8, the
// window group (lookback 2) ends 3, 4, 7, 8 and the Mamba group (span 4) end 4 only: the
// query q[0..8) scores 4, as cuts are multiples of 4 and cut 8 needs a state at 8.
func TestSpecHybridExample(t *testing.T) {
	m := New()
	require.NoError(t, m.Groups("w1", 16, []oplog.GroupSpec{
		{Kind: "full", BlockSize: 16}, {Kind: "sliding_window", BlockSize: 16, Window: 33, HasWindow: true}, {Kind: "mamba", BlockSize: 64},
	}))
	q := []uint64{10, 11, 12, 13, 14, 15, 16, 17}
	full := make([][2]uint64, len(q))
	for i := range q {
		full[i] = [2]uint64{q[i], uint64(i + 1)}
	}
	require.NoError(t, m.StoredIn("w1", 0, 0, 0, false, full, nil))
	// The window group: ends 3, 4, 7, 8 only.
	for _, e := range []int{3, 4, 7, 8} {
		blocks := make([][2]uint64, 0, e)
		for i := 0; i < e; i++ {
			blocks = append(blocks, [2]uint64{q[i], uint64(1000*e + i)})
		}
		require.NoError(t, m.StoredIn("w1", 1, 0, 0, false, blocks, nil))
		var drop []uint64
		for i := 0; i < e-1; i++ {
			drop = append(drop, uint64(1000*e+i))
		}
		m.RemovedIn("w1", 1, 0, drop)
	}
	require.NoError(t, m.StoredIn("w1", 2, 0, 0, false, [][2]uint64{{q[0], 9}}, [][]uint64{q[:4]}))
	got := m.Query(q)
	require.Len(t, got, 1)
	require.Equal(t, 4, got[0].Score)
	require.Equal(t, 8+4+1, got[0].Size)
}

func TestGroupsRejections(t *testing.T) {
	full := oplog.GroupSpec{Kind: "full", BlockSize: 16}
	for name, specs := range map[string][]oplog.GroupSpec{
		"empty":           {},
		"unknown kind":    {{Kind: "linear", BlockSize: 16}},
		"not a multiple":  {full, {Kind: "full", BlockSize: 24}},
		"zero block size": {{Kind: "full", BlockSize: 0}},
		"window missing":  {full, {Kind: "sliding_window", BlockSize: 16}},
		"window zero":     {full, {Kind: "sliding_window", BlockSize: 16, Window: 0, HasWindow: true}},
		"window on mamba": {{Kind: "mamba", BlockSize: 16, Window: 8, HasWindow: true}},
		"window on full":  {{Kind: "full", BlockSize: 16, Window: 8, HasWindow: true}},
	} {
		t.Run(name, func(t *testing.T) {
			m := New()
			require.NoError(t, m.Stored("w", 0, false, [][2]uint64{{1, 1}}))
			require.ErrorIs(t, m.Groups("w", 16, specs), ErrInvalidEvent)
			got := m.Query([]uint64{1})
			require.Len(t, got, 1, "a rejected declaration changes nothing")
		})
	}
	m := New()
	require.ErrorIs(t, m.Groups("w", 0, []oplog.GroupSpec{full}), ErrInvalidEvent, "unit 0")
	require.ErrorIs(t, m.StoredIn("w", 1, 0, 0, false, [][2]uint64{{1, 1}}, nil), ErrInvalidEvent, "undeclared group")
	require.NoError(t, m.Groups("w", 16, []oplog.GroupSpec{full, {Kind: "mamba", BlockSize: 32}}))
	require.ErrorIs(t, m.StoredIn("w", 1, 0, 0, false, [][2]uint64{{1, 1}}, nil), ErrInvalidEvent, "one content for a span of 2")
	require.ErrorIs(t, m.StoredIn("w", 2, 0, 7, true, [][2]uint64{{1, 1}}, nil), ErrInvalidEvent, "undeclared group, before the parent")
	require.ErrorIs(t, m.StoredIn("w", 1, 0, 7, true, [][2]uint64{{1, 1}}, [][]uint64{{1, 2}}), ErrParentNotFound)
	require.Equal(t, 1, m.RemovedIn("w", 5, 0, []uint64{1}), "an undeclared group skips every seq")
}

// TestHybridConformanceLog replays the shared hybrid log: every answer equals the
// model's, and the model rejects what the log's table says the contract rejects.
func TestHybridConformanceLog(t *testing.T) {
	const path = "../../../shared/conformance/hybrid/hybrid.jsonl"
	data, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		t.Skipf("SKIP: %s not found: the hybrid log is not checked", path)
	}
	require.NoError(t, err)
	ops, err := oplog.ReadAll(bytes.NewReader(data))
	require.NoError(t, err)
	m := New()
	var rejectedStores, rejectedGroups, queries int
	for i := range ops {
		op := &ops[i]
		if op.Kind != oplog.Query {
			if err := m.Apply(op); err != nil {
				require.True(t, errors.Is(err, ErrInvalidEvent) || errors.Is(err, ErrParentNotFound), "line %d: %v", op.Line, err)
				if op.Kind == oplog.Groups {
					rejectedGroups++
				} else {
					rejectedStores++
				}
			}
			continue
		}
		queries++
		want := *op
		m.Expect(op)
		require.Equal(t, want.Expect, op.Expect, "line %d", op.Line)
		require.Equal(t, want.Sizes, op.Sizes, "line %d", op.Line)
	}
	require.Equal(t, 83, queries)
	require.Equal(t, 9, rejectedStores)
	require.Equal(t, 4, rejectedGroups)
}
