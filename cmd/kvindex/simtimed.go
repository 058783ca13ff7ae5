package main

import (
	"flag"
	"io"
	"runtime"
	"strings"
	"time"

	"github.com/kvindex/kvindex/engine"
	"github.com/kvindex/kvindex/internal/parallel"
	"github.com/kvindex/kvindex/route"
	"github.com/kvindex/kvindex/sim"
	"github.com/kvindex/kvindex/sim/report"
)

// timedFlags are sim's flags for the simulation under time (the default).
type timedFlags struct {
	zeroTime                       bool
	speedup                        float64
	slo                            time.Duration
	routers                        int
	shareLoad                      bool
	affinity                       string
	overlapWeight                  float64
	prefixWeight, kvWeight, queueW float64
	route                          route.Params // temperature, affinity, min-max prefix
	maxSeqs, output, jobs          int
	profile                        string
	metricsInterval                time.Duration
	openLoop                       bool
	thinkTime                      time.Duration
	prefillScale                   float64
	approxCapacity, approxBlock    int
	approxMaxBlocks                int
	ramp, rampStages               string
}

// timedOnly are the flags --zero-time has no use for.
var timedOnly = []string{"speedup", "slo-ttft", "routers", "share-load", "router-affinity", "overlap-weight", "prefix-weight", "kv-weight",
	"queue-weight", "prefix-minmax", "temperature", "affinity-threshold", "peak-prefill-throughput", "max-ttft-penalty-ms", "max-num-seqs", "output-length", "profile", "metrics-interval", "jobs", "open-loop", "think-time", "prefill-scale", "approx-capacity", "approx-block", "ramp", "ramp-stages", "queue-threshold", "output-blocks", "approx-max-blocks"}

// zeroTimeOnly are the flags only --zero-time takes: host tiers are simulated without
// time only.
var zeroTimeOnly = []string{"host-capacity", "host-load-cost", "tier-weights"}

