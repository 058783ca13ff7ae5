package engine

import (
	"fmt"
	"runtime"
	"sync"
	"testing"

	"github.com/kvindex/kvindex/engine/internal/worker"
)

// BenchmarkNameTable reports the heap per entry of the registry's name table and of the
// sync.Map it replaced, holding 100,000 worker names (the names' own bytes excluded:
// both tables share one set of strings).
func BenchmarkNameTable(b *testing.B) {
	const n = 100_000
	names := make([]string, n)
	for i := range names {
		names[i] = fmt.Sprintf("worker-%06d", i)
	}
	w := worker.New("w", 0)
	heap := func() uint64 {
		runtime.GC()
		var m runtime.MemStats
		runtime.ReadMemStats(&m)
		return m.HeapAlloc
	}
	for _, impl := range []string{"nameTable", "sync.Map"} {
		b.Run(impl, func(b *testing.B) {
			var perEntry float64
			for b.Loop() {
				before := heap()
				var keep any
				switch impl {
				case "nameTable":
					t := &nameTable{}
					t.init()
					for _, name := range names {
						t.store(name, w)
					}
					keep = t
				default:
					m := &sync.Map{}
					for _, name := range names {
						m.Store(name, w)
					}
					keep = m
				}
				perEntry = float64(heap()-before) / n
				runtime.KeepAlive(keep)
			}
			b.ReportMetric(perEntry, "heap-B/entry")
			b.ReportMetric(0, "ns/op")
		})
	}
}
