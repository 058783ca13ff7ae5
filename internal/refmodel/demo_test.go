package refmodel

import (
	"bytes"
	"flag"
	"math/rand/v2"
	"os"
	"testing"

	"github.com/kvindex/kvindex/internal/oplog"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var update = flag.Bool("update", false, "rewrite testdata/demo.jsonl and testdata/tiers.jsonl")

// DemoLog returns the op log the README's first command replays: a seeded random history
// whose every query carries the reference model's answer.
func demoLog() []byte {
	return expectedLog(RandomOps(rand.New(rand.NewPCG(2026, 11)), 3000, RandomOptions{Workers: 6, Alphabet: 4, MaxChain: 200}))
}

// expectedLog writes ops as a log whose every query carries the model's answer.
func expectedLog(ops []oplog.Op) []byte {
	m := New()
	var out []byte
	for i := range ops {
		op := &ops[i]
		if op.Kind == oplog.Query {
			m.Expect(op)
		} else {
			_ = m.Apply(op)
		}
		out = oplog.Append(out, *op)
	}
	return out
}

// tiersLog is testdata/tiers.jsonl: a seeded random history with host and disk events
// (stores, removals, copies) whose every query carries the model's answer with its
// per-tier lengths.
func tiersLog() []byte {
	return expectedLog(RandomOps(rand.New(rand.NewPCG(2026, 12)), 3000, RandomOptions{Workers: 4, Alphabet: 4, MaxChain: 120, Tiers: true}))
}

func TestTiersLogUpToDate(t *testing.T) {
	const path = "../../testdata/tiers.jsonl"
	want := tiersLog()
	if *update {
		require.NoError(t, os.WriteFile(path, want, 0o644))
	}
	got, err := os.ReadFile(path)
	require.NoError(t, err)
	require.True(t, bytes.Equal(want, got), "testdata/tiers.jsonl is stale: go test ./internal/refmodel -run TiersLog -update")
	require.Contains(t, string(got), `"medium":"host"`)
	require.Contains(t, string(got), `"op":"copied"`)
	require.Contains(t, string(got), `"tiers":{`)
}

// TestDemoLogUpToDate keeps the shipped demo log equal to what the generator and the
// model produce now; run with -update after changing either.
func TestDemoLogUpToDate(t *testing.T) {
	const path = "../../testdata/demo.jsonl"
	want := demoLog()
	if *update {
		require.NoError(t, os.WriteFile(path, want, 0o644))
	}
	got, err := os.ReadFile(path)
	require.NoError(t, err)
	require.True(t, bytes.Equal(want, got), "testdata/demo.jsonl is stale: go test ./internal/refmodel -run DemoLog -update")
}

func TestModelBasics(t *testing.T) {
	m := New()
	require.NoError(t, m.Stored("a", 0, false, [][2]uint64{{1, 10}, {2, 11}, {3, 12}}))
	require.ErrorIs(t, m.Stored("a", 99, true, [][2]uint64{{4, 13}}), ErrParentNotFound)
	require.ErrorIs(t, m.Stored("a", 10, true, [][2]uint64{{4, 10}}), ErrInvalidEvent)
	require.Equal(t, 1, m.Removed("a", []uint64{11, 77}))
	// No cascade: 12 stays held but is unreachable through the gap at position 1.
	require.Equal(t, []Answer{{"a", 1, 2, 0, [NumTiers]int{1, 1, 1}}}, m.Query([]uint64{1, 2, 3}))
	require.NoError(t, m.Stored("a", 10, true, [][2]uint64{{2, 14}}))
	require.Equal(t, []Answer{{"a", 3, 3, 0, [NumTiers]int{3, 3, 3}}}, m.Query([]uint64{1, 2, 3}))
	// Tiers: a host copy of 11 under 10 extends the device prefix; the host tier counts
	// from the device or host length on, and a removal names one tier.
	require.Equal(t, 0, m.RemovedOn("a", 0, []uint64{14}))
	require.NoError(t, m.StoredOn("a", 1, 10, true, [][2]uint64{{2, 14}}))
	require.Equal(t, []Answer{{"a", 3, 3, 0, [NumTiers]int{1, 3, 3}}}, m.Query([]uint64{1, 2, 3}))
	require.Equal(t, 1, m.RemovedOn("a", 2, []uint64{14}))
	require.NoError(t, m.StoredOn("a", 2, 0, false, [][2]uint64{{9, 20}}))
	require.Equal(t, []Answer{{"a", 1, 4, 0, [NumTiers]int{0, 0, 1}}}, m.Query([]uint64{9}))
	m.Cleared("a")
	sz, known := m.Size("a")
	require.True(t, known)
	require.Zero(t, sz)
	m.RemoveWorker("a")
	_, known = m.Size("a")
	require.False(t, known)
}
