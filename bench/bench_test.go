package bench

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvindex/kvindex/engine"
	"github.com/kvindex/kvindex/internal/replay"
)

// benchWorkload is the benchmarks' op stream: the trace-driven conformance log where the
// shared logs are present (KVINDEX_CONFORMANCE=DIR overrides where), else the built-in
// workload. It is loaded once per process.
var benchWorkload = sync.OnceValues(func() (*Workload, error) {
	dir := filepath.Join("..", "..", "shared", "conformance")
	if d := os.Getenv("KVINDEX_CONFORMANCE"); d != "" {
		dir = d
	}
	path := filepath.Join(dir, "trace_conversation.jsonl")
	if _, err := os.Stat(path); err != nil {
		return Builtin(1, 60000), nil
	}
	return ReadWorkload(path)
})

func loadBenchWorkload(b *testing.B) *Workload {
	w, err := benchWorkload()
	if err != nil {
		b.Fatal(err)
	}
	return w
}

var benchShards = []int{1, 2, 4, 8}

// memoryOnce caches MeasureMemory per implementation: it costs a pass and two GCs.
var memoryOnce sync.Map // impl name -> MemoryResult

// BenchmarkEvents applies the stream's events, one per b.N iteration, from P producer
// goroutines that own disjoint workers. Every time the stream runs out the index is
// replaced by a fresh one (untimed); the Sync at the end of each pass is timed.
func BenchmarkEvents(b *testing.B) {
	w := loadBenchWorkload(b)
	b.Logf("workload %s: %d events, %d block ops", w.Name, len(w.Events), w.BlockOps)
	for _, impl := range Impls(benchShards) {
		for _, p := range []int{1, 2} {
			b.Run(fmt.Sprintf("impl=%s/producers=%d", impl.Name, p), func(b *testing.B) {
				benchEvents(b, impl, w, p)
			})
		}
	}
}

// BenchmarkEventsCoalesced is BenchmarkEvents, one producer, on the stream's coalesced
// events (Workload.Coalesced: the calls of the peer drivers' coalesced replay).
func BenchmarkEventsCoalesced(b *testing.B) {
	w := loadBenchWorkload(b).Coalesced()
	b.Logf("workload %s coalesced: %d events, %d block ops", w.Name, len(w.Events), w.BlockOps)
	for _, impl := range Impls(benchShards) {
		b.Run("impl="+impl.Name, func(b *testing.B) { benchEvents(b, impl, w, 1) })
	}
}

func benchEvents(b *testing.B, impl Impl, w *Workload, p int) {
	parts := w.partition(p)
	var blockOps int64
	b.ReportAllocs()
	b.ResetTimer()
	for done := 0; done < b.N; {
		n := min(b.N-done, len(w.Events))
		b.StopTimer()
		if n == len(w.Events) {
			blockOps += w.BlockOps
		} else {
			for i := range w.Events[:n] {
				blockOps += int64(len(w.Events[i].Blocks) + len(w.Events[i].Seqs))
			}
		}
		idx, err := impl.New()
		if err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
		if _, err := applyPass(idx, w, parts, n); err != nil {
			b.Fatal(err)
		}
		b.StopTimer()
		idx.Close()
		b.StartTimer()
		done += n
	}
	b.StopTimer()
	if secs := b.Elapsed().Seconds(); secs > 0 {
		b.ReportMetric(float64(b.N)/secs, "events/s")
		b.ReportMetric(float64(blockOps)/secs, "blockops/s")
	}
	if p == 1 {
		m, ok := memoryOnce.Load(impl.Name)
		if !ok {
			r, err := MeasureMemory(impl, w)
			if err != nil {
				b.Fatal(err)
			}
			m, _ = memoryOnce.LoadOrStore(impl.Name, r)
		}
		b.ReportMetric(m.(MemoryResult).BytesPerMembership, "B/membership")
	}
}

// BenchmarkQueriesUnderLoad issues b.N of the stream's queries from two goroutines while a
// streamer applies the events in a loop (the first loop, which fills the index, is not
// timed; the streamer stops when the queries are done). It reports the latency
// percentiles and the streamer's rate. Allocations include the streamer's.
func BenchmarkQueriesUnderLoad(b *testing.B) {
	w := loadBenchWorkload(b)
	for _, impl := range Impls(benchShards) {
		b.Run("impl="+impl.Name, func(b *testing.B) {
			benchQueriesUnderLoad(b, impl, w, 2)
		})
	}
}

func benchQueriesUnderLoad(b *testing.B, impl Impl, w *Workload, queriers int) {
	if len(w.Queries) == 0 {
		b.Skip("SKIP: the workload has no queries")
	}
	idx, err := impl.New()
	if err != nil {
		b.Fatal(err)
	}
	defer idx.Close()
	st := &streamer{idx: idx, w: w, warm: make(chan struct{}), start: make(chan struct{})}
	var swg sync.WaitGroup
	swg.Go(func() { st.run(1 << 30) }) // bounded by the query side, which stops it
	<-st.warm
	var next atomic.Int64
	lats := make([][]int64, queriers)
	errs := make([]error, queriers)
	var wg sync.WaitGroup
	b.ReportAllocs()
	b.ResetTimer()
	close(st.start)
	for g := range queriers {
		wg.Go(func() {
			var dst []engine.Match
			for {
				k := int(next.Add(1) - 1)
				if k >= b.N || st.done.Load() {
					return
				}
				q := w.Queries[k%len(w.Queries)]
				t := time.Now()
				dst, errs[g] = idx.FindMatches(q, dst[:0])
				lats[g] = append(lats[g], time.Since(t).Nanoseconds())
				if errs[g] != nil {
					return
				}
			}
		})
	}
	wg.Wait()
	b.StopTimer()
	events := st.events.Load()
	st.stop.Store(true)
	swg.Wait()
	for _, err := range append(errs, st.err) {
		if err != nil {
			b.Fatal(err)
		}
	}
	all := slices.Concat(lats...)
	secs := b.Elapsed().Seconds()
	if secs > 0 {
		b.ReportMetric(float64(len(all))/secs, "queries/s")
		b.ReportMetric(float64(events)/secs, "events/s")
	}
	b.ReportMetric(float64(replay.Percentile(all, 0.50)), "p50-ns")
	b.ReportMetric(float64(replay.Percentile(all, 0.99)), "p99-ns")
	b.ReportMetric(float64(replay.Percentile(all, 0.999)), "p999-ns")
}
