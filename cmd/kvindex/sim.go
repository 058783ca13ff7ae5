package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"github.com/kvindex/kvindex/bench"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/kvindex/kvindex/engine"
	"github.com/kvindex/kvindex/hash"
	"github.com/kvindex/kvindex/sim"
	"github.com/kvindex/kvindex/sim/report"
	"github.com/schollz/progressbar/v3"
	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgsvg"
)

// progressDelay is how long a run goes before it shows a progress bar.
var progressDelay = 2 * time.Second

// simFlags are the workload and cluster flags that sim and gen-ops share.
type simFlags struct {
	workers, capacity, blockSize, requests int
	shards, jump, chunk, sessions          int
	seed                                   uint64
	trace                                  string
	set                                    map[string]bool
	// the workload: built-in, or llm-d's shared-context shape
	kind                                    string
	groups, groupTokens, users, queryTokens int
	replyReuse                              float64
	// timing flags (sim only; gen-ops delivers every event at once)
	timed                     bool
	eventDelay, predictionTTL time.Duration
	rate                      float64
	// tiers
	hostCapacity int
	tierWeights  string
	weights      engine.Weights
	hostLoadCost float64
}

// registerTiming adds sim's simulated-time flags.
func (f *simFlags) registerTiming(fs *flag.FlagSet) {
	f.timed = true
	fs.DurationVar(&f.eventDelay, "event-delay", sim.DefaultEventDelay, "simulated time from serving a request to its events reaching the index (0: at once)")
	fs.Float64Var(&f.rate, "rate", 0, fmt.Sprintf("built-in and shared-context workloads: arrivals per simulated second (0 = %d built-in, %d shared-context, Poisson; %d with --zero-time, evenly spaced; a trace has its own timestamps)",
		sim.DefaultTimedRate, sim.DefaultSharedRate, sim.DefaultRate))
	fs.DurationVar(&f.predictionTTL, "prediction-ttl", 0, "lifetime of the exact+predict and approx-ttl knowledge's predictions (default: the event delay + 2s, and 2m; exact+sticky: 2m)")
	fs.Float64Var(&f.hostLoadCost, "host-load-cost", sim.DefaultHostLoadCost, "with a host tier: loading a block from host, as a fraction of recomputing it (an assumption; (0, 1])")
}

func (f *simFlags) register(fs *flag.FlagSet, requestsHelp string, capacity int, capacityHelp string) {
	fs.IntVar(&f.workers, "workers", sim.DefaultWorkers, "mock vLLM engines (1.."+strconv.Itoa(sim.MaxWorkers)+")")
	fs.IntVar(&f.capacity, "capacity", capacity, capacityHelp)
	fs.IntVar(&f.blockSize, "block-size", sim.DefaultBlockSize, "tokens per KV block")
	fs.IntVar(&f.requests, "requests", 0, requestsHelp)
	fs.Uint64Var(&f.seed, "seed", 1, "seed of the built-in workload, the random policy and the engine hashes")
	fs.IntVar(&f.shards, "shards", 0, shardsHelp)
	fs.IntVar(&f.jump, "jump", 0, jumpHelp)
	fs.IntVar(&f.chunk, "chunk", sim.DefaultChunkTokens, "tokens per engine step (vLLM's max_num_batched_tokens: the prefill chunk; one stored event per chunk)")
	fs.IntVar(&f.sessions, "sessions", sim.DefaultSessions, "built-in workload: live conversations")
	fs.Float64Var(&f.replyReuse, "reply-reuse", 1, "built-in workload: the share of a reply the next turn repeats (1: chat clients send the whole history back; a reasoning model's template that drops earlier reasoning repeats less)")
	fs.StringVar(&f.trace, "trace", "", "Mooncake FAST'25 trace (JSONL) instead of the built-in workload (README: where to get one)")
	fs.StringVar(&f.kind, "workload", "built-in", "built-in (multi-turn conversations) or shared-context (llm-d's benchmark shape: --groups customers' contexts shared by --users each)")
	fs.IntVar(&f.groups, "groups", 150, "shared-context: customers, each with a context of its own")
	fs.IntVar(&f.groupTokens, "group-tokens", 6000, "shared-context: tokens of a customer's context")
	fs.IntVar(&f.users, "users", 5, "shared-context: users per customer, each asking its own query")
	fs.IntVar(&f.queryTokens, "query-tokens", 1200, "shared-context: tokens of a user's query")
	fs.IntVar(&f.hostCapacity, "host-capacity", 0, "host-memory tier blocks per worker (0 = none): device evictions are offloaded there and loaded back on a hit")
	fs.StringVar(&f.tierWeights, "tier-weights", "1,0.75,0.25", "kv-weighted's weights of a device, host and disk block, as D,H,DISK in [0, 1]")
}

// parseWeights reads "D,H,K": the tier weights of kv-weighted.
func parseWeights(s string) (engine.Weights, error) {
	var w engine.Weights
	parts := strings.Split(s, ",")
	if len(parts) != engine.NumTiers {
		return w, usageErr("--tier-weights %q: want three weights, device,host,disk (e.g. 1,0.75,0.25)", s)
	}
	for i, v := range parts {
		x, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
		if err != nil {
			return w, usageErr("--tier-weights %q: %q is not a number", s, v)
		}
		w[i] = x
	}
	if err := w.Validate(); err != nil {
		return w, usageErr("--tier-weights %q: %v", s, err)
	}
	if w == (engine.Weights{}) {
		return w, usageErr("--tier-weights %q: all zero, no block would count", s)
	}
	return w, nil
}

