package route

import (
	"errors"
	"math/rand/v2"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestCostHandComputed checks Cost against costs worked out by hand: a 640-token
// request (10 blocks of 64) on three workers.
func TestCostHandComputed(t *testing.T) {
	req := Request{Tokens: 640, BlockSize: 64}
	cands := []Candidate{
		{Overlap: 8, Load: Load{PrefillTokens: 0, ActiveBlocks: 100}},   // 1*(0+640-512)/64 + 100+10 = 2 + 110 = 112
		{Overlap: 0, Load: Load{PrefillTokens: 128, ActiveBlocks: 50}},  // (128+640)/64 + 60 = 12 + 60 = 72
		{Overlap: 10, Load: Load{PrefillTokens: 640, ActiveBlocks: 70}}, // (640+0)/64 + 80 = 10 + 80 = 90
	}
	got := Cost{}.Costs(req, cands, nil)
	want := []float64{112, 72, 90}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("costs = %v, want %v", got, want)
		}
	}
	if p := (Cost{}).Pick(req, cands, 0); p != 1 {
		t.Fatalf("pick %d, want 1", p)
	}
	// Weight 10: 10*2+110 = 130, 10*12+60 = 180, 10*10+80 = 180: the cache wins.
	if p := (Cost{OverlapWeight: 10}).Pick(req, cands, 0); p != 0 {
		t.Fatalf("weight 10: pick %d, want 0", p)
	}
	// An overlap beyond the request's full blocks counts as the full blocks.
	c := Cost{}.Costs(req, []Candidate{{Overlap: 99}}, nil)
	if c[0] != 10 {
		t.Fatalf("overlap 99 of 10 blocks: cost %v, want 10", c[0])
	}
}

// TestScorerHandComputed checks Scorer's three scores and their weights.
func TestScorerHandComputed(t *testing.T) {
	req := Request{Tokens: 640, BlockSize: 64}
	cands := []Candidate{
		{Overlap: 10, Load: Load{Waiting: 4, KVUtil: 0.9}}, // 2*1 + 0.1 + 0 = 2.1
		{Overlap: 5, Load: Load{Waiting: 0, KVUtil: 0.5}},  // 2*0.5 + 0.5 + 1 = 2.5
		{Overlap: 0, Load: Load{Waiting: 2, KVUtil: 0}},    // 0 + 1 + 0.5 = 1.5
	}
	got := Scorer{}.Scores(req, cands, nil)
	want := []float64{2.1, 2.5, 1.5}
	for i := range want {
		if d := got[i] - want[i]; d > 1e-12 || d < -1e-12 {
			t.Fatalf("scores = %v, want %v", got, want)
		}
	}
	if p := (Scorer{}).Pick(req, cands, 0); p != 1 {
		t.Fatalf("pick %d, want 1", p)
	}
	s, err := NewScorer(10, 1, 1) // 20.1, 11.5, 1.5
	if err != nil {
		t.Fatal(err)
	}
	if p := s.Pick(req, cands, 0); p != 0 {
		t.Fatalf("prefix weight 10: pick %d, want 0", p)
	}
}

// TestTiesSpread is the property serve's "pick" relies on: identical candidates are
// picked uniformly over rnd, by every policy but round-robin (which cycles).
func TestTiesSpread(t *testing.T) {
	cands := make([]Candidate, 4)
	req := Request{Tokens: 100, BlockSize: 16}
	for _, p := range []Policy{Cost{}, Scorer{}, LeastLoaded{}, Random{}, &RoundRobin{}} {
		counts := make([]int, len(cands))
		rng := rand.New(rand.NewPCG(1, 2))
		for range 4000 {
			counts[p.Pick(req, cands, rng.Uint64())]++
		}
		for i, c := range counts {
			if c < 800 || c > 1200 {
				t.Errorf("%s: worker %d picked %d of 4000 times, want about 1000: %v", p.Name(), i, c, counts)
			}
		}
	}
}

func TestPickEmpty(t *testing.T) {
	for _, p := range []Policy{Cost{}, Scorer{}, LeastLoaded{}, Random{}, &RoundRobin{}} {
		if got := p.Pick(Request{Tokens: 10, BlockSize: 16}, nil, 7); got != -1 {
			t.Errorf("%s: pick of none = %d, want -1", p.Name(), got)
		}
	}
}

func TestLeastLoaded(t *testing.T) {
	cands := []Candidate{{Load: Load{Tokens: 30}}, {Load: Load{Tokens: 10}}, {Overlap: 99, Load: Load{Tokens: 20}}}
	if p := (LeastLoaded{}).Pick(Request{}, cands, 12345); p != 1 {
		t.Fatalf("pick %d, want 1", p)
	}
}

func TestWeightsRejected(t *testing.T) {
	for _, w := range []float64{-1, MaxWeight * 2} {
		if _, err := NewCost(w); !errors.Is(err, ErrConfig) {
			t.Errorf("NewCost(%g): %v, want ErrConfig", w, err)
		}
		if _, err := NewScorer(1, w, 1); !errors.Is(err, ErrConfig) {
			t.Errorf("NewScorer(1, %g, 1): %v, want ErrConfig", w, err)
		}
	}
	nan := 0.0
	nan /= nan
	if _, err := NewCost(nan); !errors.Is(err, ErrConfig) {
		t.Errorf("NewCost(NaN): %v, want ErrConfig", err)
	}
}

