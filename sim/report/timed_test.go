package report

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kvindex/kvindex/sim"
)

func smallRun(t *testing.T, sw Sweep, chart string, ramp sim.Ramp) (*TimedReport, string) {
	t.Helper()
	w, err := sim.Generate(sim.GenConfig{Seed: 1, Requests: 300, Sessions: 24})
	if err != nil {
		t.Fatal(err)
	}
	var rts []sim.Routing
	for _, n := range []string{"kv-aware-scorer", "round-robin"} {
		rt, err := sim.ParseRouting(n)
		if err != nil {
			t.Fatal(err)
		}
		rts = append(rts, rt)
	}
	var warn bytes.Buffer
	rep, err := RunTimed(Timed{Workload: w, Info: WorkloadInfo{Name: w.Name, Requests: len(w.Requests), BlockSize: w.BlockSize},
		Config:   sim.TimedConfig{Config: sim.Config{Workers: 4, Capacity: 800, EventDelay: -1, Seed: 1}, Ramp: ramp},
		CostName: "test", Routings: rts, Sweep: sw, Chart: chart, Warn: &warn, Parallel: 2})
	if err != nil {
		t.Fatal(err)
	}
	return rep, warn.String()
}

// TestRunTimed: one run per policy, the measured index on the exact one, the tables
// naming the recommended policy, and the JSON round-trips.
func TestRunTimed(t *testing.T) {
	rep, _ := smallRun(t, Sweep{}, "", sim.Ramp{})
	out := rep.JSON
	scorer := out.Policies[0].Name // the canonical name of kv-aware-scorer
	if len(out.Policies) != 2 || scorer != Recommended || out.Index == nil || out.Index.Policy != scorer {
		t.Fatalf("policies %+v, index %+v", out.Policies, out.Index)
	}
	if p := out.Policies[0]; p.TTFTp90 <= 0 || p.Turns == 0 || p.BlockHitRate <= out.Policies[1].BlockHitRate {
		t.Errorf("kv-aware-scorer: p90 %v, %d turns, block hit %v against round-robin's %v", p.TTFTp90, p.Turns, p.BlockHitRate, out.Policies[1].BlockHitRate)
	}
	var b bytes.Buffer
	rep.Print(&b)
	for _, want := range []string{"workload  ", "recommended: " + Recommended, "index (the " + scorer + " run", "waited"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("tables lack %q:\n%s", want, b.String())
		}
	}
	if _, err := json.Marshal(out); err != nil {
		t.Fatal(err)
	}
}

// TestRunTimedSweepAndRamp: a sweep of two points warns that it draws no curve and
// writes its chart; a ramp's stages reach the JSON and the tables.
func TestRunTimedSweepAndRamp(t *testing.T) {
	sw, err := ParseSweep("speedup=0.5,1")
	if err != nil {
		t.Fatal(err)
	}
	chart := filepath.Join(t.TempDir(), "c.png")
	rep, warn := smallRun(t, sw, chart, sim.Ramp{})
	if len(rep.JSON.Sweep) != 2 || !strings.Contains(warn, "at least 3") {
		t.Errorf("%d points, warning %q", len(rep.JSON.Sweep), warn)
	}
	if b, err := os.ReadFile(chart); err != nil || !bytes.HasPrefix(b, []byte("\x89PNG")) {
		t.Errorf("chart: %v", err)
	}
	if _, err := ParseSweep("speedup=1"); err == nil {
		t.Error("a sweep of one point accepted")
	}
	rep, _ = smallRun(t, Sweep{}, "", sim.Ramp{Stages: []sim.Stage{{Rate: 2, Duration: 20 * time.Second}, {Rate: 8, Duration: 20 * time.Second}}})
	if st := rep.JSON.Policies[0].Stages; len(st) != 2 || st[1].Rate != 8 || st[0].Requests == 0 {
		t.Fatalf("stages %+v", st)
	}
	var b bytes.Buffer
	rep.Print(&b)
	if !strings.Contains(b.String(), "by stage:") {
		t.Errorf("no stage table:\n%s", b.String())
	}
}

// TestRunTimedBothAffinities: with several routers every policy runs without and with
// session affinity at the front, the second row marked.
func TestRunTimedBothAffinities(t *testing.T) {
	w, err := sim.Generate(sim.GenConfig{Seed: 1, Requests: 200, Sessions: 24})
	if err != nil {
		t.Fatal(err)
	}
	rt, err := sim.ParseRouting("approximate-lru-scorer")
	if err != nil {
		t.Fatal(err)
	}
	rep, err := RunTimed(Timed{Workload: w, Config: sim.TimedConfig{Config: sim.Config{Workers: 4, Capacity: 800, EventDelay: -1, Seed: 1}, Routers: 2},
		Routings: []sim.Routing{rt}, Parallel: 2, BothAffinities: true})
	if err != nil {
		t.Fatal(err)
	}
	p := rep.JSON.Policies
	if len(p) != 2 || p[0].Name != rt.Name || p[0].Affinity != "none" ||
		p[1].Name != rt.Name+affinitySuffix || p[1].Affinity != "session" {
		t.Fatalf("rows %+v", p)
	}
}
