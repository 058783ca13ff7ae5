package sim

import (
	"testing"
	"time"
)

func TestParseRamp(t *testing.T) {
	r, even, err := ParseRamp("2:5, 0:5,4:5")
	if err != nil || even || len(r) != 3 || r[1] != (Stage{0, 5 * time.Second}) || r[2].Rate != 4 {
		t.Fatalf("%v %v", r, err)
	}
	for _, n := range RampNames() {
		if _, even, err := ParseRamp(n); err != nil || even != (n == "llm-d-37-capacity") {
			t.Errorf("%s: %v, even %v", n, err, even)
		}
	}
	if g := Ramps["llm-d-guide"]; len(g) != 17 || g[0] != (Stage{15, 50 * time.Second}) || g[16] != (Stage{60, 25 * time.Second}) {
		t.Errorf("llm-d-guide: %v", g)
	}
	for _, bad := range []string{"", "3", "3:0", "-1:5", "x:5", "3:-1", "3:1e9"} {
		if _, _, err := ParseRamp(bad); err == nil {
			t.Errorf("ramp %q accepted", bad)
		}
	}
}

// TestRampArrivals: evenly spaced stages send rate x duration requests each, none in
// a pause; Poisson stages about as many; the requests running out ends the ramp.
func TestRampArrivals(t *testing.T) {
	r := []Stage{{2, 5 * time.Second}, {0, 5 * time.Second}, {4, 5 * time.Second}}
	even := rampArrivals(r, 1, true, 1000, 1)
	if len(even) != 30 {
		t.Fatalf("%d even arrivals, want 30", len(even))
	}
	for i, a := range even {
		if a >= 5*time.Second && a < 10*time.Second {
			t.Errorf("arrival %d at %v, in the pause", i, a)
		}
		if i > 0 && a < even[i-1] {
			t.Fatalf("arrivals out of order at %d", i)
		}
	}
	if n := len(rampArrivals([]Stage{{100, 100 * time.Second}}, 1, false, 1e6, 1)); n < 9700 || n > 10300 {
		t.Errorf("%d Poisson arrivals at 100/s for 100 s", n)
	}
	if n := len(rampArrivals(r, 2, true, 7, 1)); n != 7 {
		t.Errorf("%d arrivals from 7 requests", n)
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
		Ramp: []Stage{{0.5, 60 * time.Second}, {40, 60 * time.Second}}}
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
	st := newRampState([]Stage{{1, 10 * time.Second}, {1, 10 * time.Second}, {1, 10 * time.Second}})
	st.generated(300, 5*time.Second, 35*time.Second) // 5 s, 10 s, 10 s, then 5 s past the end
	st.generated(7, 12*time.Second, 12*time.Second)
	want := []float64{50, 107, 100}
	for i, w := range want {
		if d := st.out[i] - w; d > 1e-9 || d < -1e-9 {
			t.Errorf("stage %d: %v tokens, want %v", i, st.out[i], w)
		}
	}
}