// TestTrackerModel drives a Tracker with random operations and checks every worker's
// load against sums recomputed from a plain list of the requests in flight.
func TestTrackerModel(t *testing.T) {
	var now time.Time
	tr, err := NewTracker[int](TrackerConfig{MaxInFlight: 50, TTL: time.Minute, Now: func() time.Time { return now }})
	if err != nil {
		t.Fatal(err)
	}
	type req struct {
		worker          string
		tokens, prefill int64
		blocks          int64
		at              time.Time
	}
	model := map[int]*req{}
	workers := []string{"a", "b", "c"}
	rng := rand.New(rand.NewPCG(3, 4))
	for step := range 20000 {
		now = now.Add(time.Duration(rng.IntN(2000)) * time.Millisecond)
		for id, r := range model { // the TTL, as the tracker applies it
			if now.Sub(r.at) >= time.Minute {
				delete(model, id)
			}
		}
		id := rng.IntN(80)
		switch op := rng.IntN(4); op {
		case 0, 1:
			w := workers[rng.IntN(len(workers))]
			tokens, cached := rng.IntN(1000), rng.IntN(1200)
			err := tr.Routed(id, w, tokens, cached, 16)
			_, dup := model[id]
			switch {
			case dup:
				if !errors.Is(err, ErrDuplicate) {
					t.Fatalf("step %d: routed id %d twice: %v", step, id, err)
				}
			case len(model) >= 50:
				if !errors.Is(err, ErrFull) {
					t.Fatalf("step %d: routed past the bound: %v", step, err)
				}
			default:
				if err != nil {
					t.Fatalf("step %d: %v", step, err)
				}
				model[id] = &req{worker: w, tokens: int64(tokens), prefill: int64(tokens - min(cached, tokens)),
					blocks: int64((tokens + 15) / 16), at: now}
			}
		case 2:
			r := model[id]
			got := tr.FirstToken(id)
			if want := r != nil && r.prefill > 0; got != want {
				t.Fatalf("step %d: FirstToken(%d) = %v, want %v", step, id, got, want)
			}
			if r != nil {
				r.prefill = 0
			}
		case 3:
			_, want := model[id]
			if got := tr.Finished(id); got != want {
				t.Fatalf("step %d: Finished(%d) = %v, want %v", step, id, got, want)
			}
			delete(model, id)
		}
		for _, w := range workers {
			var want Load
			for _, r := range model {
				if r.worker == w {
					want.Requests++
					want.Tokens += r.tokens
					want.PrefillTokens += r.prefill
					want.ActiveBlocks += r.blocks
				}
			}
			if got := tr.Load(w); got != want {
				t.Fatalf("step %d: worker %s load %+v, want %+v", step, w, got, want)
			}
		}
		if tr.InFlight() != len(model) {
			t.Fatalf("step %d: in flight %d, want %d", step, tr.InFlight(), len(model))
		}
	}
}

func TestTrackerRejects(t *testing.T) {
	if _, err := NewTracker[string](TrackerConfig{MaxInFlight: MaxInFlight + 1}); !errors.Is(err, ErrConfig) {
		t.Fatalf("huge MaxInFlight: %v", err)
	}
	tr, err := NewTracker[string](TrackerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range [][3]int{{-1, 0, 16}, {10, -1, 16}, {10, 0, 0}} {
		if err := tr.Routed("x", "w", c[0], c[1], c[2]); !errors.Is(err, ErrConfig) {
			t.Errorf("Routed(%v): %v, want ErrConfig", c, err)
		}
	}
}

// TestApproxCacheModel checks ApproxCache against a plain LRU kept as a slice.
func TestApproxCacheModel(t *testing.T) {
	const capacity = 40
	c, err := NewApproxCache(capacity)
	if err != nil {
		t.Fatal(err)
	}
	c2, _ := NewApproxCache(capacity)
	rng := rand.New(rand.NewPCG(5, 6))
	var lru []uint64 // least recent first: chain keys of worker "w"
	prefixes := [][]uint64{}
	for range 10 {
		p := make([]uint64, 1+rng.IntN(20))
		for i := range p {
			p[i] = rng.Uint64()
		}
		prefixes = append(prefixes, p)
	}
	for step := range 5000 {
		base := prefixes[rng.IntN(len(prefixes))]
		req := append([]uint64(nil), base[:rng.IntN(len(base)+1)]...)
		for range rng.IntN(4) {
			req = append(req, rng.Uint64()%8)
		}
		keys := c2.chainLocked(req)
		want := 0
		for _, k := range keys {
			found := false
			for _, x := range lru {
				found = found || x == k
			}
			if !found {
				break
			}
			want++
		}
		if got := c.Match("w", req); got != want {
			t.Fatalf("step %d: match %d, want %d", step, got, want)
		}
		if all := c.MatchAll([]string{"other", "w"}, req, nil); all[0] != 0 || all[1] != want {
			t.Fatalf("step %d: MatchAll %v, want [0 %d]", step, all, want)
		}
		if rng.IntN(2) == 0 {
			c.Record("w", req)
			for i := len(keys) - 1; i >= 0; i-- {
				for j, x := range lru {
					if x == keys[i] {
						lru = append(lru[:j], lru[j+1:]...)
						break
					}
				}
				lru = append(lru, keys[i])
				if len(lru) > capacity {
					lru = lru[1:]
				}
			}
		}
		if c.Match("other", req) != 0 {
			t.Fatal("a worker never recorded matched")
		}

	}
	if _, err := NewApproxCache(0); !errors.Is(err, ErrConfig) {
		t.Fatalf("capacity 0: %v", err)
	}
}