func (t *timedFlags) register(fs *flag.FlagSet) {
	fs.BoolVar(&t.zeroTime, "zero-time", false, "the zero-time model: a request is served in full when it arrives, one at a time (hit rates only; gen-ops' model)")
	fs.Float64Var(&t.speedup, "speedup", 1, "multiply arrival rates by X (a trace's timestamps are divided by it)")
	fs.DurationVar(&t.slo, "slo-ttft", sim.DefaultSLOTTFT, "time-to-first-token objective of goodput")
	fs.IntVar(&t.routers, "routers", 1, "independent router replicas (own load tracking, predictions, approximate cache), all reading one exact index")
	fs.BoolVar(&t.shareLoad, "share-load", false, "the router replicas share their load, as kvindex serve's replicas do over NATS (each replica's tracker counts every replica's requests)")
	fs.StringVar(&t.affinity, "router-affinity", "none", "how a front load balancer spreads requests over the routers: none (round-robin) or session; unset, with --routers above 1, every policy runs both ways")
	fs.Float64Var(&t.overlapWeight, "overlap-weight", route.DefaultOverlapWeight, "the cost policies' weight of a prefill block against a decode block (Dynamo's kv-overlap-score-weight)")
	fs.Float64Var(&t.prefixWeight, "prefix-weight", route.DefaultPrefixWeight, "the scorer policies' weight of the prefix score (llm-d's)")
	fs.Float64Var(&t.kvWeight, "kv-weight", route.DefaultKVWeight, "the scorer policies' weight of the KV-utilisation score")
	fs.Float64Var(&t.queueW, "queue-weight", route.DefaultQueueWeight, "the scorer policies' weight of the queue score")
	fs.BoolVar(&t.route.PrefixMinMax, "prefix-minmax", false, "llmd-scorer: min-max normalise the prefix score over the workers holding some of it (llm-d's earlier precise scorer) instead of matched/total")
	fs.Float64Var(&t.route.Temperature, "temperature", 0, "dynamo-cost's softmax temperature (Dynamo's router_temperature; 0 = the least cost)")
	fs.Float64Var(&t.route.QueueThreshold, "queue-threshold", route.QueueOff, "dynamo-cost's router queue: a request waits at the router while every engine's prefill tokens in flight exceed this many steps of tokens (Dynamo's router_queue_threshold, 16 in its earlier default; negative: no queue, Dynamo's default)")
	fs.BoolVar(&t.route.TrackOutputBlocks, "output-blocks", false, "count the blocks each request generates in its engine's active blocks, which dynamo-cost reads (Dynamo's router_track_output_blocks, off as it ships)")
	fs.Float64Var(&t.route.Affinity.Threshold, "affinity-threshold", route.DefaultAffinityThreshold, "llmd-affinity: the prefix share that makes a worker sticky (llm-d's affinityThreshold)")
	fs.Float64Var(&t.route.Affinity.PeakPrefillThroughput, "peak-prefill-throughput", route.DefaultPeakPrefillThroughput, "llmd-affinity: prefill tokens per second that turn in-flight tokens into an estimated TTFT (llm-d's peakPrefillThroughput)")
	fs.Float64Var(&t.route.Affinity.MaxTTFTPenaltyMs, "max-ttft-penalty-ms", route.DefaultMaxTTFTPenaltyMs, "llmd-affinity: how much later (ms) a sticky worker's estimated first token may come before stickiness breaks (llm-d's maxTTFTPenaltyMs)")
	fs.IntVar(&t.maxSeqs, "max-num-seqs", sim.DefaultMaxNumSeqs, "running requests per engine at most (vLLM's max_num_seqs; default: the profile's, else 1,024, vLLM's on H100s)")
	fs.IntVar(&t.output, "output-length", 0, "tokens every request generates (0 = the workload's: a trace's output_length, the built-in replies, 1,000 for shared-context)")
	fs.StringVar(&t.profile, "profile", "", "the engine: a shipped profile ("+strings.Join(sim.ShippedProfiles(), ", ")+"), an engine file (.profile: the model's shape and its GPUs'; its KV tokens set --capacity), or a CSV of measured ttft,ISL,CACHED,SECONDS and itl,BATCH,CONTEXT,SECONDS points (default "+sim.DefaultProfile+"; sim/README.md)")
	fs.IntVar(&t.approxCapacity, "approx-capacity", 0, "approximate-lru's keys per engine (llm-d's lruCapacityPerServer; 0: auto-tuned, the engine's KV blocks; llm-d's fallback without metrics is 31250)")
	fs.IntVar(&t.approxBlock, "approx-block", 0, "tokens per key of approximate-lru (llm-d's blockSizeTokens; 0: auto-tuned, the engine's block, at least 64; llm-d's fallback is 16)")
	fs.IntVar(&t.approxMaxBlocks, "approx-max-blocks", 0, "the most keys of a prompt approximate-lru matches (0: auto-tuned, 131,072 tokens' worth, llm-d's maxPrefixTokensToMatch; GIE's earlier maxPrefixBlocksToMatch was 256)")
	fs.StringVar(&t.ramp, "ramp", "", "one staged load: RATE:SECONDS,... (stages back to back, each inheriting the last one's queues) or a published benchmark's, run as it ran ("+strings.Join(sim.RampNames(), ", ")+"); reports each stage")
	fs.StringVar(&t.rampStages, "ramp-stages", "", "with --ramp: back-to-back, or drain[:PAUSE] (each stage waits for its requests to finish, then PAUSE, as inference-perf runs stages; llm-d-guide's default: drain:31s)")
	fs.Float64Var(&t.prefillScale, "prefill-scale", 1, "multiply the engine's prefill time (sensitivity to the engine's speed)")
	fs.DurationVar(&t.metricsInterval, "metrics-interval", sim.DefaultMetricsInterval, "how often the scorer policies' routers read the engines' queue and KV utilisation")
	fs.BoolVar(&t.openLoop, "open-loop", false, "send every turn of a conversation at its arrival, even before the reply it repeats is generated (default: the closed loop, which holds it until then plus --think-time)")
	fs.DurationVar(&t.thinkTime, "think-time", sim.DefaultThinkTime, "closed loop: least time between a reply's last token and the next turn")
	fs.IntVar(&t.jobs, "jobs", 0, "policies simulated at once (0 = the CPUs; the run that measures the index always runs alone)")
}

// checkZeroTime rejects the flags of the timed model beside --zero-time.
func (t *timedFlags) checkZeroTime(set map[string]bool) error {
	for _, n := range timedOnly {
		if set[n] {
			return usageErr("--%s applies to the simulation under time, not to --zero-time", n)
		}
	}
	return nil
}

