package report

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	kvengine "github.com/kvindex/kvindex/engine"
	"github.com/kvindex/kvindex/sim"
)

// zeroTimeRun runs the zero-time experiment on a small built-in workload (4 workers of
// 600 blocks, a fraction of a second a run) and returns it with its JSON and tables.
func zeroTimeRun(t *testing.T, policies string, sp ZeroTimeSweep, chart string, tier func(*sim.Config)) (*ZeroTimeReport, string, string) {
	t.Helper()
	w, err := sim.Generate(sim.GenConfig{Seed: 1, Requests: 400, Sessions: 24})
	if err != nil {
		t.Fatal(err)
	}
	var pols []sim.Policy
	for _, n := range strings.Split(policies, ",") {
		p, err := sim.ParsePolicy(n)
		if err != nil {
			t.Fatal(err)
		}
		pols = append(pols, p)
	}
	cfg := sim.Config{Workers: 4, Capacity: 600, ChunkTokens: sim.DefaultChunkTokens, Seed: 1,
		Engine: kvengine.Config{Shards: 2}, EventDelay: -1}
	if tier != nil {
		tier(&cfg)
	}
	if err := sp.CheckFleet(cfg.Workers, cfg.Capacity, cfg.HostCapacity); err != nil {
		t.Fatal(err)
	}
	if err := sp.CheckWorkload(cfg.Capacity, w); err != nil {
		t.Fatal(err)
	}
	rep, err := RunZeroTime(context.Background(), ZeroTime{Workload: w, Info: Describe(w, "built-in", ""), Config: cfg,
		Policies: pols, Sweep: sp, Chart: chart})
	if err != nil {
		t.Fatal(err)
	}
	b, err := json.Marshal(rep.JSON)
	if err != nil {
		t.Fatal(err)
	}
	var tables bytes.Buffer
	rep.Print(&tables)
	return rep, string(b), tables.String()
}

// TestRunZeroTimeJSON: one run per policy, none above the ceiling, the index measured on
// the exact one, and what a run did not measure absent from the JSON, not 0.
func TestRunZeroTimeJSON(t *testing.T) {
	_, out, tables := zeroTimeRun(t, DefaultZeroTimePolicies, ZeroTimeSweep{}, "", nil)
	var got struct {
		Workload struct {
			Source   string `json:"source"`
			Requests int    `json:"requests"`
		} `json:"workload"`
		Ceiling struct {
			BlockHitRate *float64 `json:"block_hit_rate"`
		} `json:"ceiling"`
		Policies []struct {
			Name         string         `json:"name"`
			BlockHitRate *float64       `json:"block_hit_rate"`
			TokenHitRate *float64       `json:"token_hit_rate"`
			MaxMeanLoad  *float64       `json:"max_mean_load"`
			Index        map[string]any `json:"index"`
		} `json:"policies"`
		Index struct {
			Policy             string   `json:"policy"`
			BlockOpsPerS       *float64 `json:"block_ops_per_s"`
			P50                *int64   `json:"find_matches_p50_ns"`
			P99                *int64   `json:"find_matches_p99_ns"`
			Memberships        *int64   `json:"memberships"`
			BytesPerMembership *float64 `json:"bytes_per_membership"`
		} `json:"index"`
	}
	if err := json.Unmarshal([]byte(out), &got); err != nil {
		t.Fatalf("%v in %s", err, out)
	}
	if got.Workload.Source != "built-in" || got.Workload.Requests != 400 || got.Ceiling.BlockHitRate == nil {
		t.Fatalf("workload/ceiling: %s", out)
	}
	names := strings.Split(DefaultZeroTimePolicies, ",")
	if len(got.Policies) != len(names) {
		t.Fatalf("policies: %s", out)
	}
	for i, p := range got.Policies {
		if p.Name != names[i] || p.BlockHitRate == nil || p.TokenHitRate == nil || p.MaxMeanLoad == nil {
			t.Fatalf("policy %d: %+v", i, p)
		}
		if *p.BlockHitRate > *got.Ceiling.BlockHitRate {
			t.Fatalf("%s above the ceiling", p.Name)
		}
		_, has := p.Index["find_matches_p50_ns"]
		if queried := p.Index["queries"].(float64) > 0; has != queried || p.Name == "longest-prefix/exact" && !has {
			t.Errorf("%s: %v queries, find_matches_p50_ns present %v", p.Name, p.Index["queries"], has)
		}
	}
	ix := got.Index
	if ix.Policy != "longest-prefix/exact" || ix.BlockOpsPerS == nil || *ix.BlockOpsPerS <= 0 || ix.P50 == nil || ix.P99 == nil ||
		*ix.P50 <= 0 || ix.Memberships == nil || *ix.Memberships <= 0 || ix.BytesPerMembership == nil || *ix.BytesPerMembership <= 0 {
		t.Fatalf("index: %s", out)
	}
	// Without a host tier the JSON has none of the tier fields.
	for _, field := range []string{"host_", "prefill_work", "tier_weights", "loaded_tokens", "orphan"} {
		if strings.Contains(out, field) {
			t.Errorf("a run without a host tier reports %q: %s", field, out)
		}
	}
	for _, want := range []string{"workload  built-in conversations", "infinite cache", "block ops/s", "find-matches     p50",
		"bytes per membership", "max/mean reqs", "max/mean tokens"} {
		if !strings.Contains(tables, want) {
			t.Errorf("tables lack %q:\n%s", want, tables)
		}
	}
}

