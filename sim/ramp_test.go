package sim

import (
	"slices"
	"testing"
	"time"
)

func TestParseRamp(t *testing.T) {
	r, err := ParseRamp("2:5, 0:5,4:5")
	if err != nil || r.Even || r.Drain || len(r.Stages) != 3 || r.Stages[1] != (Stage{0, 5 * time.Second}) || r.Stages[2].Rate != 4 {
		t.Fatalf("%+v %v", r, err)
	}
	for _, n := range RampNames() {
		r, err := ParseRamp(n)
		if err != nil || r.Even != (n == "llm-d-37-capacity") || r.Drain != (n == "llm-d-guide") {
			t.Errorf("%s: %v, %+v", n, err, r)
		}
	}
	if g := Ramps["llm-d-guide"]; len(g.Stages) != 17 || g.Stages[0] != (Stage{15, 50 * time.Second}) || g.Stages[16] != (Stage{60, 25 * time.Second}) || g.Pause != 31*time.Second {
		t.Errorf("llm-d-guide: %+v", g)
	}
	for _, bad := range []string{"", "3", "3:0", "-1:5", "x:5", "3:-1", "3:1e9"} {
		if _, err := ParseRamp(bad); err == nil {
			t.Errorf("ramp %q accepted", bad)
		}
	}
	g := Ramps["llm-d-guide"]
	for mode, want := range map[string]Ramp{"": g, "back-to-back": {Stages: g.Stages}, "drain": g, "drain:2s": {Stages: g.Stages, Drain: true, Pause: 2 * time.Second}} {
		got, err := g.WithStages(mode)
		if err != nil || got.Drain != want.Drain || got.Pause != want.Pause {
			t.Errorf("stages %q: %+v %v, want drain %v pause %v", mode, got, err, want.Drain, want.Pause)
		}
	}
	for _, bad := range []string{"drain:-1s", "drain:x", "drained", "back-to-back:1s"} {
		if _, err := g.WithStages(bad); err == nil {
			t.Errorf("stages %q accepted", bad)
		}
	}
}

// TestRampArrivals: evenly spaced stages send rate x duration requests each, none in
// a pause; Poisson stages about as many; the requests running out ends the ramp.
func TestRampArrivals(t *testing.T) {
	r := []Stage{{2, 5 * time.Second}, {0, 5 * time.Second}, {4, 5 * time.Second}}
	even, first := rampArrivals(r, 1, true, 1000, 1)
	if len(even) != 30 || !slices.Equal(first, []int{0, 10, 10, 30}) {
		t.Fatalf("%d even arrivals, want 30; stages start at %v", len(even), first)
	}
	for i, a := range even {
		if a >= 5*time.Second && a < 10*time.Second {
			t.Errorf("arrival %d at %v, in the pause", i, a)
		}
		if i > 0 && a < even[i-1] {
			t.Fatalf("arrivals out of order at %d", i)
		}
	}
	if a, _ := rampArrivals([]Stage{{100, 100 * time.Second}}, 1, false, 1e6, 1); len(a) < 9700 || len(a) > 10300 {
		t.Errorf("%d Poisson arrivals at 100/s for 100 s", len(a))
	}
	if a, first := rampArrivals(r, 2, true, 7, 1); len(a) != 7 || !slices.Equal(first, []int{0, 7, 7, 7}) {
		t.Errorf("%d arrivals from 7 requests, stages at %v", len(a), first)
	}
}

// TestRampMarksUnstableStage: one engine under a light stage keeps up; under a stage
// far past its capacity its queue still grows at the stage's end, and the stage is
// marked unstable, its requests waiting longer.
func TestRampMarksUnstableStage(t *testing.T) {
	w, err := SharedContext(SharedContextConfig{Seed: 1, Requests: 4000, Groups: 4, GroupTokens: 2000, UsersPerGroup: 1000, QueryTokens: 2000, Output: 200})
	if err != nil {
		t.Fatal(err)
	}
	cfg := TimedConfig{Config: Config{Workers: 1, EventDelay: -1, Seed: 1}, MaxNumSeqs: 32,
		Ramp: Ramp{Stages: []Stage{{0.5, 60 * time.Second}, {40, 60 * time.Second}}}}
	res := simulate(t, w, "round-robin", cfg)
	if len(res.Stages) != 2 {
		t.Fatalf("%d stages", len(res.Stages))
	}
	light, heavy := res.Stages[0], res.Stages[1]
	t.Logf("light: %d requests, p90 %.3f s, queue %d -> %d; heavy: %d requests, p90 %.3f s, queue %d -> %d",
		light.Requests, light.TTFT.P90, light.QueueMid, light.QueueEnd, heavy.Requests, heavy.TTFT.P90, heavy.QueueMid, heavy.QueueEnd)
	if light.Unstable || !heavy.Unstable {
		t.Errorf("unstable: light %v, heavy %v; want false, true", light.Unstable, heavy.Unstable)
	}
	if light.Requests < 15 || heavy.Requests < 2000 || !(heavy.TTFT.P90 > 10*light.TTFT.P90) {
		t.Errorf("light %d requests p90 %v, heavy %d p90 %v", light.Requests, light.TTFT.P90, heavy.Requests, heavy.TTFT.P90)
	}
	if light.Start != 0 || heavy.Start != 60*time.Second || light.OutputTokPerS <= 0 {
		t.Errorf("starts %v %v, light output %v tok/s", light.Start, heavy.Start, light.OutputTokPerS)
	}
	if _, err := Simulate(t.Context(), tinyWorkload([3]int{0, 8, 1}), mustRouting(t, "round-robin"), TimedConfig{Config: Config{Workers: 1, EventDelay: -1}, Ramp: cfg.Ramp}); err == nil {
		t.Error("a ramp over a trace's timestamps accepted")
	}
}

