package sim

import (
	"slices"
	"testing"
	"time"
)

// chainedWorkload is tinyWorkload with request 1 the next turn of request 0.
func chainedWorkload(r1At int) *Workload {
	w := tinyWorkload([3]int{0, 8, 3}, [3]int{r1At, 4, 2})
	w.Requests[1].After = 1
	return w
}

// TestClosedLoopHoldsTurn: R1 repeats R0's reply and arrives at 1 ms, before R0's last
// token. By hand (TestSchedulerWaits' timeline, a step 10 ms + 1 ms per token): R0
// prefills 0-18 and decodes to 40; with a think time of 5 ms R1 is released at 45,
// prefills 45-59 and decodes 59-70, and its TTFT counts from its release (14 ms).
func TestClosedLoopHoldsTurn(t *testing.T) {
	cfg := oneEngine(16, 8, 1)
	cfg.ThinkTime = 5 * ms
	out, _, res := simulateHand(t, chainedWorkload(1), cfg)
	checkTimes(t, out[0], 18*ms, 40*ms)
	checkTimes(t, out[1], 59*ms, 70*ms)
	if out[1].Arrival != 45*ms {
		t.Errorf("R1 released at %v, want 45ms", out[1].Arrival)
	}
	if res.Turns != 1 || res.Waited != 1 || res.WaitedShare() != 0.5 {
		t.Errorf("turns %d, waited %d (share %v); want 1, 1, 0.5", res.Turns, res.Waited, res.WaitedShare())
	}
	if res.TTFT.P90 != (18 * ms).Seconds() {
		t.Errorf("TTFT p90 %v s, want R0's 0.018 (R1's is 0.014)", res.TTFT.P90)
	}
}

// TestClosedLoopTurnThatDoesNotWait: R1 arrives at 50 ms, after R0's last token (40)
// plus the think time (5): it is sent at its arrival and prefills 50-64, decodes
// 64-75.
func TestClosedLoopTurnThatDoesNotWait(t *testing.T) {
	cfg := oneEngine(16, 8, 1)
	cfg.ThinkTime = 5 * ms
	out, _, res := simulateHand(t, chainedWorkload(50), cfg)
	checkTimes(t, out[1], 64*ms, 75*ms)
	if out[1].Arrival != 50*ms || res.Turns != 1 || res.Waited != 0 {
		t.Errorf("R1 sent at %v, turns %d, waited %d; want 50ms, 1, 0", out[1].Arrival, res.Turns, res.Waited)
	}
	// Arriving inside the think time, it waits for the end of it: released at 45 ms
	// from a pending release, not from R0's finish.
	out, _, res = simulateHand(t, chainedWorkload(42), cfg)
	if out[1].Arrival != 45*ms || res.Waited != 1 {
		t.Errorf("arriving at 42ms: sent at %v, waited %d; want 45ms, 1", out[1].Arrival, res.Waited)
	}
}

// TestOpenLoopSendsEarly: under the open loop the same early turn is sent at 1 ms, as
// in TestSchedulerWaits, and counted as having arrived before its reply.
func TestOpenLoopSendsEarly(t *testing.T) {
	cfg := oneEngine(16, 8, 1)
	cfg.OpenLoop = true
	out, _, res := simulateHand(t, chainedWorkload(1), cfg)
	checkTimes(t, out[1], 54*ms, 65*ms)
	if out[1].Arrival != 1*ms || res.Waited != 1 {
		t.Errorf("R1 sent at %v, waited %d; want 1ms, 1", out[1].Arrival, res.Waited)
	}
}

// TestClosedLoopDefaultRun: on the built-in conversations under load, every turn is
// sent after its predecessor's last token plus the think time, and some turns wait.
func TestClosedLoopDefaultRun(t *testing.T) {
	w, err := Generate(GenConfig{Seed: 2, Requests: 1500, Sessions: 64})
	if err != nil {
		t.Fatal(err)
	}
	sent := make([]time.Duration, len(w.Requests))
	done := make([]time.Duration, len(w.Requests))
	cfg := TimedConfig{Config: Config{Workers: 2, EventDelay: -1, Seed: 2}, Speedup: 1}
	cfg.OnFinish = func(o RequestOutcome) { sent[o.Index], done[o.Index] = o.Arrival, o.Finish }
	res := simulate(t, w, "round-robin", cfg)
	for i, r := range w.Requests {
		if p := r.After - 1; p >= 0 && sent[i] < done[p]+DefaultThinkTime {
			t.Fatalf("request %d sent at %v, before its predecessor %d's last token %v plus the think time", i, sent[i], p, done[p])
		}
	}
	if res.Waited == 0 || res.Waited >= res.Turns {
		t.Errorf("%d of %d turns waited: want some, not all", res.Waited, res.Turns)
	}
	t.Logf("%d of %d turns waited; reply blocks hit %.1f%%, prompt blocks %.1f%%", res.Waited, res.Turns, 100*res.ReplyHitRate(), 100*res.PromptHitRate())
}

// TestReplyDropped: a turn repeats its predecessor's prompt and the kept share of its
// reply; FromReply counts the blocks the kept reply completed.
func TestReplyDropped(t *testing.T) {
	for _, drop := range []float64{0, 0.5, 1} {
		w, err := Generate(GenConfig{Seed: 5, Requests: 600, Sessions: 8, ReplyDropped: drop})
		if err != nil {
			t.Fatal(err)
		}
		turns := 0
		for i, r := range w.Requests {
			p := r.After - 1
			if p < 0 {
				continue
			}
			turns++
			q := w.Requests[p]
			if p >= i || q.Session != r.Session {
				t.Fatalf("drop %v: request %d follows %d of session %d", drop, i, p, q.Session)
			}
			kept := q.Output - int(float64(q.Output)*drop+0.5)
			user := r.Tokens - q.Tokens - kept
			if user < 16 || user > 512 {
				t.Fatalf("drop %v: request %d adds %d user tokens to %d + %d kept", drop, i, user, q.Tokens, kept)
			}
			if !slices.Equal(r.Blocks[:len(q.Blocks)], q.Blocks) || !slices.Equal(r.Blocks[len(q.Blocks):len(q.Blocks)+len(q.Next)], q.Next) {
				t.Fatalf("drop %v: request %d does not repeat %d's prompt and generated blocks", drop, i, p)
			}
			want := q.replyBlocks(len(q.Blocks)) + len(q.Next)
			if got := r.replyBlocks(len(q.Blocks) + len(q.Next)); got != want || r.replyBlocks(len(r.Blocks)) != want {
				t.Fatalf("drop %v: request %d: %d reply blocks, want %d", drop, i, got, want)
			}
			if drop == 1 && (len(q.Next) != 0 || r.FromReply != nil) {
				t.Fatalf("every reply dropped, yet request %d has %d generated blocks", p, len(q.Next))
			}
		}
		if turns < 400 {
			t.Fatalf("drop %v: %d turns follow another", drop, turns)
		}
	}
	if _, err := Generate(GenConfig{ReplyDropped: 1.5}); err == nil {
		t.Error("ReplyDropped 1.5 accepted")
	}
}

func simulate(t *testing.T, w *Workload, routing string, cfg TimedConfig) TimedResult {
	t.Helper()
	res, err := Simulate(t.Context(), w, mustRouting(t, routing), cfg)
	if err != nil {
		t.Fatal(err)
	}
	return res
}