// TestRunZeroTimeCapacitySweep writes the chart in each format (an SVG carrying its
// fonts: a viewer without them would clip the labels) and a JSON point per capacity
// that does not measure the heap.
func TestRunZeroTimeCapacitySweep(t *testing.T) {
	dir := t.TempDir()
	for _, ext := range []string{".svg", ".png"} {
		chart := filepath.Join(dir, "sweep"+ext)
		rep, out, tables := zeroTimeRun(t, "kv-aware,least-loaded", ZeroTimeSweep{Caps: []int{600, 900}}, chart, nil)
		if !strings.Contains(tables, "chart written to "+chart) || !strings.Contains(tables, "least-loaded") {
			t.Fatalf("tables:\n%s", tables)
		}
		if len(rep.JSON.Sweep) != 2 || rep.JSON.Sweep[1].Capacity != 900 || len(rep.JSON.Sweep[0].Policies) != 2 || rep.JSON.Cluster.Capacity != 0 {
			t.Fatalf("sweep JSON: %s", out)
		}
		if strings.Contains(out, "bytes_per_membership") {
			t.Errorf("sweep points do not measure the heap, yet the JSON has bytes_per_membership: %s", out)
		}
		b, err := os.ReadFile(chart)
		if err != nil {
			t.Fatal(err)
		}
		if ext == ".svg" && (!bytes.Contains(b[:min(len(b), 512)], []byte("<svg")) || !bytes.Contains(b, []byte("@font-face"))) ||
			ext == ".png" && !bytes.HasPrefix(b, []byte("\x89PNG")) {
			t.Fatalf("%s is not a chart: %q", chart, b[:min(len(b), 64)])
		}
	}
}

func TestRunZeroTimeEventDelaySweep(t *testing.T) {
	chart := filepath.Join(t.TempDir(), "delay.svg")
	_, _, tables := zeroTimeRun(t, "kv-aware,kv-aware-predict,approximate",
		ZeroTimeSweep{Delays: []time.Duration{0, 50 * time.Millisecond, 2 * time.Second}}, chart, nil)
	for _, want := range []string{"block hit rate by event delay", "longest-prefix/exact+predict", "longest-prefix/approx-ttl", "50ms", "chart written to " + chart} {
		if !strings.Contains(tables, want) {
			t.Fatalf("no %q in:\n%s", want, tables)
		}
	}
	if b, err := os.ReadFile(chart); err != nil || !bytes.Contains(b, []byte("<svg")) {
		t.Fatalf("chart: %v", err)
	}
}

