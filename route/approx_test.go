package route

import (
	"errors"
	"math/rand/v2"
	"testing"
)

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
