package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/kvindex/kvindex/sim"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// quickSim are flags that make a built-in run take a fraction of a second.
var quickSim = []string{"--requests", "400", "--sessions", "24", "--workers", "4", "--capacity", "600", "--shards", "2"}

func runCLI(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var o, e bytes.Buffer
	code = runMain(args, &o, &e)
	return code, o.String(), e.String()
}

func TestSimBadFlags(t *testing.T) {
	chart := filepath.Join(t.TempDir(), "never.svg") // a case that wrongly passes writes here
	tests := []struct {
		args []string
		want string
	}{
		{[]string{"--speedup", "0"}, "--speedup 0"},
		{[]string{"--speedup", "1e9"}, "--speedup 1e+09"},
		{[]string{"--routers", "0"}, "--routers 0"},
		{[]string{"--router-affinity", "sticky"}, `--router-affinity "sticky"`},
		{[]string{"--overlap-weight", "-1"}, "--overlap-weight -1"},
		{[]string{"--queue-threshold", "2e6"}, "--queue-threshold 2e+06"},
		{[]string{"--approx-block", "-1"}, "--approx-block -1"},
		{[]string{"--approx-max-blocks", "-1"}, "--approx-max-blocks -1"},
		{[]string{"--prefix-weight", "-1"}, "--prefix-weight -1"},
		{[]string{"--prefix-weight", "0", "--kv-weight", "0", "--queue-weight", "0"}, "all 0"},
		{[]string{"--slo-ttft", "-1s"}, "--slo-ttft -1s"},
		{[]string{"--output-length", "-1"}, "--output-length -1"},
		{[]string{"--max-num-seqs", "0"}, "--max-num-seqs 0"},
		{[]string{"--metrics-interval", "0"}, "--metrics-interval 0s"},
		{[]string{"--jobs", "-1"}, "--jobs -1"},
		{[]string{"--host-capacity", "600"}, "host tiers are simulated by --zero-time only"},
		{[]string{"--tier-weights", "1,0.5,0"}, "host tiers are simulated by --zero-time only"},
		{[]string{"--zero-time", "--routers", "2"}, "--routers applies to the simulation under time"},
		{[]string{"--zero-time", "--speedup", "2"}, "--speedup applies to the simulation under time"},
		{[]string{"--workload", "agents"}, `--workload "agents"`},
		{[]string{"--groups", "3"}, "apply to --workload shared-context"},
		{[]string{"--workload", "shared-context", "--groups", "0"}, "--groups 0"},
		{[]string{"--workload", "shared-context", "--query-tokens", "0"}, "--query-tokens 0"},
		{[]string{"--workload", "shared-context", "--sessions", "3"}, "--sessions applies to the built-in workload"},
		{[]string{"--workload", "shared-context", "--trace", "x.jsonl"}, "--workload and --trace: give one"},
		{[]string{"--sweep", "speedup=0,1"}, `speedup "0"`},
		{[]string{"--sweep", "routers=1,0"}, `routers "0"`},
		{[]string{"--sweep", "host-capacity=0,600"}, "host-capacity needs --zero-time"},
		{[]string{"--workers", "0"}, "--workers 0"},
		{[]string{"--workload", "shared-context", "--ramp", "llm-d-guide", "--ramp-stages", "drain:-1s"}, "--ramp-stages: ramp stages"},
		{[]string{"--workload", "shared-context", "--ramp", "2:5", "--ramp-stages", "overlap"}, `ramp stages "overlap"`},
		{[]string{"--workload", "shared-context", "--ramp-stages", "drain"}, "--ramp-stages without --ramp"},
		{[]string{"--zero-time", "--ramp-stages", "drain"}, "--ramp-stages applies to the simulation under time"},
		{[]string{"--workers", "99999"}, "--workers 99999"},
		{[]string{"--capacity", "0"}, "--capacity 0"},
		{[]string{"--capacity", "3", "--requests", "50"}, "cannot hold the longest request"},
		{[]string{"--capacity", "99999999"}, "--capacity 99999999"},
		{[]string{"--workers", "4096", "--capacity", "100000"}, "more than 67108864 blocks in all"},
		{[]string{"--sweep", "capacity=600,99999999"}, `capacity "99999999"`},
		{[]string{"--sweep", "capacity=100,600", "--requests", "2000", "--chart", chart}, "capacity 100 blocks per worker cannot hold"},
		{[]string{"--block-size", "0"}, "--block-size 0"},
		{[]string{"--requests", "-1"}, "--requests -1"},
		{[]string{"--shards", "-1"}, "--shards -1"},
		{[]string{"--shards", "1000"}, "--shards 1000"},
		{[]string{"--jump", "-2"}, "--jump -2"},
		{[]string{"--chunk", "0"}, "--chunk 0"},
		{[]string{"--sessions", "0"}, "--sessions 0"},
		{[]string{"--trace", "x.jsonl", "--sessions", "3"}, "--sessions applies to the built-in workload"},
		{[]string{"--policies", "kv-aware,fastest"}, `unknown policy "fastest"`},
		{[]string{"--policies", "kv-weighted"}, `unknown policy "kv-weighted"`},
		{[]string{"--zero-time", "--policies", "kv-aware-scorer"}, `unknown policy "kv-aware-scorer" with --zero-time`},
		{[]string{"--sweep", "workers=1,2"}, "want speedup=X1,X2,..., routers="},
		{[]string{"--zero-time", "--sweep", "workers=1,2"}, "want capacity=A,B,C, event-delay=D1,D2,D3 or host-capacity"},
		{[]string{"--host-capacity", "-1"}, "--host-capacity -1"},
		{[]string{"--host-capacity", "99999999"}, "--host-capacity 99999999"},
		{[]string{"--workers", "4096", "--capacity", "8192", "--host-capacity", "16384"}, "more than 67108864 blocks in all"},
		{[]string{"--host-load-cost", "0"}, "--host-load-cost 0"},
		{[]string{"--host-load-cost", "1.5"}, "--host-load-cost 1.5"},
		{[]string{"--host-load-cost", "NaN"}, "--host-load-cost NaN"},
		{[]string{"--tier-weights", "1,0.75"}, "want three weights"},
		{[]string{"--tier-weights", "1,x,0"}, `"x" is not a number`},
		{[]string{"--tier-weights", "1,1.5,0"}, "weight of tier host"},
		{[]string{"--tier-weights", "0,0,0"}, "all zero"},
		{[]string{"--zero-time", "--sweep", "host-capacity=0,-4"}, `host capacity "-4"`},
		{[]string{"--zero-time", "--sweep", "host-capacity=0,99999999"}, `host capacity "99999999"`},
		{[]string{"--zero-time", "--sweep", "host-capacity=0,600", "--host-capacity", "5"}, "give one"},
		{[]string{"--zero-time", "--sweep", "host-capacity=0,16384", "--workers", "4096", "--capacity", "8192"}, "more than 67108864 blocks in all"},
		{[]string{"--zero-time", "--sweep", "capacity=600,8192", "--workers", "4096", "--host-capacity", "10000"}, "capacity 8192 + --host-capacity 10000"},
		{[]string{"--zero-time", "--sweep", "event-delay=0,-5ms"}, `event delay "-5ms"`},
		{[]string{"--event-delay", "-1s"}, "--event-delay"},
		{[]string{"--rate", "0"}, "--rate"},
		{[]string{"--sweep", "capacity=600"}, "at least two points"},
		{[]string{"--sweep", "capacity=600,abc"}, `capacity "abc"`},
		{[]string{"--sweep", "capacity=600,900", "--chart", "out.gif"}, "--chart"},
		{[]string{"--chart", "x.svg"}, "--chart needs --sweep"},
		{[]string{"--seed", "-1"}, "invalid value"},
		{[]string{"--bogus"}, "flag provided but not defined"},
		{[]string{"extra"}, `unexpected argument "extra"`},
	}
	for _, tc := range tests {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			code, out, errs := runCLI(t, append([]string{"sim"}, tc.args...)...)
			if code != 2 || !strings.Contains(errs, tc.want) || out != "" {
				t.Fatalf("exit %d, stdout %q, stderr %q; want exit 2 and %q", code, out, errs, tc.want)
			}
		})
	}
}