func (t *timedFlags) validate(set map[string]bool) error {
	for _, n := range zeroTimeOnly {
		if set[n] {
			return usageErr("--%s: host tiers are simulated by --zero-time only", n)
		}
	}
	_, cerr := route.NewCost(t.overlapWeight, t.route.Temperature)
	_, serr := route.NewScorer(t.prefixWeight, t.kvWeight, t.queueW, false)
	_, aerr := route.NewAffinity(t.route.Affinity)
	switch {
	case !(t.speedup >= 1/sim.MaxSpeedup && t.speedup <= sim.MaxSpeedup):
		return usageErr("--speedup %g: want %g..%g", t.speedup, 1/sim.MaxSpeedup, float64(sim.MaxSpeedup))
	case t.slo < 0 || t.slo > 24*time.Hour:
		return usageErr("--slo-ttft %v: want 0..24h", t.slo)
	case t.routers < 1 || t.routers > sim.MaxRouters:
		return usageErr("--routers %d: want 1..%d", t.routers, sim.MaxRouters)
	case t.affinity != "none" && t.affinity != "session":
		return usageErr("--router-affinity %q: want none or session", t.affinity)
	case cerr != nil:
		return usageErr("--overlap-weight %g --temperature %g: %v", t.overlapWeight, t.route.Temperature, cerr)
	case aerr != nil:
		return usageErr("--affinity-threshold, --peak-prefill-throughput, --max-ttft-penalty-ms: %v", aerr)
	case serr != nil:
		return usageErr("--prefix-weight %g --kv-weight %g --queue-weight %g: each 0..%g", t.prefixWeight, t.kvWeight, t.queueW, route.MaxWeight)
	case t.prefixWeight == 0 && t.kvWeight == 0 && t.queueW == 0:
		return usageErr("--prefix-weight, --kv-weight and --queue-weight all 0: the scorer would pick at random")
	case t.maxSeqs < 1 || t.maxSeqs > 1<<16:
		return usageErr("--max-num-seqs %d: want 1..%d", t.maxSeqs, 1<<16)
	case t.output < 0 || t.output > sim.MaxOutput:
		return usageErr("--output-length %d: want 0..%d", t.output, sim.MaxOutput)
	case t.metricsInterval < time.Microsecond || t.metricsInterval > time.Hour:
		return usageErr("--metrics-interval %v: want 1µs..1h", t.metricsInterval)
	case !(t.prefillScale >= 1.0/sim.MaxPrefillScale && t.prefillScale <= sim.MaxPrefillScale):
		return usageErr("--prefill-scale %g: want %g..%g", t.prefillScale, 1.0/sim.MaxPrefillScale, float64(sim.MaxPrefillScale))
	case t.approxCapacity < 0 || t.approxCapacity > route.MaxApproxCapacity:
		return usageErr("--approx-capacity %d: want 0 (auto) or 1..%d keys", t.approxCapacity, route.MaxApproxCapacity)
	case t.approxMaxBlocks < 0 || t.approxMaxBlocks > route.MaxApproxCapacity:
		return usageErr("--approx-max-blocks %d: want 0 (auto) or 1..%d keys", t.approxMaxBlocks, route.MaxApproxCapacity)
	case t.approxBlock < 0 || t.approxBlock > sim.MaxApproxBlock:
		return usageErr("--approx-block %d: want 0 (auto) or 1..%d tokens", t.approxBlock, sim.MaxApproxBlock)
	case t.route.QueueThreshold > route.MaxQueueThreshold:
		return usageErr("--queue-threshold %g: want at most %g (negative: no queue)", t.route.QueueThreshold, route.MaxQueueThreshold)
	case t.thinkTime < 0 || t.thinkTime > sim.MaxThinkTime:
		return usageErr("--think-time %v: want 0..%v", t.thinkTime, sim.MaxThinkTime)
	case t.openLoop && set["think-time"]:
		return usageErr("--think-time applies to the closed loop, not to --open-loop")
	case t.jobs < 0 || t.jobs > 256:
		return usageErr("--jobs %d: want 0..256", t.jobs)
	}
	return nil
}

// parseRoutings reads a comma-separated list of timed policies ("" = the default
// rows, sim.Routings; "all" = every row of the registry).
func parseRoutings(s string) ([]sim.Routing, error) {
	switch s {
	case "all":
		return sim.AllRoutings(), nil
	case "":
		return sim.Routings(), nil
	}
	var out []sim.Routing
	seen := map[string]bool{}
	for _, name := range strings.Split(s, ",") {
		name = strings.TrimSpace(name)
		r, err := sim.ParseRouting(name)
		if err != nil {
			names := timedPolicyNames()
			return nil, usageErr("--policies: unknown policy %q (want a comma-separated list of %s; %s need --zero-time)",
				name, strings.Join(names, ", "), strings.Join(onlyIn(zeroTimePolicyNames(), names), ", "))
		}
		if !seen[name] {
			seen[name] = true
			out = append(out, r)
		}
	}
	return out, nil
}

