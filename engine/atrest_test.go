package engine

import (
	"context"
	"fmt"
	"testing"

	"github.com/kvindex/kvindex/internal/oplog"
)

// BenchmarkTraceQueriesAtRest loads the trace-driven log (KVINDEX_OPS names another)
// and then answers its queries in a loop against the final state, with no events: the
// query path alone, warm. ns/op is per query.
func BenchmarkTraceQueriesAtRest(b *testing.B) {
	ops := ceilingOps(b)
	for _, cfg := range []Config{{LockedIndex: true}, {Shards: 1}, {Shards: 2}} {
		b.Run(fmt.Sprintf("locked=%v/shards=%d", cfg.LockedIndex, cfg.WithDefaults().Shards), func(b *testing.B) {
			e, err := New(cfg)
			if err != nil {
				b.Fatal(err)
			}
			defer e.Close()
			var queries [][]uint64
			for i := range ops {
				if ops[i].Kind == oplog.Query {
					queries = append(queries, ops[i].Content)
					continue
				}
				ev := ceilingEvent(&ops[i])
				if err := e.Apply(&ev); err != nil && !IsRejection(err) {
					b.Fatal(err)
				}
			}
			ctx := context.Background()
			if err := e.Barrier(ctx); err != nil {
				b.Fatal(err)
			}
			var dst []Match
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				if dst, err = e.FindMatches(ctx, queries[i%len(queries)], dst[:0]); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