// TestRampSpreadsOutput: a request's tokens count in the stages it generated them in,
// in proportion to the time it spent in each.
func TestRampSpreadsOutput(t *testing.T) {
	st := newRampState(Ramp{Stages: []Stage{{1, 10 * time.Second}, {1, 10 * time.Second}, {1, 10 * time.Second}}}, []int{0, 1, 2, 2})
	st.generated(0, 300, 5*time.Second, 35*time.Second) // 5 s, 10 s, 10 s, then 5 s past the end
	st.generated(1, 7, 12*time.Second, 12*time.Second)
	want := []float64{50, 107, 100}
	for i, w := range want {
		if d := st.out[i] - w; d > 1e-9 || d < -1e-9 {
			t.Errorf("stage %d: %v tokens, want %v", i, st.out[i], w)
		}
	}
}

// TestRampDrainsStages: with Drain a stage's requests all finish before the next stage
// starts, Pause after the last of them (or after the stage's Duration, if later), its
// arrivals shifted by as much; back to back the heavy stage's queue spills into the
// next. Each drained stage's span reaches its last request's finish.
func TestRampDrainsStages(t *testing.T) {
	w, err := SharedContext(SharedContextConfig{Seed: 1, Requests: 4000, Groups: 4, GroupTokens: 2000, UsersPerGroup: 1000, QueryTokens: 2000, Output: 200})
	if err != nil {
		t.Fatal(err)
	}
	stages := []Stage{{40, 20 * time.Second}, {0.5, 20 * time.Second}, {0, 5 * time.Second}, {0.5, 20 * time.Second}}
	var outs []RequestOutcome
	cfg := TimedConfig{Config: Config{Workers: 1, EventDelay: -1, Seed: 1}, MaxNumSeqs: 32,
		Ramp: Ramp{Stages: stages, Drain: true, Pause: 3 * time.Second}, OnFinish: func(o RequestOutcome) { outs = append(outs, o) }}
	res := simulate(t, w, "round-robin", cfg)
	st := res.Stages
	if len(st) != 4 || st[0].Requests < 600 || st[1].Requests == 0 || st[2].Requests != 0 {
		t.Fatalf("stages %+v", st)
	}
	// Every request finished; the stage each belongs to (by arrival order) ended
	// before the next stage's first arrival.
	last := make([]time.Duration, len(st))
	firstArr := make([]time.Duration, len(st))
	for i := range firstArr {
		firstArr[i] = time.Duration(1 << 62)
	}
	idx := 0
	bounds := []int{st[0].Requests, st[0].Requests + st[1].Requests, st[0].Requests + st[1].Requests, len(outs)}
	slices.SortFunc(outs, func(a, b RequestOutcome) int { return a.Index - b.Index })
	for _, o := range outs {
		for o.Index >= bounds[idx] {
			idx++
		}
		last[idx] = max(last[idx], o.Finish)
		firstArr[idx] = min(firstArr[idx], o.Arrival)
	}
	if len(outs) != st[0].Requests+st[1].Requests+st[3].Requests {
		t.Fatalf("%d finished, stages sent %d", len(outs), st[0].Requests+st[1].Requests+st[3].Requests)
	}
	if want := last[0] + 3*time.Second; st[1].Start != want || firstArr[1] < want {
		t.Errorf("stage 2 starts at %v (first arrival %v), want %v: 3 s after stage 1's last finish", st[1].Start, firstArr[1], want)
	}
	if st[0].Span != last[0]-st[0].Start || st[0].Span <= st[0].Duration {
		t.Errorf("stage 1 span %v, last finish %v", st[0].Span, last[0])
	}
	// The empty stage lasts its Duration, then the pause.
	if want := st[1].Start + max(st[1].Span, st[1].Duration) + 3*time.Second + 5*time.Second + 3*time.Second; st[3].Start != want {
		t.Errorf("stage 4 starts at %v, want %v", st[3].Start, want)
	}
	// The light stage after the heavy one waits for nothing; back to back it inherits
	// the heavy stage's queue.
	if st[1].TTFT.P90 > 2 || !st[1].Drained {
		t.Errorf("drained light stage p90 %.3f s", st[1].TTFT.P90)
	}
	cfg.Ramp.Drain, cfg.OnFinish = false, nil
	cont := simulate(t, w, "round-robin", cfg).Stages
	if !(cont[1].TTFT.P90 > 10*st[1].TTFT.P90) || cont[1].Start != 20*time.Second {
		t.Errorf("back to back: light stage p90 %.3f s from %v, drained %.3f s", cont[1].TTFT.P90, cont[1].Start, st[1].TTFT.P90)
	}
	want := 0.0
	for _, o := range outs[:st[0].Requests] {
		want += float64(o.Output)
	}
	if got := st[0].OutputTokPerS * st[0].Span.Seconds(); got < want-1e-6 || got > want+1e-6 {
		t.Errorf("stage 1 output %v tokens over its span, its requests generated %v", got, want)
	}
}