func (f *simFlags) validate(fs *flag.FlagSet) error {
	f.set = map[string]bool{}
	fs.Visit(func(fl *flag.Flag) { f.set[fl.Name] = true })
	engineErr := engine.Config{Shards: f.shards, JumpSize: f.jump}.Validate()
	switch {
	case f.workers < 1 || f.workers > sim.MaxWorkers:
		return usageErr("--workers %d: want 1..%d", f.workers, sim.MaxWorkers)
	case f.capacity < 1 || f.capacity > sim.MaxCapacity:
		return usageErr("--capacity %d: want 1..%d blocks", f.capacity, sim.MaxCapacity)
	case int64(f.workers)*int64(f.capacity) > sim.MaxFleetBlocks:
		return usageErr("--workers %d x --capacity %d: more than %d blocks in all", f.workers, f.capacity, sim.MaxFleetBlocks)
	case hash.CheckBlockSize(f.blockSize) != nil:
		return usageErr("--block-size %d: want 1..%d tokens", f.blockSize, hash.MaxBlockSize)
	case f.requests < 0:
		return usageErr("--requests %d: want >= 0 (0 = default)", f.requests)
	case engineErr != nil:
		return usageErr("--shards %d --jump %d: %v", f.shards, f.jump, engineErr)
	case f.chunk < 1:
		return usageErr("--chunk %d: want at least 1 token", f.chunk)
	case f.sessions < 1:
		return usageErr("--sessions %d: want >= 1", f.sessions)
	case f.trace != "" && f.set["sessions"]:
		return usageErr("--sessions applies to the built-in workload, not to --trace")
	case (f.trace != "" || f.kind != "built-in") && f.set["reply-reuse"]:
		return usageErr("--reply-reuse applies to the built-in workload")
	case !(f.replyReuse >= 0 && f.replyReuse <= 1):
		return usageErr("--reply-reuse %g: want 0..1", f.replyReuse)
	case f.kind != "built-in" && f.kind != "shared-context":
		return usageErr("--workload %q: want built-in or shared-context", f.kind)
	case f.trace != "" && f.set["workload"]:
		return usageErr("--workload and --trace: give one")
	case f.kind == "shared-context" && f.set["sessions"]:
		return usageErr("--sessions applies to the built-in workload, not to shared-context")
	case f.kind != "shared-context" && (f.set["groups"] || f.set["group-tokens"] || f.set["users"] || f.set["query-tokens"]):
		return usageErr("--groups, --group-tokens, --users and --query-tokens apply to --workload shared-context")
	case f.groups < 1 || f.users < 1 || int64(f.groups)*int64(f.users) > sim.MaxSharedPrompts:
		return usageErr("--groups %d x --users %d: want at least 1 x 1 and at most %d prompts", f.groups, f.users, sim.MaxSharedPrompts)
	case f.groupTokens < 0 || f.groupTokens > sim.MaxSharedTokens:
		return usageErr("--group-tokens %d: want 0..%d", f.groupTokens, sim.MaxSharedTokens)
	case f.queryTokens < 1 || f.queryTokens > sim.MaxSharedTokens:
		return usageErr("--query-tokens %d: want 1..%d", f.queryTokens, sim.MaxSharedTokens)
	case f.eventDelay < 0 || f.eventDelay > time.Hour:
		return usageErr("--event-delay %v: want 0..1h", f.eventDelay)
	case f.timed && !(f.rate >= 0 && f.rate <= 1e9) || f.set["rate"] && f.rate == 0:
		return usageErr("--rate %g: want (0, 1e9] arrivals per second", f.rate)
	case f.predictionTTL < 0 || f.predictionTTL > engine.MaxPredictionTTL:
		return usageErr("--prediction-ttl %v: want 0..%v", f.predictionTTL, engine.MaxPredictionTTL)
	case f.hostCapacity < 0 || f.hostCapacity > sim.MaxCapacity:
		return usageErr("--host-capacity %d: want 0..%d blocks (0 = no host tier)", f.hostCapacity, sim.MaxCapacity)
	case int64(f.workers)*(int64(f.capacity)+int64(f.hostCapacity)) > sim.MaxFleetBlocks:
		return usageErr("--workers %d x (--capacity %d + --host-capacity %d): more than %d blocks in all", f.workers, f.capacity, f.hostCapacity, sim.MaxFleetBlocks)
	case f.timed && !(f.hostLoadCost > 0 && f.hostLoadCost <= 1):
		return usageErr("--host-load-cost %g: want (0, 1], a fraction of recomputing a block", f.hostLoadCost)
	}
	var err error
	f.weights, err = parseWeights(f.tierWeights)
	return err
}

// workload builds the workload the flags describe: defRequests is the built-in
// workload's length unless --requests is set, and with ramp set the shared-context
// workload's too.
func (f *simFlags) workload(defRequests int, ramp bool) (*sim.Workload, workloadInfo, error) {
	if f.trace == "" && f.kind == "shared-context" {
		n := f.requests
		if n == 0 && ramp {
			n = defRequests
		}
		w, err := sim.SharedContext(sim.SharedContextConfig{Seed: f.seed, Requests: n, BlockSize: f.blockSize,
			Groups: f.groups, GroupTokens: f.groupTokens, UsersPerGroup: f.users, QueryTokens: f.queryTokens})
		if err != nil {
			return nil, workloadInfo{}, err
		}
		return w, describeWorkload(w, "shared-context", ""), nil
	}
	if f.trace == "" {
		n := f.requests
		if n == 0 {
			n = defRequests
		}
		w, err := sim.Generate(sim.GenConfig{Seed: f.seed, Requests: n, BlockSize: f.blockSize, Sessions: f.sessions, ReplyDropped: 1 - f.replyReuse})
		if err != nil {
			return nil, workloadInfo{}, err
		}
		return w, describeWorkload(w, "built-in", ""), nil
	}
	fh, err := os.Open(f.trace)
	if err != nil {
		return nil, workloadInfo{}, traceNotFound(err)
	}
	defer fh.Close()
	recs, err := sim.ReadTrace(fh, f.requests)
	if err != nil {
		return nil, workloadInfo{}, fmt.Errorf("%s: %w", f.trace, err)
	}
	w, err := sim.FromTrace("Mooncake trace "+filepath.Base(f.trace), recs, f.blockSize)
	if err != nil {
		return nil, workloadInfo{}, err
	}
	wi := describeWorkload(w, "trace", f.trace)
	h, r := sim.TraceCeiling(recs)
	if r > 0 {
		x := float64(h) / float64(r)
		wi.TraceIDHitRate = &x
	}
	return w, wi, nil
}

