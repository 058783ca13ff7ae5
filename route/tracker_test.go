package route

import (
	"errors"
	"math/rand/v2"
	"testing"
	"time"
)

// dynamoModel is a reference model of Dynamo's active-sequence accounting, written
// from its description rather than from the Tracker (ai-dynamo/dynamo
// lib/llm/src/kv_router/sequences/single.rs): each worker's active blocks are the set
// union of its requests' block hashes; its active prefill tokens are the uncached
// tokens of the requests with no first token; a request's new blocks are those of its
// hashes not in the union.
type dynamoModel struct {
	reqs map[int]*modelReq
}

type modelReq struct {
	worker           string
	tokens, uncached int64
	hashes           []uint64
	filling          bool
	at               time.Time
	anonymousBlocks  int64
}

func (m *dynamoModel) load(w string) (Load, map[uint64]bool) {
	var l Load
	set := map[uint64]bool{}
	var anon int64
	for _, r := range m.reqs {
		if r.worker != w {
			continue
		}
		l.Requests++
		l.Tokens += r.tokens
		l.UncachedTokens += r.uncached
		if r.filling {
			l.Prefilling++
			l.PrefillTokens += r.uncached
		}
		for _, h := range r.hashes {
			set[h] = true
		}
		anon += r.anonymousBlocks
	}
	l.ActiveBlocks = int64(len(set)) + anon
	l.Waiting = l.Prefilling
	return l, set
}

// TestTrackerDynamoModel drives a Tracker with random operations (requests sharing
// prefixes from a small pool, first tokens, finishes, the TTL) and checks every
// worker's load and every candidate's active overlap against the reference model.
func TestTrackerDynamoModel(t *testing.T) {
	var now time.Time
	const capacity = 500
	tr, err := NewTracker[int](TrackerConfig{MaxInFlight: 50, TTL: time.Minute, Capacity: capacity, Now: func() time.Time { return now }})
	if err != nil {
		t.Fatal(err)
	}
	m := &dynamoModel{reqs: map[int]*modelReq{}}
	workers := []string{"a", "b", "c"}
	rng := rand.New(rand.NewPCG(3, 4))
	prefixes := make([][]uint64, 6)
	for i := range prefixes {
		prefixes[i] = hashes(uint64(i)<<32, 40)
	}
	randomRequest := func() Request {
		p := prefixes[rng.IntN(len(prefixes))]
		n := rng.IntN(len(p) + 1)
		blocks := append([]uint64(nil), p[:n]...)
		for range rng.IntN(3) {
			blocks = append(blocks, rng.Uint64())
		}
		req := Request{Tokens: len(blocks)*16 + rng.IntN(16), BlockSize: 16, Blocks: blocks}
		if rng.IntN(8) == 0 {
			req.Blocks = nil // a request whose hashes the router does not know
		}
		return req
	}
	for step := range 20000 {
		now = now.Add(time.Duration(rng.IntN(2000)) * time.Millisecond)
		for id, r := range m.reqs { // the TTL, as the tracker applies it
			if now.Sub(r.at) >= time.Minute {
				delete(m.reqs, id)
			}
		}
		id := rng.IntN(80)
		switch op := rng.IntN(4); op {
		case 0, 1:
			w := workers[rng.IntN(len(workers))]
			req := randomRequest()
			cached := rng.IntN(req.Tokens + 100)
			err := tr.Routed(id, w, req, cached)
			_, dup := m.reqs[id]
			switch {
			case dup:
				if !errors.Is(err, ErrDuplicate) {
					t.Fatalf("step %d: routed id %d twice: %v", step, id, err)
				}
			case len(m.reqs) >= 50:
				if !errors.Is(err, ErrFull) {
					t.Fatalf("step %d: routed past the bound: %v", step, err)
				}
			default:
				if err != nil {
					t.Fatalf("step %d: %v", step, err)
				}
				r := &modelReq{worker: w, tokens: int64(req.Tokens), uncached: int64(req.Tokens - min(cached, req.Tokens)),
					hashes: req.Blocks, filling: true, at: now}
				if req.Blocks == nil {
					r.anonymousBlocks = int64((req.Tokens + 15) / 16)
				}
				m.reqs[id] = r
			}
		case 2:
			r := m.reqs[id]
			got := tr.FirstToken(id)
			if want := r != nil && r.filling; got != want {
				t.Fatalf("step %d: FirstToken(%d) = %v, want %v", step, id, got, want)
			}
			if r != nil {
				r.filling = false
			}
		case 3:
			_, want := m.reqs[id]
			if got := tr.Finished(id); got != want {
				t.Fatalf("step %d: Finished(%d) = %v, want %v", step, id, got, want)
			}
			delete(m.reqs, id)
		}
		probe := randomRequest()
		cands := tr.Candidates(workers, probe, []int{1, 2, 3}, nil)
		for i, w := range workers {
			want, set := m.load(w)
			want.KVUtil = min(float64(want.ActiveBlocks)/capacity, 1)
			if got := tr.Load(w); got != want {
				t.Fatalf("step %d: worker %s load %+v, want %+v", step, w, got, want)
			}
			active := 0
			for _, h := range probe.Blocks {
				if set[h] {
					active++
				}
			}
			if c := cands[i]; c.Load != want || c.ActiveOverlap != active || c.Overlap != i+1 {
				t.Fatalf("step %d: candidate %s %+v, want load %+v, active overlap %d", step, w, c, want, active)
			}
		}
		if tr.InFlight() != len(m.reqs) {
			t.Fatalf("step %d: in flight %d, want %d", step, tr.InFlight(), len(m.reqs))
		}
	}
}

