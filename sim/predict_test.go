package sim

import (
	"context"
	"testing"
	"time"
)

// siblingWorkload: four distinct prompts 1 ms apart (one per worker), then, 1 ms later,
// a sibling of the fourth (its whole prompt again, one more block).
func siblingWorkload() *Workload {
	w := &Workload{Name: "siblings", BlockSize: 4, Timed: true}
	prompt := func(p uint64, n int) []uint64 {
		b := make([]uint64, n)
		for i := range b {
			b[i] = p*1000 + uint64(i)
		}
		return b
	}
	for p := range 4 {
		w.add(Request{Tokens: 4*4 + 1, Blocks: prompt(uint64(p), 4), At: time.Duration(p) * time.Millisecond})
	}
	w.add(Request{Tokens: 5*4 + 1, Blocks: prompt(3, 5), At: 4 * time.Millisecond})
	return w
}

// TestEventDelayAndPredictions: the sibling arrives before the first request's events
// (50 ms later). Kv-aware does not see them and misses; with instant events it hits;
// kv-aware-predict and approximate follow their own prediction and hit.
func TestEventDelayAndPredictions(t *testing.T) {
	w := siblingWorkload()
	for _, tc := range []struct {
		p     Policy
		delay time.Duration
		hit   int64
	}{
		{KVAware, -1, 4},
		{KVAware, 0, 0}, // the default delay, 50 ms
		{KVAware, time.Millisecond / 2, 4},
		{KVAwarePredict, 0, 4},
		{Approximate, 0, 4},
		{RoundRobin, 0, 0},
	} {
		cfg := Config{Workers: 4, Capacity: 64, EventDelay: tc.delay}
		r, err := Run(context.Background(), w, tc.p, cfg)
		if err != nil {
			t.Fatal(err)
		}
		if r.HitBlocks != tc.hit {
			t.Errorf("%v, event delay %v: %d blocks hit, want %d", tc.p, tc.delay, r.HitBlocks, tc.hit)
		}
		if tc.p == Approximate && r.Index.Events != 0 {
			t.Errorf("approximate: %d events reached the index", r.Index.Events)
		}
		if tc.p != Approximate && (r.Index.StoredEvents == 0 || r.Index.Events != uint64(r.Index.StoredEvents)) {
			t.Errorf("%v: %+v: every stored event must arrive by the end", tc.p, r.Index)
		}
	}
}

// TestPredictionsExpireInSimulatedTime: a sibling after the TTL no longer sees the
// prediction (approximate has nothing else).
func TestPredictionsExpireInSimulatedTime(t *testing.T) {
	w := siblingWorkload()
	w.Requests[4].At = 2 * time.Second
	for _, tc := range []struct {
		ttl time.Duration
		hit int64
	}{{3 * time.Second, 4}, {time.Second, 0}} {
		r, err := Run(context.Background(), w, Approximate, Config{Workers: 4, Capacity: 64, PredictionTTL: tc.ttl})
		if err != nil {
			t.Fatal(err)
		}
		if r.HitBlocks != tc.hit {
			t.Errorf("ttl %v: %d blocks hit, want %d", tc.ttl, r.HitBlocks, tc.hit)
		}
	}
}