func TestGenOpsBadFlags(t *testing.T) {
	tests := []struct {
		args []string
		want string
	}{
		{nil, "--out FILE is required"},
		{[]string{"--out", "x", "--expect-every", "-1"}, "--expect-every -1"},
		{[]string{"--out", "x", "--policy", "best"}, `--policy "best"`},
		{[]string{"--out", "x", "--workers", "0"}, "--workers 0"},
		{[]string{"--out", "x", "--capacity", "2", "--requests", "50"}, "cannot hold the longest request"},
	}
	for _, tc := range tests {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			code, _, errs := runCLI(t, append([]string{"gen-ops"}, tc.args...)...)
			if code != 2 || !strings.Contains(errs, tc.want) {
				t.Fatalf("exit %d, stderr %q; want exit 2 and %q", code, errs, tc.want)
			}
		})
	}
}

func TestSimHelp(t *testing.T) {
	for _, c := range []string{"sim", "gen-ops"} {
		code, out, _ := runCLI(t, c, "-h")
		if code != 0 || !strings.Contains(out, "-capacity") {
			t.Fatalf("%s -h: exit %d, %q", c, code, out)
		}
	}
}

// TestSimZeroTimeJSON: --zero-time --json prints one JSON value of the workload the
// flags describe and the default policies, and nothing on stderr without a terminal or
// --progress (sim/report tests the experiment itself).
func TestSimZeroTimeJSON(t *testing.T) {
	code, out, errs := runCLI(t, append([]string{"sim", "--zero-time", "--json"}, quickSim...)...)
	if code != 0 || errs != "" {
		t.Fatalf("exit %d, stderr %q", code, errs)
	}
	var got struct {
		Workload struct {
			Source   string `json:"source"`
			Requests int    `json:"requests"`
		} `json:"workload"`
		Policies []struct {
			Name string `json:"name"`
		} `json:"policies"`
	}
	dec := json.NewDecoder(strings.NewReader(out))
	if err := dec.Decode(&got); err != nil || dec.More() {
		t.Fatalf("%v, more %v, in %s", err, dec.More(), out)
	}
	if got.Workload.Source != "built-in" || got.Workload.Requests != 400 || len(got.Policies) != 6 || got.Policies[0].Name != "longest-prefix/exact" {
		t.Fatalf("JSON: %s", out)
	}
}

