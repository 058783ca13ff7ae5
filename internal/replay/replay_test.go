package replay

import (
	"context"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/kvindex/kvindex/engine"
	"github.com/kvindex/kvindex/internal/oplog"
	"github.com/kvindex/kvindex/internal/refmodel"
	"github.com/kvindex/kvindex/internal/testsize"
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

// logs caches the parsed golden logs: both tests read them, and under the race
// detector parsing them is a sixth of the package's time.
var logs struct {
	once sync.Once
	ops  map[string][]oplog.Op
	err  error
}

func loadLogs(t *testing.T) map[string][]oplog.Op {
	dir := conformanceDir(t)
	logs.once.Do(func() {
		files, _ := filepath.Glob(filepath.Join(dir, "*.jsonl"))
		logs.ops = map[string][]oplog.Op{}
		for _, f := range files {
			if filepath.Base(f) == traceLog && !testsize.Full() {
				continue // not even read: parsed, it is most of the race binary's 0.9 GB
			}
			fh, err := os.Open(f)
			if err != nil {
				logs.err = err
				return
			}
			ops, err := oplog.ReadAll(fh)
			fh.Close()
			if err != nil {
				logs.err = fmt.Errorf("%s: %w", f, err)
				return
			}
			logs.ops[filepath.Base(f)] = ops
		}
	})
	require.NoError(t, logs.err)
	out := maps.Clone(logs.ops)
	if testing.Short() {
		delete(out, traceLog)
	}
	return out
}

// traceLog is the largest golden log (19 MB, 40,000 queries): under the race detector
// or the invariant checks TestConformance skips it (a sequential replay the detector
// finds nothing in; with it the race binary peaked at 0.9 GB) and replays the other
// logs in four of six configurations (testsize; make test-long replays all six, and
// make conformance every log through the CLI at every shard count and jump without the
// detector).
const traceLog = "trace_conversation.jsonl"

// modelOpsUnderRace bounds the logs TestReferenceModelConformance checks under the race
// detector: the model is sequential, the detector finds nothing in it and makes it ten
// times slower. make test checks every log without the detector (Makefile, race).
const modelOpsUnderRace = 2000

// TestConformance replays every golden log at shard counts 1 and 4 and jump sizes 1, 4
// and 64: every expected answer must match exactly.
func TestConformance(t *testing.T) {
	logs := loadLogs(t)
	for name, ops := range logs {
		for _, shards := range []int{1, 4} {
			for _, jump := range []int{1, 4, 64} {
				if !testsize.Full() && shards == 1 && jump != 64 {
					// Under the race detector: one shard at the default jump (the jump
					// changes no goroutine's work).
					continue
				}
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
		if len(ops) > modelOpsUnderRace && !testsize.Full() {
			t.Logf("%s (%d ops) skipped under the race detector: make test checks it without", name, len(ops))
			continue
		}
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