// TestRunZeroTimeHostTier: a host-capacity sweep reports the host's hit rate (0 without
// a host) and a prefill work between the tokens not hit and a cold cache's; a plain run
// with a host tier has the host's columns.
func TestRunZeroTimeHostTier(t *testing.T) {
	chart := filepath.Join(t.TempDir(), "tiers.svg")
	_, out, tables := zeroTimeRun(t, TierPolicies, ZeroTimeSweep{Hosts: []int{0, 300, 1200}}, chart, nil)
	for _, want := range []string{"by host capacity", "host tier: the swept number of blocks", "prefill work", "longest-prefix/exact:weighted-tiers",
		"longest-prefix/exact:any-tier", "1,200    longest-prefix/exact", "chart written to " + chart} {
		if !strings.Contains(tables, want) {
			t.Fatalf("no %q in:\n%s", want, tables)
		}
	}
	if b, err := os.ReadFile(chart); err != nil || !bytes.Contains(b, []byte("<svg")) || !bytes.Contains(b, []byte("@font-face")) {
		t.Fatalf("chart: %v", err)
	}
	var got struct {
		Cluster struct {
			HostCapacity *int      `json:"host_capacity_blocks"`
			HostLoadCost *float64  `json:"host_load_cost"`
			TierWeights  []float64 `json:"tier_weights"`
		} `json:"cluster"`
		Sweep []struct {
			HostCapacity *int `json:"host_capacity"`
			Policies     []struct {
				Name         string   `json:"name"`
				HostHitRate  *float64 `json:"host_block_hit_rate"`
				PrefillWork  *float64 `json:"prefill_work"`
				TokenHitRate float64  `json:"token_hit_rate"`
			} `json:"policies"`
		} `json:"sweep"`
	}
	if err := json.Unmarshal([]byte(out), &got); err != nil || len(got.Sweep) != 3 || got.Sweep[2].HostCapacity == nil || *got.Sweep[2].HostCapacity != 1200 ||
		got.Cluster.HostCapacity != nil || got.Cluster.HostLoadCost == nil || *got.Cluster.HostLoadCost != sim.DefaultHostLoadCost || len(got.Cluster.TierWeights) != 3 {
		t.Fatalf("sweep JSON %v: %s", err, out)
	}
	for _, pt := range got.Sweep {
		for _, p := range pt.Policies {
			if p.HostHitRate == nil || p.PrefillWork == nil || (*pt.HostCapacity == 0) != (*p.HostHitRate == 0) ||
				*p.PrefillWork < 1-p.TokenHitRate-1e-9 || *p.PrefillWork > 1 {
				t.Fatalf("host %d, %s: %+v", *pt.HostCapacity, p.Name, p)
			}
		}
	}

	_, _, tables = zeroTimeRun(t, "kv-aware,kv-weighted", ZeroTimeSweep{}, "", func(c *sim.Config) {
		c.HostCapacity, c.HostLoadCost, c.TierWeights = 600, 0.5, kvengine.Weights{1, 0.5, 0}
	})
	for _, want := range []string{"host tier: 600 blocks per engine; loading a block costs 0.5", "weights 1,0.5,0", "device hit", "host hit", "host memberships"} {
		if !strings.Contains(tables, want) {
			t.Fatalf("no %q in:\n%s", want, tables)
		}
	}
}

// TestParseZeroTimeSweep: each parameter's bounds, and at least two points.
func TestParseZeroTimeSweep(t *testing.T) {
	for s, want := range map[string]int{"capacity=600, 1200": 2, "event-delay=0,50ms,2s": 3, "host-capacity=0,300": 2} {
		if sp, err := ParseZeroTimeSweep(s); err != nil || sp.Points() != want {
			t.Errorf("%q: %d points, %v", s, sp.Points(), err)
		}
	}
	for _, s := range []string{"capacity=0,600", "capacity=600", "event-delay=0,-5ms", "host-capacity=0,-4", "workers=1,2", "capacity"} {
		if _, err := ParseZeroTimeSweep(s); err == nil {
			t.Errorf("%q: no error", s)
		}
	}
}

// TestZeroTimeColumnsAlign: the policy tables' rows line up with their header whatever
// the policies' names (the registry's run to 28 characters and more).
func TestZeroTimeColumnsAlign(t *testing.T) {
	for _, tc := range []struct {
		name string
		sp   ZeroTimeSweep
	}{{"run", ZeroTimeSweep{}}, {"sweep", ZeroTimeSweep{Delays: []time.Duration{0, 50 * time.Millisecond}}}} {
		_, _, tables := zeroTimeRun(t, "longest-prefix/exact+predict,random,longest-prefix/approx-ttl", tc.sp, filepath.Join(t.TempDir(), "c.svg"), nil)
		lines := strings.Split(tables, "\n")
		start := -1
		for i, l := range lines {
			if strings.HasPrefix(l, "policy ") {
				start = i
				break
			}
		}
		if start < 0 {
			t.Fatalf("%s: no policy table in:\n%s", tc.name, tables)
		}
		rows := 0
		for _, l := range lines[start+1:] {
			if l == "" {
				break
			}
			rows++
			if len(l) != len(lines[start]) {
				t.Errorf("%s: row %q is %d wide, its header %d:\n%s", tc.name, l, len(l), len(lines[start]), tables)
			}
		}
		if rows < 3 {
			t.Errorf("%s: %d rows under the header:\n%s", tc.name, rows, tables)
		}
	}
}
