package sim

import (
	"context"
	"errors"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/kvindex/kvindex/engine"
)

// linearCost is a cost model a timeline can be worked out by hand with: a fixed
// overhead per step plus a cost per token computed.
type linearCost struct{ base, perToken time.Duration }

func (c linearCost) StepTime(b *Batch) time.Duration {
	n := b.Decodes
	for _, ch := range b.Chunks {
		n += ch.New
	}
	return c.base + time.Duration(n)*c.perToken
}

var msCost = linearCost{base: 10 * time.Millisecond, perToken: time.Millisecond}

const ms = time.Millisecond

// tinyWorkload builds a timed workload of block size 4 from (arrival, prompt tokens,
// output tokens) triples; request i's block k has content 1000*(i+1)+k.
func tinyWorkload(reqs ...[3]int) *Workload {
	w := &Workload{Name: "hand", Timed: true, BlockSize: 4, Kind: "test"}
	for i, r := range reqs {
		blocks := make([]uint64, r[1]/4)
		for k := range blocks {
			blocks[k] = uint64(1000*(i+1) + k)
		}
		w.add(Request{At: time.Duration(r[0]) * ms, Tokens: r[1], Blocks: blocks, Output: r[2]})
	}
	return w
}

// oneEngine is a timed config of one engine with the hand cost model.
func oneEngine(capacity, budget, maxSeqs int) TimedConfig {
	return TimedConfig{Config: Config{Workers: 1, Capacity: capacity, ChunkTokens: budget, EventDelay: -1},
		MaxNumSeqs: maxSeqs, Cost: msCost}
}

type emittedEvent struct {
	at     time.Duration
	stored bool
	parent uint64
	blocks []engine.Block
	seq    uint64
}

// simulateHand runs w and returns the outcomes by request index and the events.
func simulateHand(t *testing.T, w *Workload, cfg TimedConfig) ([]RequestOutcome, []emittedEvent, TimedResult) {
	t.Helper()
	out := make([]RequestOutcome, len(w.Requests))
	var evs []emittedEvent
	cfg.OnFinish = func(o RequestOutcome) { out[o.Index] = o }
	cfg.emitted = func(_ string, at time.Duration, stored bool, parent uint64, blocks []engine.Block, seq uint64) {
		evs = append(evs, emittedEvent{at, stored, parent, append([]engine.Block(nil), blocks...), seq})
	}
	res, err := Simulate(context.Background(), w, mustRouting(t, "round-robin"), cfg)
	if err != nil {
		t.Fatal(err)
	}
	return out, evs, res
}

