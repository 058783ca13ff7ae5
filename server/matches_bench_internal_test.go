package server

import (
	"strconv"
	"testing"

	"github.com/kvindex/kvindex/engine"
	"github.com/kvindex/kvindex/internal/cputime"
)

// BenchmarkMatchesFleet measures what a match does per matched worker after the index
// answered (matches: each worker's state and trust read from the fleet, its rescoring,
// and the sort of the answer), for an engine answer naming 64, 1,000 and 10,000 served
// workers (engines added by AddEngine, not started; trust off, so that they are scored
// from the index). Besides ns/op it reports the process CPU time per answer, the
// steadier figure on a shared machine.
func BenchmarkMatchesFleet(b *testing.B) {
	for _, n := range []int{64, 1000, 10000} {
		b.Run("workers-"+strconv.Itoa(n), func(b *testing.B) {
			s := indexedServer(b, n, 0, TrustConfig{Off: true})
			found := make([]engine.Match, n)
			for i := range found {
				found[i] = engine.Match{Worker: "pod-" + strconv.Itoa(i), Score: 32 - i%7, Size: 32}
			}
			dst := make([]Match, 0, n)
			b.ReportAllocs()
			c0, _ := cputime.Process()
			for b.Loop() {
				if got := s.matches("m", nil, found, engine.Weights{}, dst[:0]); len(got) != n {
					b.Fatalf("%d matches of %d", len(got), n)
				}
			}
			b.ReportMetric(cputime.PerOp(c0, b.N), "cpu-ns/op")
		})
	}
}