func runTimed(stdout, stderr io.Writer, f *simFlags, tf *timedFlags, policies, sweep, chart string, asJSON, forceProgress bool) error {
	if err := tf.validate(f.set); err != nil {
		return err
	}
	var sw report.Sweep
	if sweep != "" {
		var err error
		if sw, err = report.ParseSweep(sweep); err != nil {
			return usageErr("%v", err)
		}
	}
	rts, err := parseRoutings(policies)
	if err != nil {
		return err
	}
	var ramp sim.Ramp
	if tf.ramp != "" {
		if ramp, err = sim.ParseRamp(tf.ramp); err != nil {
			return usageErr("--ramp: %s", strings.TrimPrefix(err.Error(), sim.ErrConfig.Error()+": "))
		}
		if ramp, err = ramp.WithStages(tf.rampStages); err != nil {
			return usageErr("--ramp-stages: %s", strings.TrimPrefix(err.Error(), sim.ErrConfig.Error()+": "))
		}
		switch {
		case f.trace != "":
			return usageErr("--ramp sets the arrivals; a trace has its own")
		case sweep != "":
			return usageErr("--ramp and --sweep: give one")
		case f.set["rate"]:
			return usageErr("--ramp sets the rates; --rate has no use beside it")
		}
	}
	cost, costName, spec, err := report.LoadCost(tf.profile)
	if err != nil {
		return err
	}
	if spec.KVTokens > 0 && !f.set["capacity"] {
		f.capacity = spec.KVTokens / f.blockSize
	}
	if spec.MaxNumSeqs > 0 && !f.set["max-num-seqs"] {
		tf.maxSeqs = spec.MaxNumSeqs
	}
	if spec.MaxNumBatchedTokens > 0 && !f.set["chunk"] {
		f.chunk = spec.MaxNumBatchedTokens
	}
	if err := sw.CheckFleet(f.workers); err != nil {
		return usageErr("%v", err)
	}
	defRequests := sim.DefaultRequests
	if tf.ramp != "" {
		defRequests = sim.RampRequests(ramp.Stages, tf.speedup)
	} else if tf.rampStages != "" {
		return usageErr("--ramp-stages without --ramp")
	}
	w, wi, err := f.workload(defRequests, tf.ramp != "")
	if err != nil {
		return err
	}
	cfg := sim.TimedConfig{
		Config: sim.Config{Workers: f.workers, Capacity: f.capacity, ChunkTokens: f.chunk, Seed: f.seed,
			Engine: engine.Config{Shards: f.shards, JumpSize: f.jump}, EventDelay: -1, Rate: f.rate, PredictionTTL: f.predictionTTL},
		Speedup: tf.speedup, Output: tf.output, MaxNumSeqs: tf.maxSeqs, Cost: cost, SLOTTFT: tf.slo, Routers: tf.routers,
		PrefillScale: tf.prefillScale, ApproxCapacity: tf.approxCapacity, ApproxBlock: tf.approxBlock, ApproxMaxBlocks: tf.approxMaxBlocks,
		Ramp:          ramp,
		OverlapWeight: tf.overlapWeight, MetricsInterval: tf.metricsInterval, OpenLoop: tf.openLoop, ThinkTime: tf.thinkTime,
		Scorer: route.Scorer{PrefixWeight: tf.prefixWeight, KVWeight: tf.kvWeight, QueueWeight: tf.queueW},
		Route:  tf.route, ShareLoad: tf.shareLoad,
	}
	if f.eventDelay > 0 {
		cfg.EventDelay = f.eventDelay
	}
	if tf.affinity == "session" {
		cfg.Affinity = sim.AffinitySession
	}
	if cfg.Route.QueueThreshold == 0 {
		cfg.Route.QueueThreshold = 1e-12 // Dynamo's 0.0: busy at any prefill, where 0 would mean no queue (the default)
	}
	if cfg.ThinkTime == 0 {
		cfg.ThinkTime = -1 // none, where 0 would mean the default
	}
	if cfg.Rate == 0 && w.Kind == "shared-context" {
		cfg.Rate = sim.DefaultSharedRate
	}
	t := report.Timed{Workload: w, Info: wi, Config: cfg, CostName: costName, Routings: rts, Sweep: sw, Chart: chart,
		Warn: stderr, Parallel: tf.jobs, BothAffinities: !f.set["router-affinity"]}
	if err := t.Check(); err != nil {
		return usageErr("%v", err)
	}
	return simulateTimed(stdout, stderr, t, asJSON, forceProgress)
}

// simulateTimed runs the experiment (sim/report) with a progress bar and prints it.
func simulateTimed(stdout, stderr io.Writer, t report.Timed, asJSON, forceProgress bool) error {
	rts, sw, w := t.Routings, t.Sweep, t.Workload
	rows := len(rts)
	if t.BothAffinities && t.Config.Routers > 1 && sw.Key != "routers" {
		rows *= 2
	}
	prog := newProgress(stderr, forceProgress, max(1, len(sw.Vals))*rows*len(w.Requests))
	defer prog.Finish()
	t.Config.Progress = parallel.Serialize(prog.Add) // the simulations running at once all add
	if t.Parallel == 0 {
		t.Parallel = runtime.GOMAXPROCS(0)
	}
	rep, err := report.RunTimed(t)
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