func mustRouting(t testing.TB, name string) Routing {
	t.Helper()
	r, err := ParseRouting(name)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func checkTimes(t *testing.T, o RequestOutcome, ttft, finish time.Duration) {
	t.Helper()
	if o.FirstToken != ttft || o.Finish != finish {
		t.Errorf("request %d: first token at %v, finish at %v; want %v and %v", o.Index, o.FirstToken, o.Finish, ttft, finish)
	}
}

// TestSchedulerWaits: with room for one running request, the second waits for the
// first to finish. By hand (a step costs 10 ms + 1 ms per token): R0's 8-token prefill
// 0-18 (first token at 18), its decodes 18-29 and 29-40 (done: 3 tokens); R1, arrived
// at 1, prefills 40-54 (first token at 54) and decodes 54-65.
func TestSchedulerWaits(t *testing.T) {
	w := tinyWorkload([3]int{0, 8, 3}, [3]int{1, 4, 2})
	out, _, res := simulateHand(t, w, oneEngine(16, 8, 1))
	checkTimes(t, out[0], 18*ms, 40*ms)
	checkTimes(t, out[1], 54*ms, 65*ms)
	if res.TTFT.P90 != (53*ms).Seconds() || res.Preemptions != 0 {
		t.Errorf("TTFT p90 %v s (want R1's 0.053), %d preemptions", res.TTFT.P90, res.Preemptions)
	}
	if res.OutputTokens != 5 || res.Requests != 2 || res.Makespan != 0.065 {
		t.Errorf("output %d tokens, %d requests, makespan %v", res.OutputTokens, res.Requests, res.Makespan)
	}
	// Queue: R1 waited from 1 to 40 ms of a 65 ms run on one engine.
	if want := 39.0 / 65; math.Abs(res.QueueMean-want) > 1e-9 {
		t.Errorf("mean queue %v, want %v", res.QueueMean, want)
	}
}

// TestSchedulerPreempts: two requests of 8 prompt and 6 output tokens on 5 blocks of 4
// tokens. By hand: R0 prefills 0-18; R1 (arrived at 0) prefills beside R0's decode
// 18-37 (first token at 37), which fills the pool; at 37 R1 needs a third block and is
// preempted (it was admitted last); R0 decodes alone 37-81, evicting R1's freed second
// block at 70; R1 is readmitted at 81 with its first block cached, recomputes 5 tokens
// 81-96 (its second token, 59 ms after the first) and decodes to 140.
func TestSchedulerPreempts(t *testing.T) {
	w := tinyWorkload([3]int{0, 8, 6}, [3]int{0, 8, 6})
	out, evs, res := simulateHand(t, w, oneEngine(5, 16, 4))
	checkTimes(t, out[0], 18*ms, 81*ms)
	checkTimes(t, out[1], 37*ms, 140*ms)
	if res.Preemptions != 1 || out[1].Preemptions != 1 || out[0].Preemptions != 0 {
		t.Fatalf("preemptions: %d in all, R0 %d, R1 %d; want 1, 0, 1", res.Preemptions, out[0].Preemptions, out[1].Preemptions)
	}
	// The first eviction: R1's second prompt block, when R0 takes a fourth block at 70,
	// emitted at the end of that step (81); then R0's generated third block when R1's
	// recompute allocates at 81 (its step ends at 96), and R0's second when R1 takes
	// its fourth block at 129 (140).
	var removed []emittedEvent
	for _, e := range evs {
		if !e.stored {
			removed = append(removed, e)
		}
	}
	if len(removed) != 3 || removed[0].at != 81*ms || removed[1].at != 96*ms || removed[2].at != 140*ms {
		t.Fatalf("removed events %+v, want three, at 81, 96 and 140 ms", removed)
	}
	// That hash was stored when R1's prefill was scheduled, as its prompt's second block.
	found := false
	for _, e := range evs {
		if e.stored && e.at == 37*ms && len(e.blocks) == 2 && e.blocks[1].Seq == removed[0].seq && e.blocks[1].Content == 2001 {
			found = true
		}
	}
	if !found {
		t.Fatalf("R1's prompt blocks not stored at 37 ms: %+v", evs)
	}
	// ITL samples: R0's 5 gaps of 19, 11, 11, 11, 11 ms, R1's of 59 (across the
	// preemption), 11, 11, 11, 11: the median is 11 ms.
	if got := res.ITL.P50; math.Abs(got-0.011) > 0.011/64 {
		t.Errorf("ITL p50 %v s, want 0.011", got)
	}
	if got := res.ITL.P99; math.Abs(got-0.059) > 0.059/64 {
		t.Errorf("ITL p99 %v s, want 0.059 (the gap across the preemption)", got)
	}
}

// TestSchedulerDecodeFillsBlock: a 6-token prompt (one full block of 4) generating 4
// tokens. By hand: prefill 0-16 stores block 0; decodes 16-27 (token 6's KV), 27-38
// (token 7's: block 1 is full, stored under block 0 at that step's end, with the
// content the workload says the output completes), 38-49 (done).
func TestSchedulerDecodeFillsBlock(t *testing.T) {
	w := tinyWorkload([3]int{0, 6, 4})
	w.Requests[0].Next = []uint64{777}
	out, evs, _ := simulateHand(t, w, oneEngine(8, 16, 4))
	checkTimes(t, out[0], 16*ms, 49*ms)
	if len(evs) != 2 {
		t.Fatalf("events %+v, want two stored", evs)
	}
	b0, b1 := evs[0], evs[1]
	if !b0.stored || b0.at != 16*ms || len(b0.blocks) != 1 || b0.blocks[0].Content != 1000 {
		t.Errorf("first event %+v, want block 0 (content 1000) stored at 16 ms", b0)
	}
	if !b1.stored || b1.at != 38*ms || len(b1.blocks) != 1 || b1.blocks[0].Content != 777 || b1.parent != b0.blocks[0].Seq {
		t.Errorf("second event %+v, want the generated block (content 777) stored under block 0 at 38 ms", b1)
	}
}

// TestSchedulerChunkedPrefill: a 20-token prompt with a budget of 8 tokens a step
// prefills in three chunks (8, 8, 4 tokens: 18, 18 and 14 ms), one stored event each
// for the blocks it fills, and a request arriving meanwhile shares the last step.
func TestSchedulerChunkedPrefill(t *testing.T) {
	w := tinyWorkload([3]int{0, 20, 1}, [3]int{5, 4, 1})
	out, evs, _ := simulateHand(t, w, oneEngine(16, 8, 4))
	// Steps: 0-18 (R0 8), 18-36 (R0 8), 36-54 (R0 4 + R1 4: first tokens at 54).
	checkTimes(t, out[0], 54*ms, 54*ms)
	checkTimes(t, out[1], 54*ms, 54*ms)
	var at []time.Duration
	var n []int
	for _, e := range evs {
		at, n = append(at, e.at), append(n, len(e.blocks))
	}
	// R0: 2, 2 and 1 blocks at 18, 36, 54; R1's block at 54.
	if len(evs) != 4 || at[0] != 18*ms || at[1] != 36*ms || at[2] != 54*ms || at[3] != 54*ms ||
		n[0] != 2 || n[1] != 2 || n[2] != 1 || n[3] != 1 {
		t.Fatalf("events at %v with %v blocks", at, n)
	}
}

func TestRooflineHandComputed(t *testing.T) {
	m := Roofline{Weights: 14 * time.Millisecond, PerToken: 66 * time.Microsecond, PerPair: 2.1, PerKVToken: 50, PerRequest: 20 * time.Microsecond}
	cases := []struct {
		name string
		b    Batch
		want float64 // seconds
	}{
		// 7,200 tokens x 66 µs + 7,200 x 3,600.5 pairs x 2.1 ns + 20 µs.
		{"cold 7200", Batch{Chunks: []Chunk{{New: 7200}}}, 0.4752 + 7200*3600.5*2.1e-9 + 20e-6},
		// 1,200 x 66 µs + 1,200 x 6,600.5 x 2.1 ns + 20 µs.
		{"1200 on 6000 cached", Batch{Chunks: []Chunk{{New: 1200, Context: 6000}}}, 0.0792 + 1200*6600.5*2.1e-9 + 20e-6},
		// The weight read bounds 64 tokens: 14 ms + 64 x 7,000 x 50 ns + 64 x 20 µs.
		{"64 decodes at 7000", Batch{Decodes: 64, DecodeContext: 64 * 7000}, 0.014 + 0.0224 + 0.00128},
	}
	for _, c := range cases {
		got := m.StepTime(&c.b).Seconds()
		if math.Abs(got-c.want) > 1e-9 {
			t.Errorf("%s: %v s, want %v", c.name, got, c.want)
		}
	}
}

func TestProfile(t *testing.T) {
	csv := `kind,x,y,seconds
# TTFT(ISL, cached): new tokens 1000 and 3000, cached 0 and 2000
ttft,1000,0,0.1
ttft,3000,0,0.5
ttft,3000,2000,0.15
ttft,5000,2000,0.6
itl,1,1000,0.010
itl,1,5000,0.014
itl,65,1000,0.020
itl,65,5000,0.040
`
	p, err := ReadProfile(strings.NewReader(csv))
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		b    Batch
		want float64
	}{
		{Batch{Chunks: []Chunk{{New: 1000}}}, 0.1},
		{Batch{Chunks: []Chunk{{New: 2000}}}, 0.3},                  // halfway along new tokens
		{Batch{Chunks: []Chunk{{New: 1000, Context: 1000}}}, 0.125}, // halfway along cached
		{Batch{Chunks: []Chunk{{New: 2000, Context: 1000}}}, (0.3 + 0.375) / 2},
		{Batch{Chunks: []Chunk{{New: 4000}}}, 0.7}, // extrapolated
		{Batch{Decodes: 1, DecodeContext: 1000}, 0.010},
		{Batch{Decodes: 33, DecodeContext: 33 * 3000}, (0.012 + 0.030) / 2},
		{Batch{Chunks: []Chunk{{New: 1000}}, Decodes: 65, DecodeContext: 65 * 5000}, 0.1 + 0.040},
	}
	for i, c := range cases {
		if got := p.StepTime(&c.b).Seconds(); math.Abs(got-c.want) > 2e-9 {
			t.Errorf("case %d: %v s, want %v", i, got, c.want)
		}
	}
	bad := []string{
		"ttft,1000,0,0.1\n",                                                               // no itl points
		"ttft,1000,0,0.1\nitl,1,1000,x\n",                                                 // not a number
		"ttft,1000,2000,0.1\nitl,1,1000,0.01\n",                                           // cached > ISL
		"ttft,1000,0,0.1\nttft,2000,500,0.2\nitl,1,1000,0.01\n",                           // not a grid
		"ttft,1000,0,0.1\nttft,1000,0,0.2\nitl,1,1000,0.01\n",                             // twice... and not a grid
		"ttft,1000,0,0.1\nitl,0,1000,0.01\n",                                              // batch 0
		"ttft,1000,0,0.1\nfoo,1,1000,0.01\n",                                              // kind
		"ttft,1000,0,0.1,9\nitl,1,1000,0.01\n",                                            // fields
		"ttft,1000,0,-0.1\nitl,1,1000,0.01\n",                                             // negative
		"ttft,1000,0,NaN\nitl,1,1000,0.01\n",                                              // NaN
		"ttft,1e13,0,0.1\nitl,1,1000,0.01\n",                                              // huge
		"ttft,1000,0,0.1\nttft,1000,0,0.1\nitl,1,1000,0.01\n",                             // duplicate point
		"ttft,1000,0,0.1\nitl,1,1000,0.01\nitl,1,1000,0.02\n",                             // duplicate point
		"ttft,1000,0,0.1\nttft,2000,0,0.1\nitl,1,1000,0.01\nitl,1,1000,0.02\nitl,2,1,1\n", // itl not a grid
	}
	for _, b := range bad {
		if _, err := ReadProfile(strings.NewReader(b)); !errors.Is(err, ErrProfile) {
			t.Errorf("%q: %v, want ErrProfile", b, err)
		}
	}
}
