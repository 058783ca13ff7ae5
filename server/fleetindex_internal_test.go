package server

import (
	"fmt"
	"math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/kvindex/kvindex/internal/cputime"
)

// checkIndex fails t unless fleet f's index answers for every worker it serves, and
// for workers it does not, what its persistent maps answer (fleetindex.go).
func checkIndex(t testing.TB, f *fleet, unknown ...string) {
	t.Helper()
	for w := range f.workers.Keys() {
		got, want := f.lookup(w), f.lookupTrees(w)
		if got != want || !got.served() || (got.sub != nil) == (got.approx != nil) || (got.sub != nil && got.sub.Worker() != w) {
			t.Fatalf("worker %q: index %+v, maps %+v", w, got, want)
		}
	}
	for _, w := range unknown {
		if got := f.lookup(w); got != (fleetWorker{}) {
			t.Fatalf("unserved worker %q: index %+v", w, got)
		}
	}
	if idx := f.idx.Load(); idx != nil && len(*idx) != f.workers.Len() {
		t.Fatalf("the index holds %d workers, the fleet %d", len(*idx), f.workers.Len())
	}
}

// TestFleetIndex: through random adds and removes of engines with events, approximate
// ones and ranked ones, each published fleet's index agrees with its persistent maps,
// and so does the index of the fleet before the change (built before it, and still
// read by handlers that loaded that fleet).
func TestFleetIndex(t *testing.T) {
	s, err := New(Config{Listen: "127.0.0.1:0", Engines: []EngineConfig{{Worker: "cfg", Model: "m0", BlockSize: 4}}}, Options{})
	if err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(3, 3))
	var keys []string
	for i := range 300 {
		before := s.fleet()
		checkIndex(t, before, "nobody", fmt.Sprint("w", i))
		keys = randomChange(t, s, rng, i, keys)
		checkIndex(t, s.fleet(), "nobody", fmt.Sprint("w", i+1))
		checkIndex(t, before, "nobody")
	}
	if s.fleet().workers.Len() < 50 {
		t.Fatalf("only %d workers served at the end: the test did not grow the fleet", s.fleet().workers.Len())
	}
}

// TestFleetIndexReaders: readers look workers up in the fleets a writer publishes
// while it publishes them, each fleet's index being built by whichever reader comes
// first (run under -race: the index is published to the others safely), and every
// answer agrees with the fleet's maps, whether it came from the index or, while
// another reader builds it, from the maps.
func TestFleetIndexReaders(t *testing.T) {
	s, err := New(Config{Listen: "127.0.0.1:0", Models: map[string]int{"m0": 4}}, Options{})
	if err != nil {
		t.Fatal(err)
	}
	var stop atomic.Bool
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	for r := range 4 {
		wg.Go(func() {
			for n := 0; !stop.Load(); n++ {
				f := s.fleet()
				w := "w" + strconv.Itoa((n*7+r)%200)
				if got, want := f.lookup(w), f.lookupTrees(w); got != want {
					errs <- fmt.Errorf("worker %q: %+v, maps %+v", w, got, want)
					return
				}
			}
		})
	}
	rng := rand.New(rand.NewPCG(5, 5))
	var keys []string
	for i := range 200 {
		keys = randomChange(t, s, rng, i, keys)
	}
	stop.Store(true)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
}

// TestFleetLookupZeroAllocs: once a fleet's index is built, a lookup and the state and
// trust a match reads of it allocate nothing.
func TestFleetLookupZeroAllocs(t *testing.T) {
	s := indexedServer(t, 100, 3, TrustConfig{})
	f, lowered := s.fleet(), *s.trust.lowered.Load()
	f.lookup("pod-0")
	if n := testing.AllocsPerRun(100, func() {
		fw := f.lookup("pod-7")
		_ = fw.state(s.external)
		_ = s.scoredTrust(fw, lowered, "pod-7")
	}); n != 0 {
		t.Fatalf("a lookup allocates %.0f times", n)
	}
}

// indexedServer returns a server (not started) serving n engines of model "m" named
// pod-0, pod-1, ...: every approxEvery-th one (0: none) without events.
func indexedServer(t testing.TB, n, approxEvery int, trust TrustConfig) *Server {
	s, err := New(Config{Listen: "127.0.0.1:0", Models: map[string]int{"m": 16}, Trust: trust,
		RuntimeEngines: RuntimeEnginesConfig{MaxEngines: n + 1}}, Options{})
	if err != nil {
		t.Fatal(err)
	}
	for i := range n {
		e := EngineConfig{Worker: "pod-" + strconv.Itoa(i), Model: "m", BlockSize: 16}
		if approxEvery == 0 || i%approxEvery != 0 {
			e.Endpoint = fmt.Sprintf("tcp://10.0.%d.%d:5557", i/250, i%250)
		}
		if _, _, err := s.AddEngine(e); err != nil {
			t.Fatal(err)
		}
	}
	return s
}

// BenchmarkFleetLookup compares what a match reads of a worker among 10,000 served:
// "index", one lookup in the fleet's index; "maps", one in the fleet's persistent map
// (the fallback while another reader builds the index); "maps-x3", three persistent
// map lookups, as many as a match made per worker without the index (its subscriber
// for its state, again for its trust, and its model).
func BenchmarkFleetLookup(b *testing.B) {
	const n = 10000
	s := indexedServer(b, n, 3, TrustConfig{})
	f := s.fleet()
	f.lookup("pod-0")
	ws := make([]string, 1024)
	for i := range ws {
		ws[i] = "pod-" + strconv.Itoa(i*7919%n)
	}
	b.Run("index", func(b *testing.B) {
		i := 0
		for b.Loop() {
			_ = f.lookup(ws[i&1023])
			i++
		}
	})
	b.Run("maps", func(b *testing.B) {
		i := 0
		for b.Loop() {
			_ = f.lookupTrees(ws[i&1023])
			i++
		}
	})
	b.Run("maps-x3", func(b *testing.B) {
		i := 0
		for b.Loop() {
			w := ws[i&1023]
			_, _ = f.workers.Get(w)
			_, _ = f.workers.Get(w)
			_, _ = f.approx.Get(w)
			i++
		}
	})
}

// BenchmarkFleetIndexBuild measures the build of a fleet's index (fleetindex.go): what
// the first reader of a fleet of 1,000 or 10,000 workers pays once. Besides ns/op it
// reports the process CPU time per build, the steadier figure on a shared machine.
func BenchmarkFleetIndexBuild(b *testing.B) {
	for _, n := range []int{1000, 10000} {
		b.Run("workers-"+strconv.Itoa(n), func(b *testing.B) {
			f := indexedServer(b, n, 3, TrustConfig{}).fleet()
			b.ReportAllocs()
			c0, _ := cputime.Process()
			for b.Loop() {
				_ = f.buildIndex()
			}
			b.ReportMetric(cputime.PerOp(c0, b.N), "cpu-ns/op")
		})
	}
}
