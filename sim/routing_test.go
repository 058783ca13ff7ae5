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

// TestRouterQueue: Dynamo's router queue at threshold 0 (a worker is busy while any
// prefill is in flight there; ai-dynamo/dynamo lib/kv-router/src/scheduling/queue.rs)
// in front of one engine. Four distinct prompts a microsecond apart: without the queue
// the last three reach the engine during the first one's step and prefill together,
// sharing a first-token time; with it each waits at the router for the previous one's
// first token, so the first tokens come one by one, and each time to first token still
// counts from the request's arrival at the router. The zero threshold, Dynamo's
// default, has no queue.
func TestRouterQueue(t *testing.T) {
	w := &Workload{Name: "distinct", BlockSize: 16, Timed: true}
	for i := range 4 {
		b := make([]uint64, 6)
		for k := range b {
			b[k] = uint64(100*i + k + 1)
		}
		w.add(Request{Tokens: 100, Blocks: b, At: time.Duration(i) * time.Microsecond})
	}
	run := func(threshold float64) []RequestOutcome {
		out := make([]RequestOutcome, len(w.Requests))
		cfg := TimedConfig{Config: Config{Workers: 1, Capacity: 64, Seed: 3}, Output: 2,
			OnFinish: func(o RequestOutcome) { out[o.Index] = o }}
		cfg.Route.QueueThreshold = threshold
		res, err := Simulate(context.Background(), w, mustRouting(t, "dynamo-cost/exact"), cfg)
		if err != nil {
			t.Fatal(err)
		}
		if res.Requests != len(w.Requests) {
			t.Fatalf("threshold %g: %d requests finished, want %d", threshold, res.Requests, len(w.Requests))
		}
		return out
	}
	firsts := func(out []RequestOutcome) []time.Duration {
		var ts []time.Duration
		for _, o := range out {
			ts = append(ts, o.FirstToken)
		}
		return ts
	}
	off := firsts(run(-1))
	if off[1] != off[2] || off[2] != off[3] {
		t.Fatalf("no queue: first tokens %v, want the last three together", off)
	}
	// The zero threshold is Dynamo's default, router_queue_threshold unset: no queue.
	if rq, err := newRouterQueues(mustRouting(t, "dynamo-cost/exact"), TimedConfig{Routers: 1}); rq != nil || err != nil {
		t.Fatalf("the default threshold: queues %v (%v), want none", rq, err)
	}
	queued := run(1e-12)
	on := firsts(queued)
	for i := 1; i < len(on); i++ {
		if on[i] <= on[i-1] {
			t.Fatalf("queue: first tokens %v, want each after the previous one's", on)
		}
	}
	for i, o := range queued {
		if o.Arrival != time.Duration(i)*time.Microsecond {
			t.Fatalf("queue: request %d arrival %v, want %v (its time at the router)", i, o.Arrival, time.Duration(i)*time.Microsecond)
		}
	}
}
