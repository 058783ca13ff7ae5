package server

import (
	"github.com/kvindex/kvindex/subscriber"
)

// The fleet's read index. The fleet keeps its maps persistent (internal/ptree) so that
// an engine add or remove copies O(log n) nodes under engMu, but a persistent map's
// lookup is slower than a Go map's (among 10,000 keys 150-285 ns for a Hashed, 17-50 ns
// for a Go map: go test -bench Get ./internal/ptree/), and a match asks about every
// worker it matched. So everything a handler reads of a worker is one value
// (fleetWorker) in one persistent map (fleet.workers), and each published fleet gets,
// on the first lookup of a worker, a Go map copy of it, built once outside engMu by
// that reader and published on the fleet by an atomic pointer: a match pays one Go map
// lookup per matched worker (state, trust and rank together) and allocates nothing for
// it. What a match does per matched worker after the index answered (Server.matches)
// took 209-272 µs of CPU time for 1,000 workers and 5.1-7.4 ms for 10,000, against
// 281-395 µs and 7.7-11.8 ms with the persistent maps looked up per worker and 207-262
// µs and 6.0-6.9 ms with Go maps cloned per change (go test -run '^$' -bench
// BenchmarkMatchesFleet ./server/, the three builds alternating in one session on a
// shared 2-core machine); a lookup takes 41-82 ns (BenchmarkFleetLookup).
//
// The bound: the first reader of a fleet builds its index in O(n) for n workers, one
// map's allocation (BenchmarkFleetIndexBuild: 0.24-0.27 ms of CPU time with 1,000
// workers, 4-9 ms with 10,000, on a shared 2-core machine); readers meeting the fleet
// while another builds it look the worker up in the persistent map instead of waiting.
// A fleet is built at most once, and only when read, so a flood of adds costs readers
// at most one build per fleet they see, never more than one per add.

// fleetWorker is what the handlers read of one served worker: the zero value is a
// worker the fleet does not serve.
type fleetWorker struct {
	sub    *subscriber.Subscriber // its subscriber; nil for a worker without events
	approx *model                 // the model of a worker without events; nil otherwise
	rank   rankOf                 // its instance and rank (mooncake.go)
}

// served reports whether the fleet serves the worker.
func (fw fleetWorker) served() bool { return fw.sub != nil || fw.approx != nil }

// lookup returns what fleet f holds of worker w: from f's index, built here by the
// first reader, or from its persistent map while another reader builds it.
func (f *fleet) lookup(w string) fleetWorker {
	if idx := f.idx.Load(); idx != nil {
		return (*idx)[w]
	}
	if f.building.CompareAndSwap(false, true) {
		idx := f.buildIndex()
		f.idx.Store(&idx)
		return idx[w]
	}
	return f.lookupTrees(w)
}

// lookupTrees looks worker w up in f's persistent map.
func (f *fleet) lookupTrees(w string) fleetWorker {
	fw, _ := f.workers.Get(w)
	return fw
}

// buildIndex returns f's workers by id, from its persistent map.
func (f *fleet) buildIndex() map[string]fleetWorker {
	idx := make(map[string]fleetWorker, f.workers.Len())
	for w, fw := range f.workers.All() {
		idx[w] = fw
	}
	return idx
}

// state is the state a match reports for the worker; external: the index is fed by
// another process, which vouches for the workers the fleet does not serve.
func (fw fleetWorker) state(external bool) string {
	switch {
	case fw.sub != nil:
		return fw.sub.State().String()
	case fw.approx != nil:
		return stateApproximate
	case external:
		return fedReplicated
	}
	return stateUnknown
}
