package engine

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvindex/kvindex/internal/oplog"
)

// BenchmarkQueriesUnderIngest measures what a router's queries wait while events
// apply: one ingester goroutine applies a recorded op log (the conversation trace, or
// KVINDEX_OPS) in a loop, the events between two of its queries as one ApplyBatch, as
// serve's subscribers apply an engine's batches, each loop after the first preceded by
// a remove_worker per worker so that it means what the first did; meanwhile the
// benchmark's goroutine issues the log's queries and times each. It reports the
// queries' p50, p99 and p99.9 in ns and the events the ingester applied per second
// meanwhile. The first loop fills the index untimed.
func BenchmarkQueriesUnderIngest(b *testing.B) {
	ops := ceilingOps(b)
	in := newIngestLog(ops)
	for _, cfg := range []Config{{LockedIndex: true}, {Shards: 1}, {Shards: 2}} {
		b.Run(fmt.Sprintf("locked=%v/shards=%d", cfg.LockedIndex, cfg.WithDefaults().Shards), func(b *testing.B) {
			e, err := New(cfg)
			if err != nil {
				b.Fatal(err)
			}
			defer e.Close()
			if err := in.loop(e, nil, nil); err != nil { // the first loop fills the index
				b.Fatal(err)
			}
			var stop atomic.Bool
			var applied atomic.Int64
			var ingestErr error
			var wg sync.WaitGroup
			wg.Go(func() {
				for !stop.Load() {
					if ingestErr = in.loop(e, &stop, &applied); ingestErr != nil {
						return
					}
				}
			})
			ctx := context.Background()
			lat := make([]int64, 0, b.N)
			var dst []Match
			b.ResetTimer()
			t0 := time.Now()
			for i := 0; i < b.N; i++ {
				q := in.queries[i%len(in.queries)]
				t := time.Now()
				if dst, err = e.FindMatches(ctx, q, dst[:0]); err != nil {
					b.Fatal(err)
				}
				lat = append(lat, time.Since(t).Nanoseconds())
			}
			elapsed := time.Since(t0)
			b.StopTimer()
			stop.Store(true)
			wg.Wait()
			if ingestErr != nil {
				b.Fatal(ingestErr)
			}
			slices.Sort(lat)
			at := func(q float64) float64 { return float64(lat[int(q*float64(len(lat)-1))]) }
			b.ReportMetric(at(0.50), "p50-ns")
			b.ReportMetric(at(0.99), "p99-ns")
			b.ReportMetric(at(0.999), "p99.9-ns")
			b.ReportMetric(float64(applied.Load())/elapsed.Seconds(), "events/s")
		})
	}
}

// ingestLog is an op log split for BenchmarkQueriesUnderIngest: its events, the
// [lo, hi) ranges of events between two queries, its queries' contents, and one
// remove_worker per worker.
type ingestLog struct {
	events  []Event
	batches [][2]int
	queries [][]uint64
	resets  []Event
}

func newIngestLog(ops []oplog.Op) *ingestLog {
	in := &ingestLog{}
	seen := map[string]bool{}
	lo := 0
	for i := range ops {
		if ops[i].Kind == oplog.Query {
			in.queries = append(in.queries, ops[i].Content)
			if lo < len(in.events) {
				in.batches = append(in.batches, [2]int{lo, len(in.events)})
			}
			lo = len(in.events)
			continue
		}
		ev := ceilingEvent(&ops[i])
		in.events = append(in.events, ev)
		if !seen[ev.Worker] {
			seen[ev.Worker] = true
			in.resets = append(in.resets, Event{Kind: EventRemoveWorker, Worker: ev.Worker})
		}
	}
	if lo < len(in.events) {
		in.batches = append(in.batches, [2]int{lo, len(in.events)})
	}
	return in
}

// loop resets e's workers and applies every batch, until stop (when not nil) is set,
// counting the events in applied (when not nil). Rejections are answers of the
// contract, not failures.
func (in *ingestLog) loop(e *Engine, stop *atomic.Bool, applied *atomic.Int64) error {
	errs := make([]error, 0, 64)
	errs = e.ApplyBatch(in.resets, errs[:0])
	for _, r := range in.batches {
		if stop != nil && stop.Load() {
			return nil
		}
		errs = e.ApplyBatch(in.events[r[0]:r[1]], errs[:0])
		if applied != nil {
			applied.Add(int64(r[1] - r[0]))
		}
		for _, err := range errs {
			if err != nil && !IsRejection(err) {
				return err
			}
		}
	}
	return nil
}
