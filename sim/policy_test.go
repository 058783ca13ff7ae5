package sim

import (
	"slices"
	"testing"
)

func TestPolicyNames(t *testing.T) {
	var names []string
	for _, p := range Policies() {
		names = append(names, p.String())
		q, err := ParsePolicy(p.String())
		if err != nil || q != p {
			t.Errorf("ParsePolicy(%q) = %v, %v", p, q, err)
		}
	}
	if want := []string{"longest-prefix/exact", "random", "round-robin", "least-loaded", "longest-prefix/exact+predict",
		"longest-prefix/approx-ttl", "longest-prefix/exact:weighted-tiers", "longest-prefix/exact:any-tier"}; !slices.Equal(names, want) {
		t.Fatalf("policies %v, want %v", names, want)
	}
	for old, want := range map[string]Policy{"kv-aware": KVAware, "approximate": Approximate, "kv-any-tier": KVAnyTier} {
		if p, err := ParsePolicy(old); err != nil || p != want {
			t.Errorf("old name %q: %v, %v, want %v", old, p, err, want)
		}
	}
	if _, err := ParsePolicy("kv_aware"); err == nil {
		t.Fatal("ParsePolicy accepted kv_aware")
	}
}

func TestRouterPick(t *testing.T) {
	type pick struct {
		scores []float64
		tokens int
		want   int
	}
	tests := []struct {
		name   string
		policy Policy
		loads  []int64 // requests already assigned (their tokens are 100 each)
		picks  []pick
	}{
		{"kv-aware: the first request may go anywhere; ties go to the lowest index", KVAware, []int64{0, 0, 0},
			[]pick{{scores: []float64{0, 0, 0}, want: 0}, {scores: []float64{0, 0, 1}, want: 2}}},
		{"kv-aware: the longest prefix wins", KVAware, []int64{1, 1, 1},
			[]pick{{scores: []float64{1, 5, 3}, want: 1}}},
		{"kv-aware: a worker at 1.1x the mean is not eligible", KVAware, []int64{11, 10, 9},
			// mean 10: 11 is not under 11, so worker 1 wins with a shorter prefix.
			[]pick{{scores: []float64{9, 2, 1}, want: 1}}},
		{"kv-aware: just under 1.1x the mean is eligible", KVAware, []int64{12, 11, 9},
			// mean 32/3: 12 < 11.73 is false, 11 < 11.73 is true. Then the mean is 11,
			// and 12 < 12.1 makes worker 0 eligible again.
			[]pick{{scores: []float64{9, 2, 1}, want: 1}, {scores: []float64{9, 2, 1}, want: 0}}},
		{"kv-aware: equal scores go to the least loaded, then the lowest index", KVAware, []int64{3, 2, 2, 3},
			[]pick{{scores: []float64{4, 4, 4, 4}, want: 1}, {scores: []float64{4, 4, 4, 4}, want: 2}}},
		{"kv-aware: weighted scores order to a fraction of a block", KVWeighted, []int64{1, 1, 1},
			[]pick{{scores: []float64{2.25, 2.5, 2}, want: 1}}},
		{"round-robin cycles in order", RoundRobin, []int64{0, 0, 0},
			[]pick{{want: 0}, {want: 1}, {want: 2}, {want: 0}}},
		{"least-loaded counts prompt tokens, ties to the lowest index", LeastLoaded, []int64{0, 0, 0},
			[]pick{{tokens: 500, want: 0}, {tokens: 10, want: 1}, {tokens: 10, want: 2}, {tokens: 10, want: 1}, {tokens: 10, want: 2}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := newRouter(tc.policy, len(tc.loads), 1)
			for i, l := range tc.loads {
				r.loads[i], r.tokens[i] = l, 100*l
				r.total += l
			}
			for i, p := range tc.picks {
				if got := r.pick(p.scores, p.tokens); got != p.want {
					t.Fatalf("pick %d: worker %d, want %d (loads %v)", i, got, p.want, r.loads)
				}
			}
		})
	}
}

func TestRouterRandomIsSeeded(t *testing.T) {
	seq := func(seed uint64) []int {
		r := newRouter(Random, 8, seed)
		var out []int
		for range 200 {
			out = append(out, r.pick(nil, 1))
		}
		return out
	}
	a, b, c := seq(1), seq(1), seq(2)
	if !slices.Equal(a, b) || slices.Equal(a, c) {
		t.Fatal("the random policy is not a function of its seed")
	}
	seen := map[int]bool{}
	for _, w := range a {
		if w < 0 || w >= 8 {
			t.Fatalf("worker %d", w)
		}
		seen[w] = true
	}
	if len(seen) != 8 {
		t.Fatalf("200 random picks reached %d of 8 workers", len(seen))
	}
}