func TestSimZeroTimeTable(t *testing.T) {
	code, out, errs := runCLI(t, append([]string{"sim", "--zero-time", "--policies", "kv-aware,random"}, quickSim...)...)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	for _, want := range []string{"workload  built-in conversations", "infinite cache", "longest-prefix/exact", "random",
		"block ops/s", "find-matches     p50", "bytes per membership", "max/mean reqs", "max/mean tokens"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "round-robin") {
		t.Errorf("--policies ignored:\n%s", out)
	}
}

func TestSimProgress(t *testing.T) {
	old := progressDelay
	progressDelay = 0
	defer func() { progressDelay = old }()
	code, _, errs := runCLI(t, append([]string{"sim", "--progress", "--policies", "round-robin"}, quickSim...)...)
	if code != 0 || !strings.Contains(errs, "simulating") || !strings.Contains(errs, "400/400") {
		t.Fatalf("exit %d, stderr %q", code, errs)
	}
	// The rate counts from the run's start, not from when the bar first shows: its
	// first reading is no burst of every request so far over nanoseconds.
	for _, m := range regexp.MustCompile(`([0-9]+) req/s`).FindAllStringSubmatch(errs, -1) {
		if r, _ := strconv.ParseFloat(m[1], 64); r > 1e8 {
			t.Errorf("a rate of %s requests per second: %q", m[1], errs)
		}
	}
}

// TestSimZeroTimeSweep: --sweep and --chart reach the experiment (sim/report tests the
// sweeps and charts).
func TestSimZeroTimeSweep(t *testing.T) {
	chart := filepath.Join(t.TempDir(), "s.svg")
	code, out, errs := runCLI(t, append([]string{"sim", "--zero-time", "--json", "--sweep", "capacity=600, 900", "--chart", chart}, quickSim...)...)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	var got struct {
		Sweep []struct {
			Capacity int `json:"capacity"`
			Policies []struct {
				Name string `json:"name"`
			} `json:"policies"`
		} `json:"sweep"`
		Chart string `json:"chart"`
	}
	if err := json.Unmarshal([]byte(out), &got); err != nil || len(got.Sweep) != 2 || got.Sweep[1].Capacity != 900 || len(got.Sweep[0].Policies) != 6 || got.Chart != chart {
		t.Fatalf("sweep JSON %v: %s", err, out)
	}
	if _, err := os.Stat(chart); err != nil {
		t.Fatal(err)
	}
}