// TestTrackerSharedPrefix is the case the refcount exists for, by hand: three
// requests of one 10-block prefix on one worker hold 10 blocks, not 30, and a fourth
// request of the same prefix adds none to Dynamo's decode blocks.
func TestTrackerSharedPrefix(t *testing.T) {
	tr, err := NewTracker[int](TrackerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	req := Request{Tokens: 640, BlockSize: 64, Blocks: hashes(100, 10)}
	for id := range 3 {
		if err := tr.Routed(id, "w", req, 0); err != nil {
			t.Fatal(err)
		}
	}
	cands := tr.Candidates([]string{"w", "idle"}, req, []int{10, 0}, nil)
	if l := cands[0].Load; l.ActiveBlocks != 10 || l.PrefillTokens != 1920 || cands[0].ActiveOverlap != 10 {
		t.Fatalf("shared prefix: %+v", cands[0])
	}
	// Cost: w = (1920 + 0)/64 = 30 + 10 + 0 = 40; idle = 640/64 = 10 + 0 + 10 = 20.
	checkVals(t, "costs", Cost{}.Costs(req, cands, nil), []float64{40, 20})
	tr.Finished(0)
	tr.Finished(1)
	if l := tr.Load("w"); l.ActiveBlocks != 10 || l.Requests != 1 {
		t.Fatalf("after two finished: %+v", l)
	}
}

// TestTrackerMaxBlocks: past MaxBlocks kept hashes a request counts by its number of
// blocks (unshared); finishing a request gives its hashes' room back.
func TestTrackerMaxBlocks(t *testing.T) {
	tr, err := NewTracker[int](TrackerConfig{MaxBlocks: 12})
	if err != nil {
		t.Fatal(err)
	}
	req := Request{Tokens: 640, BlockSize: 64, Blocks: hashes(100, 10)}
	for id := range 2 {
		if err := tr.Routed(id, "w", req, 0); err != nil {
			t.Fatal(err)
		}
	}
	// The first request's 10 hashes are kept; the second's would pass 12: counted as
	// 10 blocks of its own.
	if k, l := tr.KeptBlocks(), tr.Load("w"); k != 10 || l.ActiveBlocks != 20 || l.Requests != 2 {
		t.Fatalf("past the bound: kept %d, %+v", k, l)
	}
	tr.Finished(0)
	if k, l := tr.KeptBlocks(), tr.Load("w"); k != 0 || l.ActiveBlocks != 10 {
		t.Fatalf("after the kept one finished: kept %d, %+v", k, l)
	}
	if err := tr.Routed(2, "w", req, 0); err != nil {
		t.Fatal(err)
	}
	tr.Finished(1)
	if k, l := tr.KeptBlocks(), tr.Load("w"); k != 10 || l.ActiveBlocks != 10 || l.Requests != 1 {
		t.Fatalf("hashes kept again: kept %d, %+v", k, l)
	}
}

func TestTrackerRejects(t *testing.T) {
	for _, cfg := range []TrackerConfig{{MaxInFlight: MaxInFlight + 1}, {Capacity: -1}, {TTL: -time.Second},
		{MaxBlocks: -1}, {MaxBlocks: MaxBlocks + 1}} {
		if _, err := NewTracker[string](cfg); !errors.Is(err, ErrConfig) {
			t.Fatalf("NewTracker(%+v): %v", cfg, err)
		}
	}
	tr, err := NewTracker[string](TrackerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		req    Request
		cached int
	}{{Request{Tokens: -1, BlockSize: 16}, 0}, {Request{Tokens: 10, BlockSize: 16}, -1}, {Request{Tokens: 10}, 0},
		{Request{Tokens: 10, BlockSize: 16, Blocks: make([]uint64, MaxRequestBlocks+1)}, 0}} {
		if err := tr.Routed("x", "w", c.req, c.cached); !errors.Is(err, ErrConfig) {
			t.Errorf("Routed(%d tokens, %d hashes, %d cached, block %d): %v, want ErrConfig",
				c.req.Tokens, len(c.req.Blocks), c.cached, c.req.BlockSize, err)
		}
	}
}

// TestOverride: the engine's own metrics replace the estimates.
func TestOverride(t *testing.T) {
	l := Load{Waiting: 3, KVUtil: 0.5}
	l.Override(Metrics{Waiting: 7, KVUtil: 1.5})
	if l.Waiting != 7 || l.KVUtil != 1 {
		t.Fatalf("override: %+v", l)
	}
}
