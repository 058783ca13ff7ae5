package route

import (
	"errors"
	"math"
	"math/rand/v2"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func near(a, b float64) bool { return math.Abs(a-b) < 1e-9 }

func checkVals(t *testing.T, what string, got, want []float64) {
	t.Helper()
	for i := range want {
		if i >= len(got) || !near(got[i], want[i]) {
			t.Fatalf("%s = %v, want %v", what, got, want)
		}
	}
}

// hashes returns n distinct block hashes starting at base.
func hashes(base uint64, n int) []uint64 {
	out := make([]uint64, n)
	for i := range out {
		out[i] = base + uint64(i)
	}
	return out
}

// TestCostHandComputed checks Cost against Dynamo's logit worked out by hand
// (ai-dynamo/dynamo lib/kv-router/src/scheduling/selector/default.rs, worker_logit:
// logit = prefill_load_scale * max(0, raw_prefill_blocks - credit *
// device_overlap_blocks) + decode_cost_blocks, raw prefill = active prefill tokens +
// the prompt's, decode cost = active blocks + the prompt's blocks not already active,
// sequences/prompt_registry.rs potential_decode_blocks): a 640-token request (10
// blocks of 64) on three workers.
func TestCostHandComputed(t *testing.T) {
	req := Request{Tokens: 640, BlockSize: 64, Blocks: hashes(1, 10)}
	cands := []Candidate{
		{Overlap: 8, ActiveOverlap: 8, Load: Load{PrefillTokens: 0, ActiveBlocks: 100}},    // (640-512)/64=2 + 100+(10-8) = 104
		{Overlap: 0, ActiveOverlap: 0, Load: Load{PrefillTokens: 128, ActiveBlocks: 50}},   // (128+640)/64=12 + 50+10 = 72
		{Overlap: 10, ActiveOverlap: 10, Load: Load{PrefillTokens: 640, ActiveBlocks: 70}}, // 640/64=10 + 70+0 = 80
	}
	checkVals(t, "costs", Cost{}.Costs(req, cands, nil), []float64{104, 72, 80})
	if p := (Cost{}).Pick(req, cands, 0); p != 1 {
		t.Fatalf("pick %d, want 1", p)
	}
	// Weight 10: 10*2+102 = 122, 10*12+60 = 180, 10*10+70 = 170: the cache wins.
	if p := (Cost{OverlapWeight: 10}).Pick(req, cands, 0); p != 0 {
		t.Fatalf("weight 10: pick %d, want 0", p)
	}
	// An overlap beyond the request's full blocks counts as the full blocks; without
	// hashes the request adds all its blocks, its partial one included (650 tokens: 11).
	c := Cost{}.Costs(Request{Tokens: 650, BlockSize: 64}, []Candidate{{Overlap: 99}}, nil)
	if !near(c[0], 10.0/64+11) {
		t.Fatalf("overlap 99 of 10 blocks: cost %v, want %v", c[0], 10.0/64+11)
	}
}

// TestCostTemperature checks the softmax draw against probabilities worked out by
// hand from Dynamo's softmax_sample_index (selector/default.rs): logits 104, 72, 80 normalised by
// max-min = 32 and negated are -3.25, -2.25, -2.5; at temperature 1 their softmax is
// e^-1, 1, e^-0.25 over 2.14670: 0.17137, 0.46584, 0.36279.
func TestCostTemperature(t *testing.T) {
	req := Request{Tokens: 640, BlockSize: 64, Blocks: hashes(1, 10)}
	cands := []Candidate{
		{Overlap: 8, ActiveOverlap: 8, Load: Load{ActiveBlocks: 100}},
		{Load: Load{PrefillTokens: 128, ActiveBlocks: 50}},
		{Overlap: 10, ActiveOverlap: 10, Load: Load{PrefillTokens: 640, ActiveBlocks: 70}},
	}
	c := Cost{Temperature: 1}
	at := func(u float64) uint64 { return uint64(u * (1 << 53)) }
	for _, tc := range []struct {
		u    float64
		want int
	}{{0.0, 0}, {0.17, 0}, {0.172, 1}, {0.637, 1}, {0.638, 2}, {0.9999, 2}} {
		if got := c.Pick(req, cands, at(tc.u)); got != tc.want {
			t.Errorf("u %.4f: pick %d, want %d", tc.u, got, tc.want)
		}
	}
	// Equal logits: uniform by the high bits, as ties.
	same := []Candidate{{}, {}, {}}
	seen := map[int]bool{}
	rng := rand.New(rand.NewPCG(1, 1))
	for range 300 {
		seen[c.Pick(req, same, rng.Uint64())] = true
	}
	if len(seen) != 3 {
		t.Fatalf("equal logits picked %v, want all three", seen)
	}
	if _, err := NewCost(1, -1); !errors.Is(err, ErrConfig) {
		t.Fatalf("negative temperature: %v", err)
	}
}

// TestScorerHandComputed checks Scorer against llm-d's scorers worked out by hand: the
// prefix score as matched/total (llm-d-router precise_prefix_cache.go,
// absoluteScoredPods; GIE's prefix plugin) or min-max normalised over the workers
// holding some of the prefix (llm-d-inference-scheduler pkg/plugins/scorer/utils.go,
// indexedScoresToNormalizedScoredPods), KV 1-util, queue min-max.
func TestScorerHandComputed(t *testing.T) {
	req := Request{Tokens: 640, BlockSize: 64}
	cands := []Candidate{
		{Overlap: 10, Load: Load{Waiting: 4, KVUtil: 0.9}}, // min-max 1, kv 0.1, queue 0
		{Overlap: 5, Load: Load{Waiting: 0, KVUtil: 0.5}},  // min-max 0, kv 0.5, queue 1
		{Overlap: 0, Load: Load{Waiting: 2, KVUtil: 0}},    // min-max 0, kv 1, queue 0.5
		{Overlap: 7, Load: Load{Waiting: 0, KVUtil: 0.2}},  // min-max 0.4, kv 0.8, queue 1
	}
	minMax := Scorer{MinMax: true}
	checkVals(t, "min-max scores", minMax.Scores(req, cands, nil), []float64{2.1, 1.5, 1.5, 2.6})
	if p := minMax.Pick(req, cands, 0); p != 3 {
		t.Fatalf("min-max pick %d, want 3", p)
	}
	// Absolute: prefix 1, 0.5, 0, 0.7.
	checkVals(t, "absolute scores", Scorer{}.Scores(req, cands, nil), []float64{2.1, 2.5, 1.5, 3.2})
	// Prefix weight 10, absolute: 10.1, 6.5, 1.5, 8.8.
	s, err := NewScorer(10, 1, 1, false)
	if err != nil {
		t.Fatal(err)
	}
	if p := s.Pick(req, cands, 0); p != 0 {
		t.Fatalf("prefix weight 10: pick %d, want 0", p)
	}
	// Every holder holding the same prefix scores 1, the others 0.
	eq := []Candidate{{Overlap: 6}, {Overlap: 6}, {}}
	checkVals(t, "equal holders", minMax.Scores(req, eq, nil), []float64{4, 4, 2})
}

// TestAffinityHandComputed checks Affinity against llm-d's prefix-cache-affinity-filter
// and token-load-scorer worked out by hand (llm-d-router
// pkg/epp/framework/plugins/scheduling/filter/prefixcacheaffinity/plugin.go: sticky at
// a share >= 0.8, TTFT ms = tokens / 15,928 * 1000, stickiness broken past 18,000 ms;
// scorer/tokenload/token_load.go: 1 - min(load, 4,194,304) / 4,194,304).
func TestAffinityHandComputed(t *testing.T) {
	req := Request{Tokens: 1000, BlockSize: 100} // 10 full blocks
	cands := []Candidate{
		{Overlap: 9, Load: Load{UncachedTokens: 300000}}, // sticky, TTFT 18,834.6 ms
		{Overlap: 8, Load: Load{UncachedTokens: 100000}}, // sticky, TTFT 6,278.3 ms
		{Overlap: 0}, // TTFT 0
		{Overlap: 2, Load: Load{UncachedTokens: 50000}}, // share 0.2
	}
	a := Affinity{}
	keep := a.Sticky(req, cands, nil)
	if !keep[0] || !keep[1] || keep[2] || keep[3] {
		t.Fatalf("sticky %v, want [true true false false]", keep)
	}
	// Token loads: 300,000+100 = 300,100; 100,000+200; 0+1,000; 50,000+800.
	const q = 4194304.0
	checkVals(t, "token loads", a.TokenLoads(req, cands, nil), []float64{1 - 300100/q, 1 - 100200/q, 1 - 1000/q, 1 - 50800/q})
	if p := a.Pick(req, cands, 0); p != 1 {
		t.Fatalf("pick %d, want 1 (the least loaded sticky worker)", p)
	}
	// Both sticky workers past the penalty: 300,000 tokens is 18,834.6 ms behind the
	// idle worker, so all are kept and the idle one wins.
	cands[1].Load.UncachedTokens = 300000
	if p := a.Pick(req, cands, 0); p != 2 {
		t.Fatalf("saturated: pick %d, want 2", p)
	}
	// Exactly at the penalty (286,704 tokens = 18,000 ms) stickiness holds.
	cands[1].Load.UncachedTokens = 286704
	if p := a.Pick(req, cands, 0); p != 1 {
		t.Fatalf("at the penalty: pick %d, want 1", p)
	}
	// No sticky worker: all kept.
	for i := range cands {
		cands[i].Overlap = 1
	}
	if k := a.Sticky(req, cands, nil); !k[0] || !k[1] || !k[2] || !k[3] {
		t.Fatalf("no sticky worker: kept %v, want all", k)
	}
	for _, bad := range []Affinity{{Threshold: 1.5}, {PeakPrefillThroughput: -1}, {MaxTTFTPenaltyMs: math.NaN()}, {QueueThresholdTokens: -1}} {
		if _, err := NewAffinity(bad); !errors.Is(err, ErrConfig) {
			t.Errorf("NewAffinity(%+v): %v, want ErrConfig", bad, err)
		}
	}
}

// TestLongestPrefixHandComputed checks the cap: 8 requests over 4 workers, mean 2,
// cap 1.1 -> 2.2, so the worker with 5 is out however long its prefix.
func TestLongestPrefixHandComputed(t *testing.T) {
	p := LongestPrefix{Cap: 1.1}
	cands := []Candidate{
		{Overlap: 10, Load: Load{Requests: 5}},
		{Overlap: 3, Load: Load{Requests: 1}},
		{Overlap: 3, Load: Load{Requests: 1}},
		{Overlap: 1, Load: Load{Requests: 1}},
	}
	seen := map[int]bool{}
	rng := rand.New(rand.NewPCG(2, 2))
	for range 200 {
		seen[p.Pick(Request{}, cands, rng.Uint64())] = true
	}
	if len(seen) != 2 || !seen[1] || !seen[2] {
		t.Fatalf("picked %v, want 1 and 2 (the tie)", seen)
	}
	cands[2].Load.Requests = 0 // total 7, limit 1.925: the tie goes to fewer requests
	if got := p.Pick(Request{}, cands, 0); got != 2 {
		t.Fatalf("pick %d, want 2", got)
	}
	if got := (LongestPrefix{}).Pick(Request{}, cands, 0); got != 0 {
		t.Fatalf("uncapped pick %d, want 0", got)
	}
	if _, err := NewLongestPrefix(0.5); !errors.Is(err, ErrConfig) {
		t.Fatalf("cap 0.5: %v", err)
	}
}

// allPolicies is one policy of every family.
func allPolicies() []Policy {
	return []Policy{Cost{}, Scorer{}, Scorer{MinMax: true}, Affinity{}, LongestPrefix{Cap: 1.1}, LeastLoaded{}, Random{}, &RoundRobin{}}
}

// TestTiesSpread is the property serve's "pick" relies on: identical candidates are
// picked uniformly over rnd, by every policy but round-robin (which cycles).
func TestTiesSpread(t *testing.T) {
	cands := make([]Candidate, 4)
	req := Request{Tokens: 100, BlockSize: 16}
	for _, p := range allPolicies() {
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
	for _, p := range append(allPolicies(), Cost{Temperature: 1}) {
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
	for _, w := range []float64{-1, MaxWeight * 2, math.NaN()} {
		if _, err := NewCost(w, 0); !errors.Is(err, ErrConfig) {
			t.Errorf("NewCost(%g): %v, want ErrConfig", w, err)
		}
		if _, err := NewScorer(1, w, 1, false); !errors.Is(err, ErrConfig) {
			t.Errorf("NewScorer(1, %g, 1): %v, want ErrConfig", w, err)
		}
	}
}

// TestRegistry checks that every row parses back from its name and builds a policy of
// its family, that the old names resolve, and that bad names are clear errors.
func TestRegistry(t *testing.T) {
	for _, r := range Rows() {
		got, err := ParseRow(r.Name())
		if err != nil || got != r {
			t.Fatalf("ParseRow(%q) = %v, %v", r.Name(), got, err)
		}
		p, err := New(r, Params{})
		if err != nil {
			t.Fatalf("New(%v): %v", r, err)
		}
		if p.Name() != r.Family {
			t.Fatalf("New(%v) is a %s", r, p.Name())
		}
	}
	for old, now := range Aliases() {
		r, err := ParseRow(old)
		if err != nil || r.Name() != now && !(r.Knowledge == Exact && r.Family == now) {
			t.Fatalf("alias %q: %v, %v, want %s", old, r, err, now)
		}
	}
	if r, _ := ParseRow("llmd-scorer"); r != (Row{FamilyLLMDScorer, Exact}) {
		t.Fatalf("a bare cache-aware family: %v, want its exact row", r)
	}
	if p, _ := New(Row{FamilyLLMDScorer, Exact}, Params{PrefixMinMax: true}); !p.(Scorer).MinMax {
		t.Fatal("PrefixMinMax did not reach the scorer")
	}
	for _, bad := range []string{"", "nope", "random/exact", "dynamo-cost/psychic", "dynamo-cost/"} {
		if _, err := ParseRow(bad); !errors.Is(err, ErrConfig) {
			t.Errorf("ParseRow(%q): %v, want ErrConfig", bad, err)
		}
	}
	if _, err := New(Row{Family: "nope"}, Params{}); !errors.Is(err, ErrConfig) {
		t.Fatalf("New of an unknown family: %v", err)
	}
}