// TestGenOpsReplays runs the acceptance pipeline: gen-ops with expectations, then
// replay --ops on its output, which must pass every expectation.
func TestGenOpsReplays(t *testing.T) {
	path := filepath.Join(t.TempDir(), "g.jsonl")
	code, out, errs := runCLI(t, append([]string{"gen-ops", "--out", path, "--expect-every", "4"}, quickSim...)...)
	if code != 0 || !strings.Contains(out, "100 with expect/sizes") {
		t.Fatalf("gen-ops: exit %d\n%s%s", code, out, errs)
	}
	code, out, errs = runCLI(t, "replay", "--ops", path)
	if code != 0 || !strings.Contains(out, "100 passed, 0 failed") {
		t.Fatalf("replay: exit %d\n%s%s", code, out, errs)
	}
	// The same flags give the same bytes.
	again := filepath.Join(t.TempDir(), "g2.jsonl")
	if code, _, errs := runCLI(t, append([]string{"gen-ops", "--out", again, "--expect-every", "4"}, quickSim...)...); code != 0 {
		t.Fatal(errs)
	}
	a, _ := os.ReadFile(path)
	b, _ := os.ReadFile(again)
	if !bytes.Equal(a, b) {
		t.Fatal("gen-ops is not deterministic")
	}
}

// tracePath finds the Mooncake conversation trace, or skips visibly.
func tracePath(t *testing.T) string {
	t.Helper()
	var cands []string
	if d := os.Getenv("KVINDEX_TRACES"); d != "" {
		cands = append(cands, d)
	}
	cands = append(cands, filepath.Join("..", "..", "..", "shared", "traces"), filepath.Join("..", "..", "shared", "traces"))
	for _, d := range cands {
		p := filepath.Join(d, "conversation_trace.jsonl")
		if _, err := os.Stat(p); err == nil {
			return p
		}
	}
	t.Skipf("SKIP: conversation_trace.jsonl not found in %v (set KVINDEX_TRACES)", cands)
	return ""
}

func TestSimTrace(t *testing.T) {
	p := tracePath(t)
	code, out, errs := runCLI(t, "sim", "--json", "--trace", p, "--requests", "300", "--policies", "kv-aware,round-robin")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	var got struct {
		Workload struct {
			Source         string   `json:"source"`
			Requests       int      `json:"requests"`
			TraceIDHitRate *float64 `json:"trace_id_block_hit_rate"`
		} `json:"workload"`
		Policies []struct {
			Name string `json:"name"`
		} `json:"policies"`
	}
	if err := json.Unmarshal([]byte(out), &got); err != nil || got.Workload.Source != "trace" ||
		got.Workload.Requests != 300 || got.Workload.TraceIDHitRate == nil || len(got.Policies) != 2 {
		t.Fatalf("%v: %s", err, out)
	}
	if code, _, errs := runCLI(t, "sim", "--trace", filepath.Join(t.TempDir(), "missing.jsonl")); code != 1 || !strings.Contains(errs, "missing.jsonl") {
		t.Fatalf("missing trace: exit %d, %q", code, errs)
	}
}

// TestSimHostTierSweep: a tier sweep without --policies compares the three scorings of
// the tiers only, and the host flags reach a plain run's header (sim/report tests the
// tier's numbers).
func TestSimHostTierSweep(t *testing.T) {
	code, out, errs := runCLI(t, append([]string{"sim", "--zero-time", "--sweep", "host-capacity=0,300"}, quickSim...)...)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	if !strings.Contains(out, "longest-prefix/exact:weighted-tiers") || !strings.Contains(out, "longest-prefix/exact:any-tier") || strings.Contains(out, "least-loaded") {
		t.Fatalf("a tier sweep without --policies runs the three tier scorings only:\n%s", out)
	}
	code, out, errs = runCLI(t, append([]string{"sim", "--zero-time", "--host-capacity", "600", "--host-load-cost", "0.5", "--tier-weights", "1,0.5,0", "--policies", "kv-aware,kv-weighted"}, quickSim...)...)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	if want := "host tier: 600 blocks per engine; loading a block costs 0.5 of recomputing it (--host-load-cost, an assumption); weighted-tiers' weights 1,0.5,0"; !strings.Contains(out, want) {
		t.Fatalf("no %q in:\n%s", want, out)
	}
}

