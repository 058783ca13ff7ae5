package replay

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/kvindex/kvindex/engine"
	"github.com/kvindex/kvindex/internal/oplog"
	"github.com/kvindex/kvindex/internal/refmodel"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// conformanceDir finds the shared golden logs; they ship beside the repository, not in it.
func conformanceDir(t *testing.T) string {
	for _, d := range []string{"../../../shared/conformance", os.Getenv("KVINDEX_CONFORMANCE")} {
		if d == "" {
			continue
		}
		if m, _ := filepath.Glob(filepath.Join(d, "*.jsonl")); len(m) > 0 {
			return d
		}
	}
	t.Skip("SKIP: shared conformance logs not found (set KVINDEX_CONFORMANCE=DIR); conformance not checked")
	return ""
}

func loadLogs(t *testing.T) map[string][]oplog.Op {
	dir := conformanceDir(t)
	files, _ := filepath.Glob(filepath.Join(dir, "*.jsonl"))
	logs := map[string][]oplog.Op{}
	for _, f := range files {
		if testing.Short() && filepath.Base(f) == "trace_conversation.jsonl" {
			continue
		}
		fh, err := os.Open(f)
		require.NoError(t, err)
		ops, err := oplog.ReadAll(fh)
		fh.Close()
		require.NoError(t, err, f)
		logs[filepath.Base(f)] = ops
	}
	return logs
}

// TestConformance replays every golden log at shard counts 1 and 4 and jump sizes 1, 4
// and 64: every expected answer must match exactly.
func TestConformance(t *testing.T) {
	logs := loadLogs(t)
	for name, ops := range logs {
		for _, shards := range []int{1, 4} {
			for _, jump := range []int{1, 4, 64} {
				t.Run(fmt.Sprintf("%s/shards=%d/jump=%d", name, shards, jump), func(t *testing.T) {
					t.Parallel()
					// Alternate between per-event calls and ApplyBatch.
					batch := (shards+jump)%2 == 0
					res, err := Run(context.Background(), ops, Options{Config: engine.Config{Shards: shards, JumpSize: jump}, Batch: batch})
					require.NoError(t, err)
					require.Zero(t, res.Failed, "mismatches:\n%v", res.Mismatches)
					require.Positive(t, res.Passed)
				})
			}
		}
	}
}

// TestReferenceModelConformance checks the reference model itself against the golden
// logs, so the differential tests compare the engine with something known to be right.
func TestReferenceModelConformance(t *testing.T) {
	for name, ops := range loadLogs(t) {
		m := refmodel.New()
		for _, op := range ops {
			if op.Kind != oplog.Query {
				_ = m.Apply(&op)
				continue
			}
			if !op.HasExpect {
				continue
			}
			got := map[string]int{}
			sizes := map[string]int{}
			for _, a := range m.Query(op.Content) {
				got[a.Worker], sizes[a.Worker] = a.Score, a.Size
			}
			require.Equal(t, op.Expect, got, "%s line %d", name, op.Line)
			require.Equal(t, op.Sizes, sizes, "%s line %d", name, op.Line)
		}
	}
}
