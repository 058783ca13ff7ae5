package report

import (
	"bytes"
	"fmt"
	"math"
	"strings"
	"testing"

	"github.com/kvindex/kvindex/internal/testsize"
	"github.com/kvindex/kvindex/sim"
	"go.uber.org/goleak"
	"time"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestValidate runs the validation table, short (every ramp stage a tenth as long, two
// users a group for the all-at-once row) in make test and in full in make test-long,
// and checks that every row prints every check with finite figures. In full, every
// direction must hold, as sim/VALIDATION.md reports.
func TestValidate(t *testing.T) {
	scale := 0.1
	if testsize.Long() {
		scale = 1
	}
	rows, err := Validate(t.Context(), ValidateConfig{Scale: scale, Parallel: 2})
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != 4 {
		t.Fatalf("%d rows, want 4", len(rows))
	}
	var out bytes.Buffer
	PrintValidation(&out, rows)
	holds, n := 0, 0
	for _, r := range rows {
		if len(r.Checks) < 2 || !strings.Contains(out.String(), r.Source) {
			t.Errorf("%s: %d checks, printed: %v", r.Source, len(r.Checks), strings.Contains(out.String(), r.Source))
		}
		for _, c := range r.Checks {
			if math.IsNaN(c.Simulated) || math.IsInf(c.Simulated, 0) || c.Published <= 0 {
				t.Errorf("%s: %s: published %v, simulated %v", r.Source, c.Claim, c.Published, c.Simulated)
			}
			n++
			if c.Holds {
				holds++
			}
		}
	}
	t.Logf("scale %g:\n%s", scale, out.String())
	if scale == 1 && holds < n {
		t.Errorf("%d of %d checks hold their direction, want all (sim/VALIDATION.md)", holds, n)
	}
	if _, err := Validate(t.Context(), ValidateConfig{Scale: 2}); err == nil {
		t.Error("scale 2 accepted")
	}
}

// TestKneeAndLadder: the helpers the checks use, by hand.
func TestKneeAndLadder(t *testing.T) {
	st := stagesOf([][3]float64{{3, 10, 0.1}, {10, 10, 0.5}, {15, 20, 1.9}, {20, 10, 5}, {25, 10, 0.1}})
	if k := knee(st, 0, 2); k != 15 {
		t.Errorf("knee %v, want 15 (the first stage past 2 s ends it)", k)
	}
	st[2].Unstable = true
	if k := knee(st, 0, 2); k != 10 {
		t.Errorf("knee %v with 15 unstable, want 10", k)
	}
	if p := p90(st[2]); p != 20 {
		t.Errorf("an unstable stage's p90 %v, want its 20 s length", p)
	}
	st[2].Drained = true
	if p, k := p90(st[2]), knee(st, 0, 2); p != 1.9 || k != 15 {
		t.Errorf("a drained unstable stage: p90 %v, knee %v; want its own 1.9 s, 15", p, k)
	}
	st[2].Span = 30 * time.Second // drained 10 s past its Duration
	for i := range st {
		st[i].OutputTokPerS = 100 * float64(i)
	}
	// Stages 2-5 (after the warm-up), by their spans: (100x10 + 200x30 + 300x10 +
	// 400x10) / 60.
	if got := ladderOutput(st); got != 14000.0/60 {
		t.Errorf("ladder output %v, want %v", got, 14000.0/60)
	}
}

// stagesOf builds stages from (rate, seconds, p90) triples.
func stagesOf(x [][3]float64) []sim.StageResult {
	out := make([]sim.StageResult, len(x))
	for i, s := range x {
		d := time.Duration(s[1] * float64(time.Second))
		out[i] = sim.StageResult{Stage: sim.Stage{Rate: s[0], Duration: d}, Span: d, TTFT: sim.Latency{P90: s[2]}}
	}
	return out
}

// TestRunParallel: the validation runs every run once, two at a time sharing one
// workload, each result its own, and reports each finished run (the pool, package
// internal/parallel, runs under the race detector in its own tests).
func TestRunParallel(t *testing.T) {
	w, err := sim.Generate(sim.GenConfig{Seed: 1, Requests: 200, Sessions: 16})
	if err != nil {
		t.Fatal(err)
	}
	cfg := sim.TimedConfig{Config: sim.Config{Workers: 4, Capacity: 800, EventDelay: -1, Seed: 1}}
	var all [][]run
	for i, names := range [][]string{{"kv-aware-scorer", "round-robin"}, {"round-robin"}} {
		var rs []run
		for j, n := range names {
			rt, err := sim.ParseRouting(n)
			if err != nil {
				t.Fatal(err)
			}
			rs = append(rs, run{name: fmt.Sprintf("%d/%d %s", i, j, n), w: w, rt: rt, cfg: cfg})
		}
		all = append(all, rs)
	}
	var done []string // appended by the pool's workers, one at a time
	if err := runParallel(t.Context(), all, 2, func(name string) { done = append(done, name) }); err != nil {
		t.Fatal(err)
	}
	if len(done) != 3 {
		t.Fatalf("progress reported %v, want 3 runs", done)
	}
	for _, rs := range all {
		for _, x := range rs {
			if x.res.Requests != len(w.Requests) {
				t.Errorf("%s: %d requests, want %d", x.name, x.res.Requests, len(w.Requests))
			}
		}
	}
	// The two round-robin runs share the workload and the seed: the same result.
	if a, b := all[0][1].res, all[1][0].res; a.HitBlocks != b.HitBlocks || a.Blocks != b.Blocks {
		t.Errorf("round-robin twice: %d/%d and %d/%d hit blocks", a.HitBlocks, a.Blocks, b.HitBlocks, b.Blocks)
	}
}