// TestGenOpsWithoutHostTier: without --host-capacity, gen-ops writes no medium (the
// output is what it was before tiers).
func TestGenOpsWithoutHostTier(t *testing.T) {
	path := filepath.Join(t.TempDir(), "g.jsonl")
	if code, _, errs := runCLI(t, append([]string{"gen-ops", "--out", path}, quickSim...)...); code != 0 {
		t.Fatal(errs)
	}
	if b, _ := os.ReadFile(path); bytes.Contains(b, []byte("medium")) || bytes.Contains(b, []byte("tiers")) {
		t.Fatal("gen-ops without a host tier writes tiers")
	}
}

// TestGenOpsHostTierReplays: gen-ops with a host tier writes host-tier ops and per-tier
// expectations, and replay passes every one.
func TestGenOpsHostTierReplays(t *testing.T) {
	path := filepath.Join(t.TempDir(), "g.jsonl")
	code, out, errs := runCLI(t, append([]string{"gen-ops", "--out", path, "--expect-every", "4", "--host-capacity", "300", "--policy", "kv-weighted"}, quickSim...)...)
	if code != 0 || !strings.Contains(out, "100 with expect/sizes") {
		t.Fatalf("gen-ops: exit %d\n%s%s", code, out, errs)
	}
	if b, _ := os.ReadFile(path); !bytes.Contains(b, []byte(`"medium":"host"`)) || !bytes.Contains(b, []byte(`"tiers"`)) {
		t.Fatal("gen-ops with a host tier writes no host-tier ops or per-tier expectations")
	}
	code, out, errs = runCLI(t, "replay", "--ops", path)
	if code != 0 || !strings.Contains(out, "100 passed, 0 failed") {
		t.Fatalf("replay: exit %d\n%s%s", code, out, errs)
	}
}

// timedPolicy is the part of a timed --json policy the tests read; every field the
// JSON must carry is a pointer, so that a missing one fails.
type timedPolicy struct {
	Name         string   `json:"name"`
	Routers      *int     `json:"routers"`
	BlockHitRate *float64 `json:"block_hit_rate"`
	TokenHitRate *float64 `json:"token_hit_rate"`
	TTFTp50      *float64 `json:"ttft_p50_s"`
	TTFTp90      *float64 `json:"ttft_p90_s"`
	TTFTp99      *float64 `json:"ttft_p99_s"`
	ITLp50       *float64 `json:"itl_p50_s"`
	ITLp90       *float64 `json:"itl_p90_s"`
	E2Ep90       *float64 `json:"e2e_p90_s"`
	OutTokPerS   *float64 `json:"output_tok_per_s"`
	Goodput      *float64 `json:"goodput"`
	Preemptions  *int64   `json:"preemptions"`
	KVUtilMean   *float64 `json:"kv_util_mean"`
	KVUtilP90    *float64 `json:"kv_util_p90"`
	QueueMean    *float64 `json:"queue_mean"`
	Index        *struct {
		Queries int64 `json:"queries"`
	} `json:"index"`
}

func (p timedPolicy) complete() bool {
	return p.Routers != nil && p.BlockHitRate != nil && p.TokenHitRate != nil && p.TTFTp50 != nil && p.TTFTp90 != nil &&
		p.TTFTp99 != nil && p.ITLp50 != nil && p.ITLp90 != nil && p.E2Ep90 != nil && p.OutTokPerS != nil && p.Goodput != nil &&
		p.Preemptions != nil && p.KVUtilMean != nil && p.KVUtilP90 != nil && p.QueueMean != nil
}