func describeWorkload(w *sim.Workload, source, trace string) workloadInfo {
	return workloadInfo{Name: w.Name, Source: source, Trace: trace, Requests: len(w.Requests),
		Tokens: w.Tokens, Blocks: w.Blocks, BlockSize: w.BlockSize}
}

func (f *simFlags) config() sim.Config {
	c := sim.Config{
		Workers: f.workers, Capacity: f.capacity, ChunkTokens: f.chunk, Seed: f.seed,
		Engine:     engine.Config{Shards: f.shards, JumpSize: f.jump},
		EventDelay: -1, Rate: f.rate, PredictionTTL: f.predictionTTL,
		HostCapacity: f.hostCapacity, HostLoadCost: f.hostLoadCost, TierWeights: f.weights,
	}
	if f.timed && f.eventDelay > 0 {
		c.EventDelay = f.eventDelay
	}
	return c
}

// The JSON shapes the timed and zero-time reports share (sim/report).
type (
	workloadInfo = report.WorkloadInfo
	hitsJSON     = report.HitsJSON
	indexJSON    = report.IndexJSON
)

var (
	toIndexJSON = report.IndexOf
	toHitsJSON  = report.HitsOf
	pct         = report.Pct
	chartLine   = report.ChartLine
)

// JSON shapes of `kvindex sim --zero-time --json`.
type (
	clusterJSON struct {
		Workers     int `json:"workers"`
		Capacity    int `json:"capacity_blocks"`
		ChunkTokens int `json:"chunk_tokens"`
		Shards      int `json:"shards"`
		Jump        int `json:"jump"`
		// EventDelayMs is the simulated delay of events (0: at once).
		EventDelayMs float64 `json:"event_delay_ms"`
		// The host tier, in runs that have one or sweep it (absent otherwise).
		HostCapacity *int      `json:"host_capacity_blocks,omitempty"`
		HostLoadCost *float64  `json:"host_load_cost,omitempty"`
		TierWeights  []float64 `json:"tier_weights,omitempty"`
	}
	policyJSON struct {
		Name string `json:"name"`
		hitsJSON
		MaxMeanLoad  float64 `json:"max_mean_load"`
		MaxMeanToken float64 `json:"max_mean_tokens"`
		Seconds      float64 `json:"seconds"`
		// With a host tier: the hit rate it adds (host_hit_blocks/blocks), the tokens
		// loaded from it, and the prefill work left (computed tokens plus loaded ones at
		// host_load_cost, over all input tokens).
		HostHitRate   *float64  `json:"host_block_hit_rate,omitempty"`
		HostHitBlocks *int64    `json:"host_hit_blocks,omitempty"`
		LoadedTokens  *int64    `json:"loaded_tokens,omitempty"`
		PrefillWork   *float64  `json:"prefill_work,omitempty"`
		Orphans       *int64    `json:"orphan_blocks,omitempty"`
		Index         indexJSON `json:"index"`
	}
	sweepPointJSON struct {
		Capacity int `json:"capacity,omitempty"`
		// EventDelayMs is set in an event-delay sweep, HostCapacity in a host-capacity
		// sweep (capacity in a capacity sweep).
		EventDelayMs *float64     `json:"event_delay_ms,omitempty"`
		HostCapacity *int         `json:"host_capacity,omitempty"`
		Policies     []policyJSON `json:"policies"`
	}
	simJSON struct {
		Workload workloadInfo     `json:"workload"`
		Cluster  clusterJSON      `json:"cluster"`
		Ceiling  hitsJSON         `json:"ceiling"`
		Policies []policyJSON     `json:"policies,omitempty"`
		Index    *indexJSON       `json:"index,omitempty"`
		Sweep    []sweepPointJSON `json:"sweep,omitempty"`
		Chart    string           `json:"chart,omitempty"`
		Seconds  float64          `json:"seconds"`
	}
)

func ptr[T any](v T) *T { return &v }

func toPolicyJSON(r sim.Result, measured, tiered bool) policyJSON {
	pj := policyJSON{
		Name: r.Policy.String(), hitsJSON: toHitsJSON(r, r.HitBlocks, r.Blocks),
		MaxMeanLoad: r.MaxMeanLoad(), MaxMeanToken: r.MaxMeanTokens(), Seconds: r.Seconds,
		Index: toIndexJSON(r, measured),
	}
	if tiered {
		pj.HostHitRate, pj.HostHitBlocks, pj.LoadedTokens = ptr(r.HostHitRate()), ptr(r.HostHitBlocks), ptr(r.LoadedTokens)
		pj.PrefillWork, pj.Orphans = ptr(r.PrefillWork()), ptr(r.Orphans)
	}
	return pj
}

// timedPolicyNames and zeroTimePolicyNames are the policies of each model, as --policies
// spells them.
func timedPolicyNames() []string {
	var names []string
	for _, r := range sim.AllRoutings() {
		names = append(names, r.Name)
	}
	return names
}

func defaultTimedNames() []string {
	var names []string
	for _, r := range sim.Routings() {
		names = append(names, r.Name)
	}
	return names
}

func zeroTimePolicyNames() []string {
	var names []string
	for _, p := range sim.Policies() {
		names = append(names, p.String())
	}
	return names
}

