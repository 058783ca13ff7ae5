package server

import (
	"fmt"
	"testing"

	"github.com/kvindex/kvindex/internal/testsize"
	"github.com/kvindex/kvindex/route"
)

// TestLoadPickAllocs: once the request's scratch has grown to the fleet, a load-aware
// pick's working memory (the candidates, the matches by worker, the overlaps and the
// tracker's candidates) allocates nothing, for every load-aware policy and
// longest-prefix, with tracked load and a caller's load laid over it. Only the
// answer (the Pick and its reason) is allocated, by loadPick.
func TestLoadPickAllocs(t *testing.T) {
	testsize.SkipAllocs(t)
	cfg := Config{Listen: "127.0.0.1:0"}
	for i := range 8 {
		cfg.Engines = append(cfg.Engines, EngineConfig{Worker: fmt.Sprint("w", i), Model: "m", BlockSize: 4})
	}
	s, err := New(cfg, Options{})
	if err != nil {
		t.Fatal(err)
	}
	m, err := s.resolveModel("m")
	if err != nil {
		t.Fatal(err)
	}
	blocks := []uint64{11, 12, 13, 14, 15, 16}
	for i := range 5 {
		req := route.Request{Tokens: 24, BlockSize: 4, Blocks: blocks[:i+1]}
		if err := s.routing.tracker.Routed(fmt.Sprint("r", i), fmt.Sprint("w", i), req, 4); err != nil {
			t.Fatal(err)
		}
	}
	matches := []Match{{Worker: "w1", Score: 4, Weighted: 4}, {Worker: "w3", Score: 2, Weighted: 1.75}, {Worker: "w6", Score: 6, Weighted: 6}}
	waiting := 3
	o := pickOpts{tokens: 24, blocks: blocks, loads: map[string]*WorkerLoad{"w2": {Waiting: &waiting}}, scratch: &pickScratch{}}
	for _, policy := range append([]string{PolicyLongestPrefix}, loadAware...) {
		if k := s.loadChoose(m, policy, matches, o, o.scratch); k < 0 || k >= 8 || len(o.scratch.cs) != 8 {
			t.Fatalf("%s: picked %d of %d candidates", policy, k, len(o.scratch.cs))
		}
		if n := testing.AllocsPerRun(100, func() { s.loadChoose(m, policy, matches, o, o.scratch) }); n != 0 {
			t.Errorf("%s: a pick allocates %.1f times a run, want 0", policy, n)
		}
		if p := s.loadPick(m, policy, matches, o); p == nil || len(o.scratch.byWorker) != 0 {
			t.Errorf("%s: pick %+v, %d matches left in the scratch", policy, p, len(o.scratch.byWorker))
		}
		t.Logf("%s: the answer allocates %.0f times", policy, testing.AllocsPerRun(100, func() { s.loadPick(m, policy, matches, o) }))
	}
}
