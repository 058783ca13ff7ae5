package replay

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/kvindex/kvindex/engine"
	"github.com/kvindex/kvindex/internal/oplog"
)

// BenchmarkTraceReplay replays the trace-driven conformance log (parsing excluded) and
// reports block ops per second; it skips where the shared logs are absent.
func BenchmarkTraceReplay(b *testing.B) {
	ops := loadTrace(b)
	for _, shards := range []int{1, 2, 4} {
		b.Run(fmt.Sprintf("shards=%d", shards), func(b *testing.B) {
			b.ReportAllocs()
			var blockOps int
			var secs float64
			for i := 0; i < b.N; i++ {
				res, err := Run(context.Background(), ops, Options{Config: engine.Config{Shards: shards}, Batch: true})
				if err != nil || res.Failed > 0 {
					b.Fatal(err, res.Mismatches)
				}
				blockOps += res.BlockOps
				secs += res.Seconds
			}
			b.ReportMetric(float64(blockOps)/secs/1e6, "Mblockops/s")
		})
	}
}

// BenchmarkTraceReplayLocked is the same replay on the LockedIndex baseline: everything
// on the calling goroutine, no hand-offs.
func BenchmarkTraceReplayLocked(b *testing.B) {
	ops := loadTrace(b)
	b.ReportAllocs()
	var blockOps int
	var secs float64
	for i := 0; i < b.N; i++ {
		res, err := Run(context.Background(), ops, Options{Config: engine.Config{LockedIndex: true}})
		if err != nil || res.Failed > 0 {
			b.Fatal(err, res.Mismatches)
		}
		blockOps += res.BlockOps
		secs += res.Seconds
	}
	b.ReportMetric(float64(blockOps)/secs/1e6, "Mblockops/s")
}

// loadTrace parses the trace-driven conformance log, or skips where it is absent.
func loadTrace(b *testing.B) []oplog.Op {
	dir := "../../../shared/conformance"
	if d := os.Getenv("KVINDEX_CONFORMANCE"); d != "" {
		dir = d
	}
	f, err := os.Open(filepath.Join(dir, "trace_conversation.jsonl"))
	if err != nil {
		b.Skip("SKIP: trace_conversation.jsonl not found")
	}
	defer f.Close()
	ops, err := oplog.ReadAll(f)
	if err != nil {
		b.Fatal(err)
	}
	return ops
}