// policiesHelp is --policies' help: every policy of both models, so that the help lists
// what the errors of parsePolicies and parseRoutings accept.
func policiesHelp() string {
	return "comma-separated routing policies to compare: " + strings.Join(timedPolicyNames(), ", ") +
		" (FAMILY/KNOWLEDGE, docs/routing.md; default: " + strings.Join(defaultTimedNames(), ",") + "); with --zero-time: " + strings.Join(zeroTimePolicyNames(), ", ") +
		" (default " + zeroTimePolicies + ")"
}

// onlyIn lists the names of b that a does not have.
func onlyIn(b, a []string) []string {
	var out []string
	for _, n := range b {
		if !slices.Contains(a, n) {
			out = append(out, n)
		}
	}
	return out
}

// parsePolicies reads a comma-separated policy list.
func parsePolicies(s string) ([]sim.Policy, error) {
	var out []sim.Policy
	seen := map[sim.Policy]bool{}
	for _, name := range strings.Split(s, ",") {
		p, err := sim.ParsePolicy(strings.TrimSpace(name))
		if err != nil {
			zt := zeroTimePolicyNames()
			return nil, usageErr("--policies: unknown policy %q with --zero-time (want a comma-separated list of %s; %s run under time only, without --zero-time)",
				name, strings.Join(zt, ", "), strings.Join(onlyIn(timedPolicyNames(), zt), ", "))
		}
		if !seen[p] {
			seen[p] = true
			out = append(out, p)
		}
	}
	return out, nil
}

// sweepSpec is a parsed --sweep: capacities, event delays, or host capacities.
type sweepSpec struct {
	caps   []int
	delays []time.Duration
	hosts  []int
}

func (sp sweepSpec) points() int { return len(sp.caps) + len(sp.delays) + len(sp.hosts) }

// tierPolicies are the policies a host-capacity sweep compares unless --policies says
// otherwise: the three ways to score the tiers.
const tierPolicies = "longest-prefix/exact,longest-prefix/exact:weighted-tiers,longest-prefix/exact:any-tier"

// parseSweep reads "capacity=A,B,C", "event-delay=D1,D2,D3" (0 is at once) or
// "host-capacity=H1,H2,H3" (0 is none).
func parseSweep(s string) (sweepSpec, error) {
	key, list, ok := strings.Cut(s, "=")
	var sp sweepSpec
	switch strings.TrimSpace(key) {
	case "capacity":
		for _, v := range strings.Split(list, ",") {
			c, err := strconv.Atoi(strings.TrimSpace(v))
			if err != nil || c < 1 || c > sim.MaxCapacity {
				return sp, usageErr("--sweep: capacity %q is not a number of blocks in 1..%d", v, sim.MaxCapacity)
			}
			sp.caps = append(sp.caps, c)
		}
	case "event-delay":
		for _, v := range strings.Split(list, ",") {
			v = strings.TrimSpace(v)
			d, err := time.ParseDuration(v)
			if v == "0" {
				d, err = 0, nil
			}
			if err != nil || d < 0 || d > time.Hour {
				return sp, usageErr("--sweep: event delay %q is not a duration in 0..1h", v)
			}
			sp.delays = append(sp.delays, d)
		}
	case "host-capacity":
		for _, v := range strings.Split(list, ",") {
			c, err := strconv.Atoi(strings.TrimSpace(v))
			if err != nil || c < 0 || c > sim.MaxCapacity {
				return sp, usageErr("--sweep: host capacity %q is not a number of blocks in 0..%d", v, sim.MaxCapacity)
			}
			sp.hosts = append(sp.hosts, c)
		}
	default:
		ok = false
	}
	if !ok {
		return sp, usageErr("--sweep %q: want capacity=A,B,C, event-delay=D1,D2,D3 or host-capacity=H1,H2,H3", s)
	}
	if sp.points() < 2 {
		return sp, usageErr("--sweep %q: give at least two points", s)
	}
	return sp, nil
}

var chartFormats = map[string]bool{".svg": true, ".png": true, ".pdf": true}

