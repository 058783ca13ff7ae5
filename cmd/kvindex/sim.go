package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
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
	fs.StringVar(&f.tierWeights, "tier-weights", "1,0.75,0.25", "longest-prefix/exact:weighted-tiers' weights of a device, host and disk block, as D,H,DISK in [0, 1]")
}

// parseWeights reads "D,H,K": the tier weights of longest-prefix/exact:weighted-tiers.
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
func (f *simFlags) workload(defRequests int, ramp bool) (*sim.Workload, report.WorkloadInfo, error) {
	if f.trace != "" {
		w, wi, err := report.TraceWorkload(f.trace, f.requests, f.blockSize)
		return w, wi, traceNotFound(err)
	}
	n := f.requests
	if n == 0 && (ramp || f.kind == "built-in") {
		n = defRequests
	}
	var w *sim.Workload
	var err error
	if f.kind == "shared-context" {
		w, err = sim.SharedContext(sim.SharedContextConfig{Seed: f.seed, Requests: n, BlockSize: f.blockSize,
			Groups: f.groups, GroupTokens: f.groupTokens, UsersPerGroup: f.users, QueryTokens: f.queryTokens})
	} else {
		w, err = sim.Generate(sim.GenConfig{Seed: f.seed, Requests: n, BlockSize: f.blockSize, Sessions: f.sessions, ReplyDropped: 1 - f.replyReuse})
	}
	if err != nil {
		return nil, report.WorkloadInfo{}, err
	}
	return w, report.Describe(w, f.kind, ""), nil // f.kind: built-in or shared-context
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

// names spells policies or routings as --policies does.
func names[T fmt.Stringer](xs []T) []string {
	out := make([]string, len(xs))
	for i, x := range xs {
		out[i] = x.String()
	}
	return out
}

// timedPolicyNames and zeroTimePolicyNames are the policies of each model.
func timedPolicyNames() []string    { return names(sim.AllRoutings()) }
func zeroTimePolicyNames() []string { return names(sim.Policies()) }

// policiesHelp is --policies' help: every policy of both models, so that the help lists
// what the errors of parsePolicies and parseRoutings accept.
func policiesHelp() string {
	return "comma-separated routing policies to compare: " + strings.Join(timedPolicyNames(), ", ") +
		" (FAMILY/KNOWLEDGE, docs/routing.md; default: " + strings.Join(names(sim.Routings()), ",") + "); with --zero-time: " + strings.Join(zeroTimePolicyNames(), ", ") +
		" (default " + report.DefaultZeroTimePolicies + ")"
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
	sweep := fs.String("sweep", "", "rerun every policy at each point and chart the outcomes: speedup=X1,X2,..., routers=N1,N2,..., capacity=A,B,... or event-delay=D1,D2,...; with --zero-time capacity=, event-delay= or host-capacity=H1,H2,... (hit rates; host-capacity: the prefill work, policies default to "+report.TierPolicies+")")
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
		return runZeroTime(stdout, stderr, &f, *policies, *sweep, *chart, *asJSON, *forceProgress)
	}()
	return exitCode(stderr, "sim", err)
}

// runZeroTime checks --zero-time's flags, builds the workload and runs the experiment
// (sim/report) with a progress bar.
func runZeroTime(stdout, stderr io.Writer, f *simFlags, policies, sweep, chart string, asJSON, forceProgress bool) error {
	var sp report.ZeroTimeSweep
	var err error
	if sweep != "" {
		if sp, err = report.ParseZeroTimeSweep(sweep); err != nil {
			return usageErr("%v", err)
		}
		if sp.Hosts != nil && f.set["host-capacity"] {
			return usageErr("--host-capacity and --sweep host-capacity=...: give one")
		}
	}
	if policies == "" {
		policies = report.DefaultZeroTimePolicies
		if sp.Hosts != nil {
			policies = report.TierPolicies
		}
	}
	pols, err := parsePolicies(policies)
	if err != nil {
		return err
	}
	if err := sp.CheckFleet(f.workers, f.capacity, f.hostCapacity); err != nil {
		return usageErr("%v", err)
	}
	w, wi, err := f.workload(sim.DefaultRequests, false)
	if err != nil {
		return err
	}
	if err := sp.CheckWorkload(f.capacity, w); err != nil {
		return usageErr("%v", err)
	}
	prog := newProgress(stderr, forceProgress, len(pols)*max(1, sp.Points())*len(w.Requests))
	defer prog.Finish()
	cfg := f.config()
	cfg.Progress = prog.Add
	rep, err := report.RunZeroTime(context.Background(), report.ZeroTime{Workload: w, Info: wi, Config: cfg, Policies: pols, Sweep: sp, Chart: chart})
	if err != nil {
		return err
	}
	prog.Finish()
	if asJSON {
		return printJSON(stdout, rep.JSON)
	}
	rep.Print(stdout)
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

// newProgress shows a bar of total requests on stderr once a run has gone on for
// progressDelay, when stderr is a terminal or --progress was given.
func newProgress(w io.Writer, force bool, total int) *report.Progress {
	if f, ok := w.(*os.File); ok && !force {
		if st, err := f.Stat(); err == nil && st.Mode()&os.ModeCharDevice != 0 {
			force = true
		}
	}
	return report.NewProgress(w, force && total > 0, total, progressDelay)
}