// TestSimTimedJSON: the default model, every policy, each with the outcomes users
// measure, ordered as they must be (p50 <= p90 <= p99), the references and the index.
func TestSimTimedJSON(t *testing.T) {
	code, out, errs := runCLI(t, append([]string{"sim", "--json", "--rate", "4"}, quickSim...)...)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	var got struct {
		Model      string `json:"model"`
		References struct {
			Infinite struct {
				BlockHitRate float64 `json:"block_hit_rate"`
			} `json:"infinite_cache"`
			Pooled struct {
				BlockHitRate *float64 `json:"block_hit_rate"`
			} `json:"pooled_lru"`
			Reuse struct {
				Reusing *int     `json:"reusing_requests"`
				GapP50  *float64 `json:"gap_p50_s"`
			} `json:"reuse"`
		} `json:"references"`
		Policies []timedPolicy `json:"policies"`
		Index    *struct {
			Policy       string  `json:"policy"`
			BlockOpsPerS float64 `json:"block_ops_per_s"`
		} `json:"index"`
	}
	dec := json.NewDecoder(strings.NewReader(out))
	if err := dec.Decode(&got); err != nil || dec.More() {
		t.Fatalf("%v in %s", err, out)
	}
	var names []string
	for _, r := range sim.Routings() {
		names = append(names, r.Name)
	}
	if got.Model != "timed" || len(got.Policies) != len(names) || got.References.Pooled.BlockHitRate == nil ||
		got.References.Reuse.Reusing == nil || got.References.Reuse.GapP50 == nil {
		t.Fatalf("model, policies or references: %s", out)
	}
	for i, p := range got.Policies {
		if p.Name != names[i] || !p.complete() {
			t.Fatalf("policy %d: %+v in %s", i, p, out)
		}
		if *p.TTFTp50 > *p.TTFTp90 || *p.TTFTp90 > *p.TTFTp99 || *p.TTFTp50 <= 0 || *p.ITLp50 <= 0 || *p.OutTokPerS <= 0 ||
			*p.KVUtilMean <= 0 || *p.KVUtilMean > 1 || *p.BlockHitRate > got.References.Infinite.BlockHitRate {
			t.Errorf("%s: implausible outcomes %+v", p.Name, p)
		}
		// The policies that query an index (the exact one, or approximate's predictions)
		// report its side; the others none.
		reads := strings.Contains(p.Name, "/exact") || strings.HasSuffix(p.Name, "/approx-ttl")
		if (p.Index != nil && p.Index.Queries > 0) != reads {
			t.Errorf("%s: index %+v", p.Name, p.Index)
		}
	}
	if got.Index == nil || got.Index.Policy != "dynamo-cost/exact" || got.Index.BlockOpsPerS <= 0 {
		t.Fatalf("index: %s", out)
	}
}

func TestSimTimedTable(t *testing.T) {
	code, out, errs := runCLI(t, append([]string{"sim", "--policies", "kv-aware,approximate-lru-scorer,random", "--routers", "2", "--router-affinity", "session"}, quickSim...)...)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	for _, want := range []string{"workload  built-in conversations", "arrivals: Poisson, 16 requests/s", "reuse:", "2 routers (affinity: session)",
		"reference infinite cache", "one LRU of the fleet's 2,400 blocks", "TTFT p50", "out tok/s", "goodput", "llmd-scorer/approx-lru",
		"index (the dynamo-cost/exact run, simulated alone)", "find-matches     p50", "total "} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "round-robin") {
		t.Errorf("--policies ignored:\n%s", out)
	}
}