func runSim(args []string, stdout, stderr io.Writer) int {
	if len(args) > 0 && args[0] == "validate" {
		return runSimValidate(args[1:], stdout, stderr)
	}
	fs := newFlags("sim", stderr)
	var f simFlags
	f.register(fs, fmt.Sprintf("requests to simulate (0 = %d for the built-in workload, %d for shared-context, every line of a trace)", sim.DefaultRequests, sim.DefaultSharedRequests),
		sim.DefaultTimedCapacity, "KV cache blocks per worker (default: 307,328 tokens, one Qwen3-32B engine on 2 x H100 80GB, at 64 tokens a block)")
	f.registerTiming(fs)
	var tf timedFlags
	tf.register(fs)
	policies := fs.String("policies", "", policiesHelp())
	asJSON := fs.Bool("json", false, "print one JSON object instead of the tables")
	forceProgress := fs.Bool("progress", false, "show a progress bar on stderr even when it is not a terminal")
	sweep := fs.String("sweep", "", "rerun every policy at each point and chart the outcomes: speedup=X1,X2,..., routers=N1,N2,..., capacity=A,B,... or event-delay=D1,D2,...; with --zero-time capacity=, event-delay= or host-capacity=H1,H2,... (hit rates; host-capacity: the prefill work, policies default to "+tierPolicies+")")
	chart := fs.String("chart", "", "with --sweep: chart file (.svg, .png or .pdf; none without it)")
	if code, ok := parseFlags(fs, args, stdout); !ok {
		return code
	}
	err := func() error {
		if err := f.validate(fs); err != nil {
			return err
		}
		if *sweep == "" && f.set["chart"] {
			return usageErr("--chart needs --sweep")
		}
		if *chart != "" && !chartFormats[strings.ToLower(filepath.Ext(*chart))] {
			return usageErr("--chart %q: want a .svg, .png or .pdf file", *chart)
		}
		if !tf.zeroTime {
			return runTimed(stdout, stderr, &f, &tf, *policies, *sweep, *chart, *asJSON, *forceProgress)
		}
		if err := tf.checkZeroTime(f.set); err != nil {
			return err
		}
		var sp sweepSpec
		var err error
		if *sweep != "" {
			if sp, err = parseSweep(*sweep); err != nil {
				return err
			}
			if sp.hosts != nil && f.set["host-capacity"] {
				return usageErr("--host-capacity and --sweep host-capacity=...: give one")
			}
		}
		if *policies == "" {
			*policies = zeroTimePolicies
			if sp.hosts != nil {
				*policies = tierPolicies
			}
		}
		pols, err := parsePolicies(*policies)
		if err != nil {
			return err
		}
		check := sp.caps
		if len(check) == 0 {
			check = []int{f.capacity}
		}
		// The fleet's bounds first: they need no workload, which can take seconds.
		for _, c := range check {
			if int64(f.workers)*(int64(c)+int64(f.hostCapacity)) > sim.MaxFleetBlocks {
				return usageErr("--workers %d x (capacity %d + --host-capacity %d): more than %d blocks in all", f.workers, c, f.hostCapacity, sim.MaxFleetBlocks)
			}
		}
		for _, h := range sp.hosts {
			if int64(f.workers)*(int64(f.capacity)+int64(h)) > sim.MaxFleetBlocks {
				return usageErr("--workers %d x (capacity %d + host capacity %d): more than %d blocks in all", f.workers, f.capacity, h, sim.MaxFleetBlocks)
			}
		}
		w, wi, err := f.workload(sim.DefaultRequests, false)
		if err != nil {
			return err
		}
		cfg := f.config()
		for _, c := range check {
			if c < w.MaxBlocks {
				return usageErr("capacity %d blocks per worker cannot hold the longest request (%d blocks of %d tokens); raise --capacity or the sweep's capacities",
					c, w.MaxBlocks, w.BlockSize)
			}
		}
		return simulate(stdout, stderr, w, wi, cfg, pols, sp, *chart, *asJSON, *forceProgress)
	}()
	return exitCode(stderr, "sim", err)
}

// zeroTimePolicies are --zero-time's default policies.
const zeroTimePolicies = "longest-prefix/exact,longest-prefix/exact+predict,longest-prefix/approx-ttl,random,round-robin,least-loaded"

func simulate(stdout, stderr io.Writer, w *sim.Workload, wi workloadInfo, cfg sim.Config, pols []sim.Policy,
	sp sweepSpec, chart string, asJSON, forceProgress bool) error {
	start := time.Now()
	runs := len(pols) * max(1, sp.points())
	prog := newProgress(stderr, forceProgress, runs*len(w.Requests))
	defer prog.finish()
	cfg.Progress = prog.add
	ctx := context.Background()

	ceil := sim.InfiniteCache(w)
	eff := cfg.Engine.WithDefaults()
	tiered := cfg.HostCapacity > 0 || sp.hosts != nil
	out := simJSON{
		Workload: wi,
		Cluster: clusterJSON{Workers: cfg.Workers, Capacity: cfg.Capacity, ChunkTokens: cfg.ChunkTokens,
			Shards: eff.Shards, Jump: eff.JumpSize, EventDelayMs: float64(max(cfg.EventDelay, 0)) / 1e6},
		Ceiling: toHitsJSON(ceil, ceil.HitBlocks, ceil.Blocks),
	}
	if tiered {
		out.Cluster.HostCapacity, out.Cluster.HostLoadCost = ptr(cfg.HostCapacity), ptr(cfg.HostLoadCost)
		if cfg.HostLoadCost == 0 {
			out.Cluster.HostLoadCost = ptr(sim.DefaultHostLoadCost)
		}
		wts := cfg.TierWeights
		if wts == (engine.Weights{}) {
			wts = engine.DefaultWeights
		}
		out.Cluster.TierWeights = wts[:]
	}
	if sp.points() == 0 {
		cfg.MeasureMemory = true
		var results []sim.Result
		for _, p := range pols {
			r, err := sim.Run(ctx, w, p, cfg)
			if err != nil {
				return err
			}
			results = append(results, r)
			out.Policies = append(out.Policies, toPolicyJSON(r, true, tiered))
		}
		ix := toIndexJSON(results[0], true)
		for _, r := range results {
			if r.Policy == sim.KVAware {
				ix = toIndexJSON(r, true)
			}
		}
		out.Index = &ix
		out.Seconds = time.Since(start).Seconds()
		prog.finish()
		if asJSON {
			return printJSON(stdout, out)
		}
		printReport(stdout, out, results, ceil)
		return nil
	}

	for k := range sp.points() {
		var pt sweepPointJSON
		switch {
		case sp.caps != nil:
			cfg.Capacity = sp.caps[k]
			pt.Capacity = cfg.Capacity
		case sp.hosts != nil:
			cfg.HostCapacity = sp.hosts[k]
			pt.HostCapacity = ptr(cfg.HostCapacity)
		default:
			cfg.EventDelay = sp.delays[k]
			if cfg.EventDelay == 0 {
				cfg.EventDelay = -1 // at once
			}
			ms := float64(sp.delays[k]) / 1e6
			pt.EventDelayMs = &ms
		}
		for _, p := range pols {
			r, err := sim.Run(ctx, w, p, cfg)
			if err != nil {
				return err
			}
			pt.Policies = append(pt.Policies, toPolicyJSON(r, false, tiered))
		}
		out.Sweep = append(out.Sweep, pt)
	}
	switch {
	case sp.caps != nil:
		out.Cluster.Capacity = 0
	case sp.hosts != nil:
		out.Cluster.HostCapacity = nil
	default:
		out.Cluster.EventDelayMs = 0
	}
	if err := writeChartIf(chart, out, writeChart); err != nil {
		return err
	}
	out.Chart = chart
	out.Seconds = time.Since(start).Seconds()
	prog.finish()
	if asJSON {
		return printJSON(stdout, out)
	}
	printSweep(stdout, out)
	return nil
}

