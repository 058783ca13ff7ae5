package engine

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kvindex/kvindex/internal/oplog"
	"github.com/kvindex/kvindex/internal/testsize"
)

// TestPartitionBalance replays the trace-driven conformance log on engines of 2, 4 and 8
// shards and reads each shard's work from Stats: the deltas it applied and the query
// positions it answered. The busiest shard's total work (deltas + positions) must stay
// within 1.1x of the mean: single hot keys (position 0 of the prefix every request
// shares) cannot be split, but they are a few percent of the work. It logs the table
// DESIGN.md ("Shards own keys, hashed") shows, where the partitions by position and by
// stride that were measured against this one, and not kept, are given too.
func TestPartitionBalance(t *testing.T) {
	if !testsize.Full() {
		t.Skip("sequential: the race detector adds nothing; make race runs it without the detector, make test-long with it")
	}
	path := filepath.Join("..", "..", "shared", "conformance", "trace_conversation.jsonl")
	f, err := os.Open(path)
	if err != nil {
		t.Skip("SKIP: trace_conversation.jsonl not found; partition balance not measured")
	}
	ops, err := oplog.ReadAll(f)
	f.Close()
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	var b strings.Builder
	fmt.Fprintf(&b, "| shards | deltas per shard | max/mean | positions per shard | max/mean |\n|---:|---|---:|---|---:|\n")
	for _, s := range []int{2, 4, 8} {
		e, err := New(Config{Shards: s})
		if err != nil {
			t.Fatal(err)
		}
		for i := range ops {
			if ops[i].Kind == oplog.Query {
				if _, err := e.FindMatches(ctx, ops[i].Content, nil); err != nil {
					t.Fatal(err)
				}
				continue
			}
			ev := ceilingEvent(&ops[i])
			if err := e.Apply(&ev); err != nil && !IsRejection(err) {
				t.Fatal(err)
			}
		}
		if err := e.Barrier(ctx); err != nil {
			t.Fatal(err)
		}
		st := e.Stats()
		e.Close()
		deltas, probes, total := make([]uint64, s), make([]uint64, s), make([]uint64, s)
		for i, sh := range st.Shards {
			deltas[i], probes[i] = sh.Applied, sh.Probes
			total[i] = sh.Applied + sh.Probes
		}
		fmt.Fprintf(&b, "| %d | %v | %.2f | %v | %.2f |\n", s, deltas, skew(deltas), probes, skew(probes))
		if m := skew(total); m > 1.1 {
			t.Errorf("partition unbalanced at %d shards: total work max/mean %.2f", s, m)
		}
	}
	t.Logf("\n%s", b.String())
}

// skew returns max/mean of c.
func skew(c []uint64) float64 {
	var mx, sum uint64
	for _, v := range c {
		mx, sum = max(mx, v), sum+v
	}
	return float64(mx) * float64(len(c)) / float64(max(sum, 1))
}