// TestSimTimedSweep: a load sweep writes a two-panel chart (PNG and SVG) and a JSON
// point per speedup; a routers sweep names its points by router count.
func TestSimTimedSweep(t *testing.T) {
	dir := t.TempDir()
	for _, ext := range []string{".svg", ".png"} {
		chart := filepath.Join(dir, "load"+ext)
		code, out, errs := runCLI(t, append(append([]string{"sim", "--sweep", "speedup=0.25,1", "--chart", chart, "--policies", "kv-aware-scorer,random"}, quickSim...), "--requests", "150")...)
		if code != 0 {
			t.Fatalf("exit %d: %s", code, errs)
		}
		for _, want := range []string{"p90 TTFT / output tokens per second, by speedup", "0.25x", "1x", "chart written to " + chart, "times the swept speedup"} {
			if !strings.Contains(out, want) {
				t.Fatalf("no %q in:\n%s", want, out)
			}
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
	code, out, errs := runCLI(t, append(append([]string{"sim", "--json", "--sweep", "routers=1,3", "--chart", filepath.Join(dir, "r.png"), "--policies", "approximate"}, quickSim...), "--requests", "150")...)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	var got struct {
		Sweep []struct {
			Param    string        `json:"param"`
			Value    float64       `json:"value"`
			Policies []timedPolicy `json:"policies"`
		} `json:"sweep"`
	}
	if err := json.Unmarshal([]byte(out), &got); err != nil || len(got.Sweep) != 2 || got.Sweep[1].Param != "routers" || got.Sweep[1].Value != 3 ||
		len(got.Sweep[1].Policies) != 1 || !got.Sweep[1].Policies[0].complete() || *got.Sweep[1].Policies[0].Routers != 3 {
		t.Fatalf("sweep JSON %v: %s", err, out)
	}
}

// TestSimSharedContext runs llm-d's workload shape, small, and a measured profile.
func TestSimSharedContext(t *testing.T) {
	profile := filepath.Join(t.TempDir(), "profile.csv")
	csv := "kind,x,y,seconds\nttft,100,0,0.02\nttft,2000,0,0.3\nttft,1100,1000,0.03\nttft,3000,1000,0.35\n" +
		"itl,1,100,0.01\nitl,1,4000,0.012\nitl,64,100,0.015\nitl,64,4000,0.03\n"
	if err := os.WriteFile(profile, []byte(csv), 0o644); err != nil {
		t.Fatal(err)
	}
	code, out, errs := runCLI(t, "sim", "--json", "--workload", "shared-context", "--groups", "12", "--users", "3", "--group-tokens", "1000",
		"--query-tokens", "200", "--output-length", "50", "--requests", "300", "--workers", "4", "--capacity", "200",
		"--policies", "kv-aware-scorer,load-only", "--profile", profile)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	var got struct {
		Workload struct {
			Source string `json:"source"`
			Tokens int64  `json:"tokens"`
		} `json:"workload"`
		Cluster struct {
			CostModel string  `json:"cost_model"`
			Rate      float64 `json:"rate"`
		} `json:"cluster"`
		Policies []timedPolicy `json:"policies"`
	}
	if err := json.Unmarshal([]byte(out), &got); err != nil || got.Workload.Source != "shared-context" || got.Workload.Tokens != 300*1200 ||
		got.Cluster.CostModel != "profile "+profile || got.Cluster.Rate != 10 || len(got.Policies) != 2 {
		t.Fatalf("%v: %s", err, out)
	}
	// The exact scorer reuses the contexts; load-only scatters them.
	if *got.Policies[0].BlockHitRate <= *got.Policies[1].BlockHitRate {
		t.Errorf("kv-aware-scorer block hit %v not above load-only's %v", *got.Policies[0].BlockHitRate, *got.Policies[1].BlockHitRate)
	}
	// A ramp whose stages drain: the stage table says so, and the stages report spans.
	code, out, errs = runCLI(t, "sim", "--workload", "shared-context", "--groups", "12", "--users", "3", "--group-tokens", "1000",
		"--query-tokens", "200", "--output-length", "50", "--workers", "4", "--capacity", "200", "--policies", "round-robin",
		"--profile", profile, "--ramp", "4:5,8:5", "--ramp-stages", "drain:2s")
	if code != 0 || !strings.Contains(out, "each stage ran until its requests finished") {
		t.Fatalf("drained ramp: exit %d\n%s\n%s", code, out, errs)
	}
	if code, _, errs := runCLI(t, append([]string{"sim", "--profile", filepath.Join(t.TempDir(), "none.csv")}, quickSim...)...); code != 1 || !strings.Contains(errs, "none.csv") {
		t.Fatalf("missing profile: exit %d, %q", code, errs)
	}
	bad := filepath.Join(t.TempDir(), "bad.csv")
	if err := os.WriteFile(bad, []byte("ttft,1,0,x\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if code, _, errs := runCLI(t, append([]string{"sim", "--profile", bad}, quickSim...)...); code != 1 || !strings.Contains(errs, "line 1") {
		t.Fatalf("bad profile: exit %d, %q", code, errs)
	}
}

// TestSimValidate: `sim validate` prints every row's checks and the tally; a scale
// outside (0, 1] is a usage error. The validation itself is sim/report's test.
func TestSimValidate(t *testing.T) {
	code, out, errs := runCLI(t, "sim", "validate", "--scale", "0.05", "--jobs", "2")
	if code != 0 || !strings.Contains(out, "37-capacity") || !strings.Contains(out, "checks hold their direction") {
		t.Fatalf("exit %d\n%s\n%s", code, out, errs)
	}
	if code, _, errs := runCLI(t, "sim", "validate", "--scale", "2"); code != 2 || !strings.Contains(errs, "--scale") {
		t.Fatalf("--scale 2: exit %d, %q", code, errs)
	}
}