func printJSON(w io.Writer, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintln(w, string(b))
	return err
}

func printHeader(w io.Writer, out simJSON, capacity string) {
	wl := out.Workload
	fmt.Fprintf(w, "workload  %s\n", wl.Name)
	fmt.Fprintf(w, "          %s requests, %s input tokens, %s full blocks of %d tokens\n",
		bench.Thousands(int64(wl.Requests)), bench.Thousands(wl.Tokens), bench.Thousands(wl.Blocks), wl.BlockSize)
	if wl.TraceIDHitRate != nil {
		fmt.Fprintf(w, "          trace's own ceiling at 512-token ids: %s of block references\n", pct(*wl.TraceIDHitRate))
	}
	c := out.Cluster
	fmt.Fprintf(w, "cluster   %d mock vLLM engines x %s, prefill chunks of %d tokens; index: %d shards, jump %d\n",
		c.Workers, capacity, c.ChunkTokens, c.Shards, c.Jump)
	if len(out.Sweep) == 0 || out.Sweep[0].EventDelayMs == nil {
		fmt.Fprintf(w, "          events reach the index %v after the request (simulated time)\n", time.Duration(c.EventDelayMs*1e6))
	}
	if c.HostLoadCost != nil {
		host := "the swept number of"
		if c.HostCapacity != nil {
			host = bench.Thousands(int64(*c.HostCapacity))
		}
		fmt.Fprintf(w, "          host tier: %s blocks per engine; loading a block costs %g of recomputing it (--host-load-cost, an assumption); kv-weighted's weights %s\n",
			host, *c.HostLoadCost, weightsString(c.TierWeights))
	}
	fmt.Fprintln(w)
}

// weightsString writes tier weights as --tier-weights takes them: "1,0.75,0.25".
func weightsString(ws []float64) string {
	parts := make([]string, len(ws))
	for i, x := range ws {
		parts[i] = strconv.FormatFloat(x, 'g', -1, 64)
	}
	return strings.Join(parts, ",")
}

// printTiered prints one row per run with the host tier's columns: device and host hit
// rates, token hit, prefill work, load balance; lead (when not "") is a first column.
func printTiered(w io.Writer, lead string, pols []policyJSON, header bool) {
	if header {
		label := ""
		if lead != "" {
			label = "host"
		}
		fmt.Fprintf(w, "%-*s%-16s %10s %9s %10s %13s %14s %16s\n", len(lead), label, "policy", "device hit", "host hit", "token hit", "prefill work", "max/mean reqs", "max/mean tokens")
	}
	for _, p := range pols {
		fmt.Fprintf(w, "%s%-16s %10s %9s %10s %13s %14.3f %16.3f\n", lead, p.Name, pct(p.BlockHitRate), pct(*p.HostHitRate), pct(p.TokenHitRate), pct(*p.PrefillWork), p.MaxMeanLoad, p.MaxMeanToken)
	}
}

func printReport(w io.Writer, out simJSON, results []sim.Result, ceil sim.Ceiling) {
	printHeader(w, out, bench.Thousands(int64(out.Cluster.Capacity))+fmt.Sprintf(" blocks (%s tokens each)", bench.Thousands(int64(out.Cluster.Capacity*out.Workload.BlockSize))))
	if out.Cluster.HostLoadCost != nil {
		fmt.Fprintf(w, "infinite cache: block hit %s, token hit %s\n", pct(ceil.BlockHitRate()), pct(ceil.TokenHitRate()))
		printTiered(w, "", out.Policies, true)
	} else {
		printPolicies(w, results, ceil)
	}
	printIndex(w, out, results)
}

// printPolicies is the policy table of a run without a host tier.
func printPolicies(w io.Writer, results []sim.Result, ceil sim.Ceiling) {
	// The two load columns: the busiest engine's requests, then its prompt tokens, each
	// over the mean engine's (1.000 is perfect balance).
	fmt.Fprintf(w, "%-16s %10s %10s %11s %14s %16s %8s\n", "policy", "block hit", "token hit", "of ceiling", "max/mean reqs", "max/mean tokens", "seconds")
	fmt.Fprintf(w, "%-16s %10s %10s %11s %14s %16s %8s\n", "infinite cache", pct(ceil.BlockHitRate()), pct(ceil.TokenHitRate()), "100.0%", "-", "-", "-")
	for _, r := range results {
		of := "-"
		if c := ceil.BlockHitRate(); c > 0 {
			of = fmt.Sprintf("%.1f%%", 100*r.BlockHitRate()/c)
		}
		fmt.Fprintf(w, "%-16s %10s %10s %11s %14.3f %16.3f %8.2f\n", r.Policy, pct(r.BlockHitRate()), pct(r.TokenHitRate()), of, r.MaxMeanLoad(), r.MaxMeanTokens(), r.Seconds)
	}
}

// printIndex is the index section of a run.
func printIndex(w io.Writer, out simJSON, results []sim.Result) {
	ix := *out.Index
	var r sim.Result
	for _, x := range results {
		if x.Policy.String() == ix.Policy {
			r = x
		}
	}
	s := r.Index
	fmt.Fprintf(w, "\nindex (the %s run)\n", ix.Policy)
	fmt.Fprintf(w, "  events applied   %s (%s stored, %s removed; %s rejected)\n",
		bench.Thousands(int64(s.Events)), bench.Thousands(s.StoredEvents), bench.Thousands(s.RemovedEvents), bench.Thousands(s.Rejected))
	if out.Cluster.HostLoadCost != nil {
		fmt.Fprintf(w, "  host tier        %s stored and %s removed events of those; %s host memberships at the end; %s blocks not offloaded (no tier held their parent)\n",
			bench.Thousands(s.HostStoredEvents), bench.Thousands(s.HostRemovedEvents), bench.Thousands(s.HostMemberships), bench.Thousands(r.Orphans))
	}
	report.PrintIndexOps(w, s)
	fmt.Fprintf(w, "\ntotal %.1f s\n", out.Seconds)
}

