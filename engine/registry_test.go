package engine_test

import (
	"bytes"
	"fmt"
	"runtime"
	"testing"
	"time"

	"github.com/kvindex/kvindex/engine"
)

// BenchmarkWorkers creates 100,000 one-block workers, snapshots and restores 200,000,
// and removes them, reporting the seconds each phase takes and the heap each one-block
// worker costs (registry, worker state, tables and its one index entry). The per-worker
// overhead is that heap less the heap per block of one worker holding 100,000 root
// blocks: what a worker costs beyond the blocks it holds.
func BenchmarkWorkers(b *testing.B) {
	const n = 100_000
	names := make([]string, 2*n)
	for i := range names {
		names[i] = fmt.Sprintf("worker-%06d", i)
	}
	for _, cfg := range []engine.Config{{Shards: 2}, {LockedIndex: true}} {
		b.Run(fmt.Sprintf("shards=%d/locked=%v", cfg.WithDefaults().Shards, cfg.LockedIndex), func(b *testing.B) {
			perBlock := oneWorkerHeap(b, cfg, n)
			for it := 0; it < b.N; it++ {
				runtime.GC()
				var before, after runtime.MemStats
				runtime.ReadMemStats(&before)
				e := newEngine(b, cfg)
				t0 := time.Now()
				for i, name := range names[:n] {
					if err := e.Store(name, []engine.Block{{Content: uint64(i), Seq: uint64(i)}}); err != nil {
						b.Fatal(err)
					}
				}
				create := time.Since(t0)
				if err := e.Barrier(ctx); err != nil {
					b.Fatal(err)
				}
				runtime.GC()
				runtime.ReadMemStats(&after)
				perWorker := float64(int64(after.HeapAlloc)-int64(before.HeapAlloc)) / n
				t0 = time.Now()
				for _, name := range names[:n] {
					if err := e.RemoveWorker(name); err != nil {
						b.Fatal(err)
					}
				}
				remove := time.Since(t0)
				for i, name := range names {
					if err := e.Store(name, []engine.Block{{Content: uint64(i), Seq: uint64(i)}}); err != nil {
						b.Fatal(err)
					}
				}
				var snap bytes.Buffer
				if err := e.WriteSnapshot(&snap); err != nil {
					b.Fatal(err)
				}
				t0 = time.Now()
				r, err := engine.Restore(cfg, &snap, 0)
				if err != nil {
					b.Fatal(err)
				}
				restore := time.Since(t0)
				if got := r.Stats().Workers; got != 2*n {
					b.Fatalf("restored %d workers", got)
				}
				r.Close()
				b.ReportMetric(create.Seconds(), "create-100k-s")
				b.ReportMetric(remove.Seconds(), "remove-100k-s")
				b.ReportMetric(restore.Seconds(), "restore-200k-s")
				b.ReportMetric(perWorker, "heap-B/one-block-worker")
				b.ReportMetric(perWorker-perBlock, "overhead-B/worker")
			}
			b.ReportMetric(0, "ns/op")
		})
	}
}

// oneWorkerHeap is the heap per block of one worker holding n root blocks.
func oneWorkerHeap(b *testing.B, cfg engine.Config, n int) float64 {
	runtime.GC()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	e, err := engine.New(cfg)
	if err != nil {
		b.Fatal(err)
	}
	defer e.Close()
	for i := 0; i < n; i++ {
		if err := e.Store("one", []engine.Block{{Content: uint64(i), Seq: uint64(i)}}); err != nil {
			b.Fatal(err)
		}
	}
	if err := e.Barrier(ctx); err != nil {
		b.Fatal(err)
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	runtime.KeepAlive(e)
	return float64(int64(after.HeapAlloc)-int64(before.HeapAlloc)) / float64(n)
}
