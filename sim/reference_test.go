package sim

import (
	"errors"
	"testing"
	"time"
)

// TestReferencesAgree: without generated blocks the infinite reference is
// InfiniteCache; a pooled LRU as large as every block ever seen equals it, and a
// smaller one reaches less.
func TestReferencesAgree(t *testing.T) {
	w, err := Generate(GenConfig{Seed: 5, Requests: 600, Sessions: 30})
	if err != nil {
		t.Fatal(err)
	}
	for i := range w.Requests {
		w.Requests[i].Next = nil
	}
	want := InfiniteCache(w)
	inf, _ := infiniteWithReuse(w, make([]time.Duration, len(w.Requests)))
	if inf != want {
		t.Fatalf("infinite reference %+v, InfiniteCache %+v", inf, want)
	}
	if big := pooledLRU(w, w.Blocks); big != want {
		t.Fatalf("pooled LRU of every block %+v, want the infinite cache's %+v", big, want)
	}
	if small := pooledLRU(w, 500); small.HitBlocks >= want.HitBlocks || small.Blocks != want.Blocks {
		t.Fatalf("pooled LRU of 500 blocks %+v not below the infinite %+v", small, want)
	}
}

// TestReuseHandComputed: three requests, block size 4. R0 (8 tokens, output 2) at 0 s;
// R1 (4 unrelated tokens, output 1) at 1 s; R2 (R0's 8 tokens and 4 more) at 3 s. R2
// reuses R0's two blocks, 3 s later, with R1's 4 prompt tokens and 1 output token
// computed between them.
func TestReuseHandComputed(t *testing.T) {
	w := tinyWorkload([3]int{0, 8, 2}, [3]int{1000, 4, 1}, [3]int{3000, 12, 1})
	w.Requests[2].Blocks = append([]uint64{1000, 1001}, 3002)
	_, rs := infiniteWithReuse(w, []time.Duration{0, time.Second, 3 * time.Second})
	if rs.Reusing != 1 || rs.Requests != 3 || rs.GapP50 != 3 || rs.NewTokensP50 != 5 {
		t.Fatalf("reuse %+v, want one request reusing, 3 s and 5 new tokens back", rs)
	}
	// The generated blocks count: with R0's output completing a block R2 asks for, R2
	// reuses three blocks.
	w.Requests[0].Next = []uint64{3002}
	inf, _ := infiniteWithReuse(w, []time.Duration{0, time.Second, 3 * time.Second})
	if inf.HitBlocks != 3 {
		t.Fatalf("with R0's generated block: %d hit blocks, want 3", inf.HitBlocks)
	}
}

func TestSharedContextShape(t *testing.T) {
	w, err := SharedContext(SharedContextConfig{Seed: 2, Requests: 2000, Groups: 10, GroupTokens: 640, UsersPerGroup: 3, QueryTokens: 128})
	if err != nil {
		t.Fatal(err)
	}
	if len(w.Requests) != 2000 || w.Kind != "shared-context" || w.Timed {
		t.Fatalf("%d requests, kind %q, timed %v", len(w.Requests), w.Kind, w.Timed)
	}
	prompts := map[uint64][]uint64{}
	contexts := map[uint64]bool{}
	for _, r := range w.Requests {
		if r.Tokens != 768 || len(r.Blocks) != 12 || r.Output != 1000 || r.Session == 0 || r.Session > 30 {
			t.Fatalf("request %+v", r)
		}
		if p, ok := prompts[r.Session]; ok && !sameBlocks(p, r.Blocks) {
			t.Fatal("a user's prompt changed")
		}
		prompts[r.Session] = r.Blocks
		contexts[r.Blocks[0]] = true
		// A user's context is its customer's: users of a customer share the first 10 blocks.
		other := prompts[(r.Session-1)/3*3+1]
		if other != nil && !sameBlocks(other[:10], r.Blocks[:10]) {
			t.Fatal("users of one customer do not share its context")
		}
	}
	if len(prompts) != 30 || len(contexts) != 10 {
		t.Fatalf("%d prompts over %d contexts, want 30 and 10", len(prompts), len(contexts))
	}
	// Prefix-stable and deterministic.
	w2, _ := SharedContext(SharedContextConfig{Seed: 2, Requests: 500, Groups: 10, GroupTokens: 640, UsersPerGroup: 3, QueryTokens: 128})
	for i := range w2.Requests {
		if !sameBlocks(w2.Requests[i].Blocks, w.Requests[i].Blocks) {
			t.Fatalf("request %d differs with fewer requests", i)
		}
	}
	for _, c := range []SharedContextConfig{{Groups: -1}, {QueryTokens: -3}, {Output: -1}, {BlockSize: -1}, {Groups: 1 << 20, UsersPerGroup: 2}} {
		if _, err := SharedContext(c); err == nil || (!errors.Is(err, ErrWorkload) && c.BlockSize == 0) {
			t.Errorf("%+v: %v", c, err)
		}
	}
}

func sameBlocks(a, b []uint64) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}