func printSweep(w io.Writer, out simJSON) {
	caps := make([]string, len(out.Sweep))
	for i, p := range out.Sweep {
		caps[i] = sweepLabel(p)
	}
	if out.Sweep[0].HostCapacity != nil {
		printHeader(w, out, bench.Thousands(int64(out.Cluster.Capacity))+" blocks")
		fmt.Fprintf(w, "by host capacity (blocks per worker); infinite cache: block hit %s; prefill work = (computed tokens + %g x loaded tokens) / input tokens\n",
			pct(out.Ceiling.BlockHitRate), *out.Cluster.HostLoadCost)
		for i, p := range out.Sweep {
			printTiered(w, fmt.Sprintf("%-8s ", caps[i]), p.Policies, i == 0)
		}
		fmt.Fprintf(w, "\n%s\ntotal %.1f s\n", chartLine(out.Chart), out.Seconds)
		return
	}
	if out.Sweep[0].EventDelayMs != nil {
		printHeader(w, out, bench.Thousands(int64(out.Cluster.Capacity))+" blocks")
		fmt.Fprintf(w, "block hit rate by event delay (simulated time from a request to its events); infinite cache %s\n", pct(out.Ceiling.BlockHitRate))
	} else {
		printHeader(w, out, "{"+strings.Join(caps, ", ")+"} blocks")
		fmt.Fprintf(w, "block hit rate by capacity (blocks per worker); infinite cache %s\n", pct(out.Ceiling.BlockHitRate))
	}
	fmt.Fprintf(w, "%-16s", "policy")
	for _, c := range caps {
		fmt.Fprintf(w, " %9s", c)
	}
	fmt.Fprintln(w)
	for i := range out.Sweep[0].Policies {
		fmt.Fprintf(w, "%-16s", out.Sweep[0].Policies[i].Name)
		for _, p := range out.Sweep {
			fmt.Fprintf(w, " %9s", pct(p.Policies[i].BlockHitRate))
		}
		fmt.Fprintln(w)
	}
	fmt.Fprintf(w, "\n%s\ntotal %.1f s\n", chartLine(out.Chart), out.Seconds)
}

// sweepLabel names a sweep point: its capacity, event delay or host capacity.
func sweepLabel(pt sweepPointJSON) string {
	if pt.EventDelayMs != nil {
		return time.Duration(*pt.EventDelayMs * 1e6).String()
	}
	if pt.HostCapacity != nil {
		return bench.Thousands(int64(*pt.HostCapacity))
	}
	return bench.Thousands(int64(pt.Capacity))
}

// writeChartIf writes a sweep's chart with write when --chart named a file.
func writeChartIf[T any](path string, out T, write func(string, T) error) error {
	if path == "" {
		return nil
	}
	return write(path, out)
}

// writeChart draws hit rate against the swept parameter, one line per policy and the
// ceiling.
func writeChart(path string, out simJSON) error {
	if out.Sweep[0].EventDelayMs != nil {
		return writeDelayChart(path, out)
	}
	if out.Sweep[0].HostCapacity != nil {
		return writeTierChart(path, out)
	}
	p := newHitRateChart("Prefix hit rate vs KV cache per worker",
		fmt.Sprintf("capacity (blocks of %d tokens per worker)", out.Workload.BlockSize))
	x := func(_ int, pt sweepPointJSON) float64 { return float64(pt.Capacity) }
	lines := append(policyLines(out, x, hitRate), ceilingLine(out, x)...)
	// Capacities usually double from point to point: a log axis spaces them evenly, and
	// a tick at each one names it.
	if lo, hi := xRange(out, x); hi >= 4*lo {
		p.X.Scale = plot.LogScale{}
	}
	return finishChart(p, path, out, x, func(pt sweepPointJSON) string { return strconv.Itoa(pt.Capacity) }, lines)
}

// writeDelayChart draws hit rate against event delay: the points evenly spaced (the
// delays usually grow by factors), each named by its tick.
func writeDelayChart(path string, out simJSON) error {
	p := newHitRateChart("Prefix hit rate vs event delay",
		"event delay (simulated time from routing a request to its KV events reaching the index)")
	lines := append(policyLines(out, sweepIndex, hitRate), ceilingLine(out, sweepIndex)...)
	return finishChart(p, path, out, sweepIndex, sweepLabel, lines)
}

// sweepIndex places sweep point j at x = j: evenly spaced.
func sweepIndex(j int, _ sweepPointJSON) float64 { return float64(j) }

func hitRate(pol policyJSON) float64 { return pol.BlockHitRate }

// newHitRateChart returns a chart of block hit rate, 0 to 1, against the given x axis.
func newHitRateChart(title, xLabel string) *plot.Plot {
	p := plot.New()
	p.Title.Text = title
	p.X.Label.Text = xLabel
	p.Y.Label.Text = "block hit rate"
	p.Y.Min, p.Y.Max = 0, 1
	p.Legend.Top = false
	p.Legend.Left = false
	p.Add(plotter.NewGrid())
	return p
}

// policyLines returns plotutil.AddLinePoints' arguments for one line per policy: its
// name, then its value y at each sweep point, placed at x.
func policyLines(out simJSON, x func(int, sweepPointJSON) float64, y func(policyJSON) float64) []any {
	var lines []any
	for i := range out.Sweep[0].Policies {
		pts := make(plotter.XYs, len(out.Sweep))
		for j, pt := range out.Sweep {
			pts[j].X, pts[j].Y = x(j, pt), y(pt.Policies[i])
		}
		lines = append(lines, out.Sweep[0].Policies[i].Name, pts)
	}
	return lines
}

