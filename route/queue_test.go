package route

import (
	"errors"
	"testing"
)

// TestQueueHandComputed checks the busy rule of Dynamo's router queue worked out by
// hand (ai-dynamo/dynamo lib/kv-router/src/scheduling/queue.rs, all_workers_busy: a
// worker is free while its active prefill tokens <= threshold x
// max_num_batched_tokens, and the queue holds a request only when no worker is free).
func TestQueueHandComputed(t *testing.T) {
	q, err := NewQueue[int](0.5, 8192) // budget 4,096 prefill tokens
	if err != nil {
		t.Fatal(err)
	}
	load := func(tokens ...int64) []Candidate {
		out := make([]Candidate, len(tokens))
		for i, n := range tokens {
			out[i].Load.PrefillTokens = n
		}
		return out
	}
	for _, c := range []struct {
		tokens []int64
		busy   bool
	}{
		{[]int64{5000, 4097}, true},
		{[]int64{5000, 4096}, false}, // 4,096 <= 4,096: free
		{[]int64{0}, false},
		{nil, false}, // no worker: routing must fail, not wait
	} {
		if got := q.Busy(load(c.tokens...)); got != c.busy {
			t.Errorf("prefill tokens %v: busy %v, want %v", c.tokens, got, c.busy)
		}
	}
	// The defaults: 16 x 10,000,000 tokens, never busy in practice.
	d, err := NewQueue[int](0, 0)
	if err != nil || d.Threshold() != DefaultQueueThreshold || d.Busy(load(1<<40)) != true || d.Busy(load(160_000_000)) {
		t.Fatalf("defaults: %v, threshold %v", err, d.Threshold())
	}
	for _, bad := range []struct {
		th float64
		mb int64
	}{{-1, 1}, {MaxQueueThreshold * 2, 1}, {1, -1}, {1, 1 << 40}} {
		if _, err := NewQueue[int](bad.th, bad.mb); !errors.Is(err, ErrConfig) {
			t.Errorf("NewQueue(%v, %v): %v, want ErrConfig", bad.th, bad.mb, err)
		}
	}
}

// TestQueueReleasesOldestFirst drives the queue with a Tracker as Dynamo's scheduler
// does (queue.rs: enqueue parks a request while all workers are busy; update, on each
// prefill completion or free, schedules the oldest while one is not): two workers, a
// budget of 0.5 x 1,024 = 512 prefill tokens, requests of 1,000 uncached tokens.
func TestQueueReleasesOldestFirst(t *testing.T) {
	tr, err := NewTracker[int](TrackerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	q, err := NewQueue[int](0.5, 1024)
	if err != nil {
		t.Fatal(err)
	}
	workers := []string{"a", "b"}
	req := Request{Tokens: 1000, BlockSize: 100}
	route := func(id int) string {
		cands := tr.Candidates(workers, req, nil, nil)
		k := LeastLoaded{}.Pick(req, cands, 0)
		if err := tr.Routed(id, workers[k], req, 0); err != nil {
			t.Fatal(err)
		}
		return workers[k]
	}
	arrive := func(id int) {
		if q.Busy(tr.Candidates(workers, req, nil, nil)) {
			q.Push(id)
			return
		}
		route(id)
	}
	for id := 1; id <= 4; id++ {
		arrive(id)
	}
	// 1 and 2 run (1,000 > 512 prefill tokens each): 3 and 4 wait, in order.
	if q.Len() != 2 || tr.InFlight() != 2 {
		t.Fatalf("queued %d, in flight %d; want 2 and 2", q.Len(), tr.InFlight())
	}
	update := func() (released []int) {
		for q.Len() > 0 && !q.Busy(tr.Candidates(workers, req, nil, nil)) {
			id, _ := q.Pop()
			route(id)
			released = append(released, id)
		}
		return released
	}
	if r := update(); len(r) != 0 {
		t.Fatalf("released %v with every worker busy", r)
	}
	tr.FirstToken(1) // its worker is free again: the oldest waiting, 3, goes there
	if r := update(); len(r) != 1 || r[0] != 3 {
		t.Fatalf("released %v, want [3]", r)
	}
	tr.Finished(2)
	if r := update(); len(r) != 1 || r[0] != 4 {
		t.Fatalf("released %v, want [4]", r)
	}
	if _, ok := q.Pop(); ok {
		t.Fatal("pop from an empty queue")
	}
}

// TestTrackerOutputBlocks checks Dynamo's router_track_output_blocks: off (the
// default), generated tokens add nothing; on, each block the sequence completes past
// the prompt is one more active block of its own, until the request finishes
// (ai-dynamo/dynamo lib/kv-router/src/sequences/single.rs, add_output_block).
func TestTrackerOutputBlocks(t *testing.T) {
	req := Request{Tokens: 150, BlockSize: 100, Blocks: hashes(1, 1)} // 1 full block, 50 tokens over
	for _, on := range []bool{false, true} {
		tr, err := NewTracker[int](TrackerConfig{TrackOutputBlocks: on})
		if err != nil {
			t.Fatal(err)
		}
		if err := tr.Routed(1, "w", req, 0); err != nil {
			t.Fatal(err)
		}
		if err := tr.Routed(2, "w", req, 0); err != nil {
			t.Fatal(err)
		}
		// 150 + 49 = 199: no block completed; 150 + 50 = 200: one; 150 + 260 = 410: three.
		for _, c := range []struct{ tokens, on, off int64 }{{49, 1, 1}, {50, 2, 1}, {260, 4, 1}, {100, 4, 1}} {
			if !tr.Generated(1, int(c.tokens)) {
				t.Fatal("request 1 not in flight")
			}
			want := c.off
			if on {
				want = c.on
			}
			if got := tr.Load("w").ActiveBlocks; got != want {
				t.Fatalf("output blocks %v, %d generated: active blocks %d, want %d", on, c.tokens, got, want)
			}
		}
		tr.Finished(1)
		if got := tr.Load("w").ActiveBlocks; got != 1 {
			t.Fatalf("output blocks %v: after finish, active blocks %d, want 1 (the shared prompt block)", on, got)
		}
		if tr.Generated(9, 100) {
			t.Fatal("Generated reported an unknown request in flight")
		}
	}
}
