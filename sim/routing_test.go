package sim

import (
	"context"
	"slices"
	"testing"
	"time"
)

// TestShareLoad: four identical requests a microsecond apart, one per router replica.
// With the load shared each replica sees the requests the others sent, so Dynamo's cost
// spreads them over the four engines; without, every replica sees an idle fleet.
func TestShareLoad(t *testing.T) {
	w := &Workload{Name: "identical", BlockSize: 4, Timed: true}
	for i := range 4 {
		w.add(Request{Tokens: 4*8 + 1, Blocks: []uint64{1, 2, 3, 4, 5, 6, 7, 8}, At: time.Duration(i) * time.Microsecond})
	}
	workers := func(share bool) []int {
		var got []int
		cfg := TimedConfig{Config: Config{Workers: 4, Capacity: 64, Seed: 3}, Routers: 4, ShareLoad: share, Output: 4,
			OnFinish: func(o RequestOutcome) { got = append(got, o.Worker) }}
		if _, err := Simulate(context.Background(), w, mustRouting(t, "dynamo-cost/exact"), cfg); err != nil {
			t.Fatal(err)
		}
		slices.Sort(got)
		return slices.Compact(got)
	}
	if got := workers(true); len(got) != 4 {
		t.Fatalf("load shared: the four requests went to engines %v, want four", got)
	}
}