// ceilingLine returns the infinite cache's hit rate as a flat line across the sweep.
func ceilingLine(out simJSON, x func(int, sweepPointJSON) float64) []any {
	lo, hi := xRange(out, x)
	return []any{"infinite cache", plotter.XYs{{X: lo, Y: out.Ceiling.BlockHitRate}, {X: hi, Y: out.Ceiling.BlockHitRate}}}
}

// xRange returns the least and greatest x of the sweep points.
func xRange(out simJSON, x func(int, sweepPointJSON) float64) (lo, hi float64) {
	lo, hi = math.Inf(1), math.Inf(-1)
	for j, pt := range out.Sweep {
		lo, hi = min(lo, x(j, pt)), max(hi, x(j, pt))
	}
	return lo, hi
}

// finishChart names each sweep point by a tick at its x, draws the lines and writes the
// chart to path.
func finishChart(p *plot.Plot, path string, out simJSON, x func(int, sweepPointJSON) float64, label func(sweepPointJSON) string, lines []any) error {
	var ticks []plot.Tick
	for j, pt := range out.Sweep {
		ticks = append(ticks, plot.Tick{Value: x(j, pt), Label: label(pt)})
	}
	p.X.Tick.Marker = plot.ConstantTicks(ticks)
	if err := plotutil.AddLinePoints(p, lines...); err != nil {
		return err
	}
	if err := saveChart(p, path); err != nil {
		return fmt.Errorf("writing chart: %w", err)
	}
	return nil
}

// writeTierChart draws the prefill work against the host tier's size, one line per
// policy: the points evenly spaced (0, no host, cannot sit on a log axis), each named by
// its tick. Lower is better: 1 is a cold cache.
func writeTierChart(path string, out simJSON) error {
	p := plot.New()
	p.Title.Text = fmt.Sprintf("Prefill work vs host tier (device %s blocks per worker; a host load costs %g of recompute)",
		bench.Thousands(int64(out.Cluster.Capacity)), *out.Cluster.HostLoadCost)
	p.X.Label.Text = fmt.Sprintf("host tier (blocks of %d tokens per worker)", out.Workload.BlockSize)
	p.Y.Label.Text = "prefill work (fraction of a cold cache's)"
	// The axis spans the lines, a twentieth of a cold cache's work beyond them: the
	// policies differ by points, which an axis from 0 would flatten.
	lo, hi := math.Inf(1), math.Inf(-1)
	for _, pt := range out.Sweep {
		for _, pol := range pt.Policies {
			lo, hi = min(lo, *pol.PrefillWork), max(hi, *pol.PrefillWork)
		}
	}
	p.Y.Min, p.Y.Max = max(0, math.Floor(lo*20-0.5)/20), min(1, math.Ceil(hi*20+0.5)/20)
	p.Legend.Top = true
	p.Add(plotter.NewGrid())
	lines := policyLines(out, sweepIndex, func(pol policyJSON) float64 { return *pol.PrefillWork })
	return finishChart(p, path, out, sweepIndex, sweepLabel, lines)
}

// saveChart writes p to path in the format its extension names. An SVG carries its
// fonts (gonum lays text out with the metrics of its own Liberation fonts; a viewer
// that substitutes another font clips the labels), as a PDF does by default; a PNG is
// rasterised here.
func saveChart(p *plot.Plot, path string) error {
	const w, h = 8 * vg.Inch, 5 * vg.Inch
	if strings.ToLower(filepath.Ext(path)) != ".svg" {
		return p.Save(w, h, path)
	}
	c := vgsvg.NewWith(vgsvg.UseWH(w, h), vgsvg.EmbedFonts(true))
	p.Draw(draw.New(c))
	return report.WriteCanvas(c, path)
}

// simProgress shows a bar on stderr once a run has gone on for progressDelay, when stderr
// is a terminal or --progress was given.
type simProgress struct {
	w       *gatedWriter
	on      bool
	start   time.Time
	bar     *progressbar.ProgressBar
	stopped bool
}

// gatedWriter discards what is written until it opens: the progress bar runs, and
// measures its rate, from the first request, but shows only after progressDelay.
type gatedWriter struct {
	w    io.Writer
	open bool
}

func (g *gatedWriter) Write(b []byte) (int, error) {
	if !g.open {
		return len(b), nil
	}
	return g.w.Write(b)
}

func newProgress(w io.Writer, force bool, total int) *simProgress {
	on := force
	if f, ok := w.(*os.File); ok && !on {
		if st, err := f.Stat(); err == nil && st.Mode()&os.ModeCharDevice != 0 {
			on = true
		}
	}
	p := &simProgress{w: &gatedWriter{w: w}, on: on && total > 0, start: time.Now()}
	if p.on {
		p.bar = progressbar.NewOptions(total,
			progressbar.OptionSetWriter(p.w),
			progressbar.OptionSetDescription("simulating"),
			progressbar.OptionShowCount(),
			progressbar.OptionSetItsString("req"),
			progressbar.OptionShowIts(),
			progressbar.OptionThrottle(100*time.Millisecond),
			progressbar.OptionSetWidth(30),
		)
		p.bar.StartWithoutRender()
	}
	return p
}

func (p *simProgress) add(n int) {
	if !p.on || p.stopped {
		return
	}
	if !p.w.open && time.Since(p.start) >= progressDelay {
		p.w.open = true
	}
	_ = p.bar.Add(n)
}

func (p *simProgress) finish() {
	if p.stopped {
		return
	}
	p.stopped = true
	if p.bar != nil && p.w.open {
		_ = p.bar.Finish()
		fmt.Fprintln(p.w)
	}
}
