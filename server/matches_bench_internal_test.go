package server

import (
	"fmt"
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
			s, err := New(Config{Listen: "127.0.0.1:0", Models: map[string]int{"m": 16}, Trust: TrustConfig{Off: true},
				RuntimeEngines: RuntimeEnginesConfig{MaxEngines: n + 1}}, Options{})
			if err != nil {
				b.Fatal(err)
			}
			found := make([]engine.Match, n)
			for i := range n {
				w := "pod-" + strconv.Itoa(i)
				if _, _, err := s.AddEngine(EngineConfig{Worker: w, Model: "m", BlockSize: 16,
					Endpoint: fmt.Sprintf("tcp://10.0.%d.%d:5557", i/250, i%250)}); err != nil {
					b.Fatal(err)
				}
				found[i] = engine.Match{Worker: w, Score: 32 - i%7, Size: 32}
			}
			dst := make([]Match, 0, n)
			b.ReportAllocs()
			c0, _ := cputime.Process()
			for b.Loop() {
				if got := s.matches("m", nil, found, engine.Weights{}, dst[:0]); len(got) != n {
					b.Fatalf("%d matches of %d", len(got), n)
				}
			}
			c1, _ := cputime.Process() // 0 where the platform does not tell
			b.ReportMetric(float64((c1-c0).Nanoseconds())/float64(b.N), "cpu-ns/op")
		})
	}
}
