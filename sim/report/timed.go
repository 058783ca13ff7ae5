package report

import (
	"context"
	"fmt"
	"image/color"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/kvindex/kvindex/bench"
	"github.com/kvindex/kvindex/internal/parallel"
	"github.com/kvindex/kvindex/route"
	"github.com/kvindex/kvindex/sim"
	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
	"gonum.org/v1/plot/vg/vgpdf"
	"gonum.org/v1/plot/vg/vgsvg"
)

// Sweep is a parsed --sweep of the timed model: one parameter, its values.
type Sweep struct {
	Key  string // speedup, routers, capacity or event-delay
	Vals []float64
}

func ParseSweep(s string) (Sweep, error) {
	key, list, ok := strings.Cut(s, "=")
	sw := Sweep{Key: strings.TrimSpace(key)}
	if !ok || (sw.Key != "speedup" && sw.Key != "routers" && sw.Key != "capacity" && sw.Key != "event-delay") {
		return sw, fmt.Errorf("--sweep %q: want speedup=X1,X2,..., routers=N1,N2,..., capacity=A,B,... or event-delay=D1,D2,... (host-capacity needs --zero-time)", s)
	}
	for _, v := range strings.Split(list, ",") {
		v = strings.TrimSpace(v)
		var x float64
		var err error
		switch sw.Key {
		case "speedup":
			x, err = strconv.ParseFloat(v, 64)
			if err == nil && !(x >= 1/sim.MaxSpeedup && x <= sim.MaxSpeedup) {
				err = fmt.Errorf("out of range")
			}
		case "routers":
			var n int
			n, err = strconv.Atoi(v)
			if err == nil && (n < 1 || n > sim.MaxRouters) {
				err = fmt.Errorf("out of range")
			}
			x = float64(n)
		case "capacity":
			var n int
			n, err = strconv.Atoi(v)
			if err == nil && (n < 1 || n > sim.MaxCapacity) {
				err = fmt.Errorf("out of range")
			}
			x = float64(n)
		case "event-delay":
			d, derr := time.ParseDuration(v)
			if v == "0" {
				d, derr = 0, nil
			}
			if derr == nil && (d < 0 || d > time.Hour) {
				derr = fmt.Errorf("out of range")
			}
			x, err = float64(d), derr
		}
		if err != nil {
			return sw, fmt.Errorf("--sweep: %s %q is not a valid value", sw.Key, v)
		}
		sw.Vals = append(sw.Vals, x)
	}
	if len(sw.Vals) < 2 {
		return sw, fmt.Errorf("--sweep %q: give at least two points", s)
	}
	return sw, nil
}

// apply sets the swept parameter of cfg to point k.
func (sw Sweep) Apply(cfg *sim.TimedConfig, k int) {
	switch v := sw.Vals[k]; sw.Key {
	case "speedup":
		cfg.Speedup = v
	case "routers":
		cfg.Routers = int(v)
	case "capacity":
		cfg.Capacity = int(v)
	case "event-delay":
		cfg.EventDelay = time.Duration(v)
		if cfg.EventDelay == 0 {
			cfg.EventDelay = -1
		}
	}
}

// label names point k.
func (sw Sweep) Label(k int) string {
	switch v := sw.Vals[k]; sw.Key {
	case "event-delay":
		return time.Duration(v).String()
	case "speedup":
		return strconv.FormatFloat(v, 'g', -1, 64) + "x"
	default:
		return bench.Thousands(int64(v))
	}
}

// JSON shapes of the timed `kvindex sim --json`.
type (
	timedClusterJSON struct {
		Workers        int        `json:"workers"`
		Capacity       int        `json:"capacity_blocks,omitempty"`
		StepTokens     int        `json:"step_tokens"`
		MaxNumSeqs     int        `json:"max_num_seqs"`
		CostModel      string     `json:"cost_model"`
		Shards         int        `json:"shards"`
		Locked         bool       `json:"locked_index,omitempty"`
		Jump           int        `json:"jump"`
		EventDelayMs   float64    `json:"event_delay_ms"`
		Routers        int        `json:"routers,omitempty"`
		RouterAffinity string     `json:"router_affinity"`
		ShareLoad      bool       `json:"share_load,omitempty"`
		Speedup        float64    `json:"speedup,omitempty"`
		Rate           float64    `json:"rate,omitempty"` // built-in workloads' arrivals per second before the speedup
		SLOTTFTs       float64    `json:"slo_ttft_s"`
		OpenLoop       bool       `json:"open_loop"`
		PrefillScale   float64    `json:"prefill_scale"`
		ApproxCapacity int        `json:"approx_capacity_keys"`
		ApproxBlock    int        `json:"approx_block_tokens"`
		ThinkTimeS     float64    `json:"think_time_s"`
		OverlapWeight  float64    `json:"overlap_weight"`
		ScorerWeights  [3]float64 `json:"scorer_weights"`
	}
	referencesJSON struct {
		Infinite     HitsJSON `json:"infinite_cache"`
		Pooled       HitsJSON `json:"pooled_lru"`
		PooledBlocks int64    `json:"pooled_lru_blocks"`
		Reuse        struct {
			Reusing      int     `json:"reusing_requests"`
			GapP50       float64 `json:"gap_p50_s"`
			GapP90       float64 `json:"gap_p90_s"`
			NewTokensP50 int64   `json:"new_tokens_p50"`
			NewTokensP90 int64   `json:"new_tokens_p90"`
		} `json:"reuse"`
	}
	timedPolicyJSON struct {
		Name         string  `json:"name"`
		Routers      int     `json:"routers"`
		Affinity     string  `json:"router_affinity,omitempty"` // with BothAffinities
		BlockHitRate float64 `json:"block_hit_rate"`
		TokenHitRate float64 `json:"token_hit_rate"`
		HitBlocks    int64   `json:"hit_blocks"`
		Blocks       int64   `json:"blocks"`
		ReplyHitRate float64 `json:"reply_block_hit_rate"`
		PromptHit    float64 `json:"prompt_block_hit_rate"`
		Turns        int64   `json:"turns"`
		Waited       int64   `json:"waited"`
		WaitedShare  float64 `json:"waited_share"`
		TTFTp50      float64 `json:"ttft_p50_s"`
		TTFTp90      float64 `json:"ttft_p90_s"`
		TTFTp99      float64 `json:"ttft_p99_s"`
		ITLp50       float64 `json:"itl_p50_s"`
		ITLp90       float64 `json:"itl_p90_s"`
		E2Ep50       float64 `json:"e2e_p50_s"`
		E2Ep90       float64 `json:"e2e_p90_s"`
		OutputTokens int64   `json:"output_tokens"`
		OutTokPerS   float64 `json:"output_tok_per_s"`
		Goodput      float64 `json:"goodput"`
		SLOMet       float64 `json:"slo_met"`
		Makespan     float64 `json:"makespan_s"`
		KVUtilMean   float64 `json:"kv_util_mean"`
		KVUtilP90    float64 `json:"kv_util_p90"`
		QueueMean    float64 `json:"queue_mean"`
		QueueP90     int     `json:"queue_p90"`
		QueueMax     int     `json:"queue_max"`
		Preemptions  int64   `json:"preemptions"`
		MaxMeanLoad  float64 `json:"max_mean_load"`
		MaxMeanToken float64 `json:"max_mean_tokens"`
		Seconds      float64 `json:"seconds"`
		// Index is the exact index's side, for the policies that read events.
		Index *IndexJSON `json:"index,omitempty"`
		// Stages are the ramp's, with --ramp.
		Stages []stageJSON `json:"stages,omitempty"`
	}
	stageJSON struct {
		Rate         float64 `json:"rate"`
		StartS       float64 `json:"start_s"`
		DurationS    float64 `json:"duration_s"`
		SpanS        float64 `json:"span_s"`
		Requests     int     `json:"requests"`
		TTFTp50      float64 `json:"ttft_p50_s"`
		TTFTp90      float64 `json:"ttft_p90_s"`
		OutTokPerS   float64 `json:"output_tok_per_s"`
		BlockHitRate float64 `json:"block_hit_rate"`
		QueueMid     int     `json:"queue_mid"`
		QueueEnd     int     `json:"queue_end"`
		Unstable     bool    `json:"unstable"`
		Drained      bool    `json:"drained"`
	}
	timedPointJSON struct {
		Param    string            `json:"param"`
		Value    float64           `json:"value"`
		Label    string            `json:"label"`
		Policies []timedPolicyJSON `json:"policies"`
	}
	TimedJSON struct {
		Model      string            `json:"model"`
		Workload   WorkloadInfo      `json:"workload"`
		Cluster    timedClusterJSON  `json:"cluster"`
		References referencesJSON    `json:"references"`
		Policies   []timedPolicyJSON `json:"policies,omitempty"`
		Index      *IndexJSON        `json:"index,omitempty"`
		Sweep      []timedPointJSON  `json:"sweep,omitempty"`
		Chart      string            `json:"chart,omitempty"`
		Seconds    float64           `json:"seconds"`
	}
)

func toTimedPolicyJSON(r sim.TimedResult, measured bool) timedPolicyJSON {
	p := timedPolicyJSON{
		Name: r.Routing.Name, Routers: r.Routers, BlockHitRate: r.BlockHitRate(), TokenHitRate: r.TokenHitRate(),
		HitBlocks: r.HitBlocks, Blocks: r.Blocks, ReplyHitRate: r.ReplyHitRate(), PromptHit: r.PromptHitRate(),
		Turns: r.Turns, Waited: r.Waited, WaitedShare: r.WaitedShare(),
		TTFTp50: r.TTFT.P50, TTFTp90: r.TTFT.P90, TTFTp99: r.TTFT.P99, ITLp50: r.ITL.P50, ITLp90: r.ITL.P90,
		E2Ep50: r.E2E.P50, E2Ep90: r.E2E.P90, OutputTokens: r.OutputTokens, OutTokPerS: r.OutputTokPerS,
		Goodput: r.Goodput, SLOMet: r.SLOMet, Makespan: r.Makespan, KVUtilMean: r.KVUtilMean, KVUtilP90: r.KVUtilP90,
		QueueMean: r.QueueMean, QueueP90: r.QueueP90, QueueMax: r.QueueMax, Preemptions: r.Preemptions,
		MaxMeanLoad: r.MaxMeanLoad(), MaxMeanToken: r.MaxMeanTokens(), Seconds: r.Seconds,
	}
	for _, st := range r.Stages {
		p.Stages = append(p.Stages, stageJSON{Rate: st.Rate, StartS: st.Start.Seconds(), DurationS: st.Duration.Seconds(), SpanS: st.Span.Seconds(),
			Requests: st.Requests, TTFTp50: st.TTFT.P50, TTFTp90: st.TTFT.P90, OutTokPerS: st.OutputTokPerS,
			BlockHitRate: st.BlockHitRate(), QueueMid: st.QueueMid, QueueEnd: st.QueueEnd, Unstable: st.Unstable, Drained: st.Drained})
	}
	if r.Index.Queries > 0 || r.Index.Events > 0 {
		ix := IndexOf(sim.Result{Policy: sim.KVAware, Index: r.Index}, measured)
		ix.Policy = r.Routing.Name
		p.Index = &ix
	}
	return p
}

// runJob is one simulation of a timed run.
type runJob struct {
	rt   sim.Routing
	cfg  sim.TimedConfig
	res  sim.TimedResult
	err  error
	both bool // the policy runs with and without session affinity
}

// affinitySuffix marks the row of a policy run with session affinity at the front.
const affinitySuffix = " +affinity"

// policyJSON is the job's row; measured says it measured the index's memory.
func (j *runJob) policyJSON(measured bool) timedPolicyJSON {
	p := toTimedPolicyJSON(j.res, measured)
	if j.both {
		p.Affinity = j.cfg.Affinity.String()
		if j.cfg.Affinity == sim.AffinitySession {
			p.Name += affinitySuffix
		}
	}
	return p
}

// runAll runs the jobs on w, workers of them at once, each result in its job; the job
// alone (the one that measures the index; -1 for none) runs first, by itself, so that
// its timings are its own. beside runs with the others.
func runAll(w *sim.Workload, jobs []*runJob, alone, workers int, beside func()) error {
	ctx := context.Background()
	run := func(j *runJob) { j.res, j.err = sim.Simulate(ctx, w, j.rt, j.cfg) }
	if alone >= 0 {
		run(jobs[alone])
		if err := jobs[alone].err; err != nil {
			return err
		}
	}
	rest := jobs
	if alone >= 0 {
		rest = slices.Delete(slices.Clone(jobs), alone, alone+1)
	}
	parallel.Beside(beside, func() {
		parallel.Each(len(rest), workers, func(i int) { run(rest[i]) }, nil)
	})
	for _, j := range jobs {
		if j.err != nil {
			return j.err
		}
	}
	return nil
}

// Timed is one `kvindex sim` experiment under time: every routing policy on one
// workload, once, or at each point of a sweep.
type Timed struct {
	Workload *sim.Workload
	Info     WorkloadInfo
	// Config is every run's; its Progress, when set, must be safe for concurrent use.
	Config   sim.TimedConfig
	CostName string
	Routings []sim.Routing
	Sweep    Sweep
	// Chart, with a sweep, is the chart file to write ("" for none); Warn receives
	// what the chart leaves out.
	Chart    string
	Warn     io.Writer
	Parallel int // simulations at once (0: 1)
	// BothAffinities, with several router replicas (and no routers sweep), runs every
	// policy twice: with the front load balancer spreading requests round-robin, and
	// with session affinity (its row named "+affinity").
	BothAffinities bool
}

// TimedReport is a Timed experiment's outcome: JSON is what --json prints, Print the
// tables.
type TimedReport struct {
	JSON  TimedJSON
	t     Timed
	index sim.TimedResult // the run that measured the index
}

// RunTimed runs the experiment: the run that measures the index first and alone, the
// others Parallel at a time, the references beside them.
func RunTimed(t Timed) (*TimedReport, error) {
	start := time.Now()
	cfg, w, sw, rts, chart := t.Config, t.Workload, t.Sweep, t.Routings, t.Chart
	points := max(1, len(sw.Vals))
	workers := max(t.Parallel, 1)
	affs := []sim.Affinity{cfg.Affinity}
	if t.BothAffinities && cfg.Routers > 1 && sw.Key != "routers" {
		affs = []sim.Affinity{sim.AffinityNone, sim.AffinitySession}
	}
	rows := len(rts) * len(affs)
	eff := cfg.Engine.WithDefaults()
	ablock, acap, _ := cfg.Approx(w.BlockSize)
	out := TimedJSON{Model: "timed", Workload: t.Info, Cluster: timedClusterJSON{
		Workers: cfg.Workers, Capacity: cfg.Capacity, StepTokens: cfg.ChunkTokens, MaxNumSeqs: cfg.MaxNumSeqs, CostModel: t.CostName,
		Shards: eff.Shards, Locked: eff.LockedIndex, Jump: eff.JumpSize, EventDelayMs: float64(max(cfg.EventDelay, 0)) / 1e6, Routers: cfg.Routers,
		RouterAffinity: cfg.Affinity.String(), ShareLoad: cfg.ShareLoad, Speedup: cfg.Speedup, SLOTTFTs: cfg.SLOTTFT.Seconds(), OverlapWeight: cfg.OverlapWeight,
		OpenLoop: cfg.OpenLoop, ThinkTimeS: max(cfg.ThinkTime, 0).Seconds(), PrefillScale: cfg.PrefillScale,
		ApproxCapacity: acap, ApproxBlock: ablock,
		ScorerWeights: [3]float64{cfg.Scorer.PrefixWeight, cfg.Scorer.KVWeight, cfg.Scorer.QueueWeight},
	}}
	if !w.Timed {
		out.Cluster.Rate = cfg.Rate
		if out.Cluster.Rate == 0 {
			out.Cluster.Rate = sim.DefaultTimedRate
		}
	}

	var jobs []*runJob
	alone := -1
	shared := workers > 1
	for k := range points {
		for r := range rows {
			rt := rts[r/len(affs)]
			c := cfg
			c.Affinity = affs[r%len(affs)]
			if sw.Key != "" {
				sw.Apply(&c, k)
			} else if alone < 0 && rt.Knowledge == sim.Events {
				c.MeasureMemory = true
				alone = len(jobs)
			}
			if i := len(jobs); i != alone && shared && c.Engine.Shards == 0 {
				// The runs that share the CPUs take the locked index each: two at a
				// time with shard goroutines would keep six goroutines busy on two
				// cores, and the switching cost more than the shards gave.
				c.Engine.LockedIndex = true
			}
			jobs = append(jobs, &runJob{rt: rt, cfg: c, both: len(affs) > 1})
		}
	}
	// The references are computed beside the simulations that share the CPU, not
	// beside the one that measures the index.
	var refs sim.References
	if err := runAll(w, jobs, alone, workers, func() { refs = sim.Reference(w, cfg) }); err != nil {
		return nil, err
	}
	out.References = toReferencesJSON(refs)
	if sw.Key == "" {
		for i, j := range jobs {
			out.Policies = append(out.Policies, j.policyJSON(i == alone))
		}
		if alone >= 0 {
			out.Index = out.Policies[alone].Index
		}
	} else {
		for k := range points {
			pt := timedPointJSON{Param: sw.Key, Value: sw.Vals[k], Label: sw.Label(k)}
			for _, j := range jobs[k*rows : (k+1)*rows] {
				pt.Policies = append(pt.Policies, j.policyJSON(false))
			}
			out.Sweep = append(out.Sweep, pt)
		}
		switch sw.Key {
		case "speedup":
			out.Cluster.Speedup = 0
		case "routers":
			out.Cluster.Routers = 0
		case "capacity":
			out.Cluster.Capacity = 0
		case "event-delay":
			out.Cluster.EventDelayMs = 0
		}
		if chart != "" && len(sw.Vals) < 3 {
			fmt.Fprintf(t.Warn, "warning: a sweep of %d points draws no curve: give at least 3\n", len(sw.Vals))
		}
		if chart != "" && rows > maxChartLines {
			fmt.Fprintf(t.Warn, "warning: the chart draws the first %d of %d rows (--policies chooses them)\n", maxChartLines, rows)
		}
		if chart != "" {
			if err := writeTimedChart(chart, out, sw); err != nil {
				return nil, err
			}
		}
		out.Chart = chart
	}
	out.Seconds = time.Since(start).Seconds()
	r := &TimedReport{JSON: out, t: t}
	if out.Index != nil {
		for _, j := range jobs {
			if j.rt.Name == out.Index.Policy {
				r.index = j.res
			}
		}
	}
	return r, nil
}

// Print writes the tables: the header, then the policies (with the recommended one
// named, a ramp's stages and the index) or the sweep.
func (r *TimedReport) Print(w io.Writer) {
	out, sw := r.JSON, r.t.Sweep
	printTimedHeader(w, out, r.t.Workload, sw)
	if sw.Key == "" {
		printTimedPolicies(w, out.Policies)
		printRecommended(w, out.Policies)
		printTimedStages(w, out.Policies)
		if out.Index != nil {
			printTimedIndex(w, out, r.index)
		}
	} else {
		printTimedSweep(w, out, sw)
	}
	fmt.Fprintf(w, "\ntotal %.1f s\n", out.Seconds)
}

func toReferencesJSON(r sim.References) referencesJSON {
	var j referencesJSON
	j.Infinite = HitsOf(r.Infinite, r.Infinite.HitBlocks, r.Infinite.Blocks)
	j.Pooled = HitsOf(r.Pooled, r.Pooled.HitBlocks, r.Pooled.Blocks)
	j.PooledBlocks = r.PooledBlocks
	j.Reuse.Reusing, j.Reuse.GapP50, j.Reuse.GapP90 = r.Reuse.Reusing, r.Reuse.GapP50, r.Reuse.GapP90
	j.Reuse.NewTokensP50, j.Reuse.NewTokensP90 = r.Reuse.NewTokensP50, r.Reuse.NewTokensP90
	return j
}

// secs writes a duration in seconds with three significant digits.
func Secs(s float64) string {
	switch {
	case s >= 100:
		return fmt.Sprintf("%.0f s", s)
	case s >= 10:
		return fmt.Sprintf("%.1f s", s)
	case s >= 1:
		return fmt.Sprintf("%.2f s", s)
	}
	return fmt.Sprintf("%.0f ms", s*1e3)
}

func printTimedHeader(w io.Writer, out TimedJSON, wl *sim.Workload, sw Sweep) {
	wi, c, r := out.Workload, out.Cluster, out.References
	fmt.Fprintf(w, "workload  %s\n", wi.Name)
	fmt.Fprintf(w, "          %s requests, %s input tokens in %s full blocks of %d tokens, %s output tokens\n",
		bench.Thousands(int64(wi.Requests)), bench.Thousands(wi.Tokens), bench.Thousands(wi.Blocks), wi.BlockSize, bench.Thousands(wl.OutputTokens))
	switch {
	case sw.Key == "speedup" && wl.Timed:
		fmt.Fprintf(w, "          arrivals: the trace's timestamps, divided by the swept speedup\n")
	case sw.Key == "speedup":
		fmt.Fprintf(w, "          arrivals: Poisson, %g requests/s times the swept speedup\n", c.Rate)
	case wl.Timed:
		fmt.Fprintf(w, "          arrivals: the trace's timestamps divided by %g\n", c.Speedup)
	default:
		fmt.Fprintf(w, "          arrivals: Poisson, %g requests/s (--rate %g x --speedup %g)\n", c.Rate*c.Speedup, c.Rate, c.Speedup)
	}
	switch {
	case c.OpenLoop:
		fmt.Fprintf(w, "          sessions: open loop (a turn is sent at its arrival, even before the reply it repeats)\n")
	case wl.Kind == "built-in":
		fmt.Fprintf(w, "          sessions: closed loop (a turn waits for the reply it repeats, plus %s to think)\n", Secs(c.ThinkTimeS))
	}
	if sw.Key != "capacity" {
		fleetTok := int64(c.Workers) * int64(c.Capacity) * int64(wi.BlockSize)
		fmt.Fprintf(w, "          reuse: %.1f%% of requests reuse an earlier prefix, from p50 %s / p90 %s before, with p50 %s / p90 %s new tokens between (the fleet holds %s)\n",
			100*float64(r.Reuse.Reusing)/float64(max(wi.Requests, 1)), Secs(r.Reuse.GapP50), Secs(r.Reuse.GapP90),
			bench.Thousands(r.Reuse.NewTokensP50), bench.Thousands(r.Reuse.NewTokensP90), bench.Thousands(fleetTok))
	}
	capacity := "the swept number of"
	if c.Capacity > 0 {
		capacity = bench.Thousands(int64(c.Capacity))
	}
	scale := ""
	if c.PrefillScale != 1 && c.PrefillScale != 0 {
		scale = fmt.Sprintf(", prefill x %g", c.PrefillScale)
	}
	fmt.Fprintf(w, "cluster   %d engines x %s blocks, steps of %d tokens, at most %d running; cost model: %s%s\n",
		c.Workers, capacity, c.StepTokens, c.MaxNumSeqs, c.CostModel, scale)
	routers := "the swept number of routers"
	if c.Routers > 0 {
		routers = fmt.Sprintf("%d router", c.Routers)
		if c.Routers > 1 {
			routers += fmt.Sprintf("s (affinity: %s)", c.RouterAffinity)
		}
	}
	if c.ShareLoad {
		routers += " sharing their load"
	}
	delay := "the swept time"
	if sw.Key != "event-delay" {
		delay = time.Duration(c.EventDelayMs * 1e6).String()
	}
	fmt.Fprintf(w, "          %s; events reach the index %s after the step that made them; index: %s, jump %d\n", routers, delay, indexName(c.Shards, c.Locked), c.Jump)
	fmt.Fprintf(w, "          cost policies: overlap weight %g; scorer policies: prefix %g, KV %g, queue %g; goodput: TTFT <= %s\n",
		c.OverlapWeight, c.ScorerWeights[0], c.ScorerWeights[1], c.ScorerWeights[2], Secs(c.SLOTTFTs))
	fmt.Fprintf(w, "          approximate knowledge: the router's own decisions, an LRU of %s keys of %d tokens per engine (llm-d's auto-tuned: %s tokens) or a 120 s TTL (Dynamo's)\n",
		bench.Thousands(int64(c.ApproxCapacity)), c.ApproxBlock, bench.Thousands(int64(c.ApproxCapacity)*int64(c.ApproxBlock)))
	if sw.Key != "capacity" {
		fmt.Fprintf(w, "reference infinite cache: block hit %s; one LRU of the fleet's %s blocks: %s\n",
			Pct(r.Infinite.BlockHitRate), bench.Thousands(r.PooledBlocks), Pct(r.Pooled.BlockHitRate))
	}
	fmt.Fprintln(w)
}

func printTimedPolicies(w io.Writer, pols []timedPolicyJSON) {
	nw := nameWidth(24, len(pols), func(i int) string { return pols[i].Name })
	fmt.Fprintf(w, "%-*s %9s %9s %9s %8s %9s %10s %8s %6s %7s %6s %8s %9s %9s %7s\n", nw, "policy",
		"TTFT p50", "p90", "p99", "ITL p90", "E2E p90", "out tok/s", "goodput", "SLO", "KV use", "queue", "preempt", "block hit", "reply hit", "waited")
	for _, p := range pols {
		fmt.Fprintf(w, "%-*s %9s %9s %9s %8s %9s %10.0f %8.2f %5.1f%% %6.0f%% %6.1f %8s %9s %9s %6.1f%%\n", nw, p.Name,
			Secs(p.TTFTp50), Secs(p.TTFTp90), Secs(p.TTFTp99), Secs(p.ITLp90), Secs(p.E2Ep90),
			p.OutTokPerS, p.Goodput, 100*p.SLOMet, 100*p.KVUtilMean, p.QueueMean, bench.Thousands(p.Preemptions), Pct(p.BlockHitRate),
			Pct(p.ReplyHitRate), 100*p.WaitedShare)
	}
}

// Recommended is the routing policy the project recommends, named under the table.
const Recommended = "llmd-scorer/exact"

// printRecommended names the recommended policy beside the best row of the run.
func printRecommended(w io.Writer, pols []timedPolicyJSON) {
	best := 0
	for i, p := range pols {
		if p.Goodput > pols[best].Goodput || p.Goodput == pols[best].Goodput && p.TTFTp90 < pols[best].TTFTp90 {
			best = i
		}
	}
	fmt.Fprintf(w, "\nrecommended: %s (llm-d's scorer on the exact index: prefix, KV use and queue); best here by goodput, then p90 TTFT: %s\n",
		Recommended, pols[best].Name)
}

// printTimedStages is a ramp's table: each stage's p90 TTFT and output throughput
// per policy, or "unstable" where the stage's queue still grew at its end (a stage
// that drained has the p90 of all its requests, however long they waited).
func printTimedStages(w io.Writer, pols []timedPolicyJSON) {
	if len(pols) == 0 || len(pols[0].Stages) == 0 {
		return
	}
	how := "unstable: the engines' queue still grew at the stage's end"
	if pols[0].Stages[0].Drained {
		how = "each stage ran until its requests finished, as inference-perf runs them; tokens per second of that span"
	}
	fmt.Fprintf(w, "\nby stage: p90 TTFT / output tokens per second (%s)\n", how)
	fmt.Fprintf(w, "%6s %6s", "rate", "secs")
	for _, p := range pols {
		fmt.Fprintf(w, " %24s", p.Name)
	}
	fmt.Fprintln(w)
	for k, st := range pols[0].Stages {
		fmt.Fprintf(w, "%6g %6g", st.Rate, st.DurationS)
		for _, p := range pols {
			s := p.Stages[k]
			lat := Secs(s.TTFTp90)
			switch {
			case s.Rate == 0:
				lat = "pause"
			case s.Unstable && !s.Drained:
				lat = "unstable"
			}
			fmt.Fprintf(w, " %24s", lat+" / "+strconv.FormatFloat(math.Round(s.OutTokPerS), 'f', 0, 64))
		}
		fmt.Fprintln(w)
	}
}

// printTimedIndex is the index section: the measured run's engine calls.
func printTimedIndex(w io.Writer, out TimedJSON, r sim.TimedResult) {
	s := r.Index
	fmt.Fprintf(w, "\nindex (the %s run, simulated alone)\n", out.Index.Policy)
	fmt.Fprintf(w, "  events applied   %s (%s stored, %s removed; %s rejected)\n",
		bench.Thousands(int64(s.Events)), bench.Thousands(s.StoredEvents), bench.Thousands(s.RemovedEvents), bench.Thousands(s.Rejected))
	PrintIndexOps(w, s)
}

// PrintIndexOps writes an index's block operations, throughput, FindMatches latency
// and memberships, the lines every report's index section ends with.
func PrintIndexOps(w io.Writer, s sim.IndexStats) {
	fmt.Fprintf(w, "  block ops        %s (%s query hashes, %s stored, %s removed) in %.3f s of engine calls\n",
		bench.Thousands(s.BlockOps()), bench.Thousands(s.QueryBlocks), bench.Thousands(s.StoredBlocks), bench.Thousands(s.RemovedBlocks), s.EngineSeconds)
	fmt.Fprintf(w, "  throughput       %.2fM block ops/s\n", s.BlockOpsPerS()/1e6)
	if s.Queries > 0 {
		fmt.Fprintf(w, "  find-matches     p50 %s, p99 %s, p999 %s over %s queries\n",
			Micros(s.FindMatchesP50), Micros(s.FindMatchesP99), Micros(s.FindMatchesP999), bench.Thousands(s.Queries))
	}
	fmt.Fprintf(w, "  memberships      %s at the end, %.1f bytes per membership (engine heap %.1f MiB)\n",
		bench.Thousands(s.Memberships), s.BytesPerMembership(), float64(s.HeapBytes)/(1<<20))
}

func printTimedSweep(w io.Writer, out TimedJSON, sw Sweep) {
	fmt.Fprintf(w, "p90 TTFT / output tokens per second, by %s\n", sw.Key)
	pols := out.Sweep[0].Policies
	nw := nameWidth(24, len(pols), func(i int) string { return pols[i].Name })
	fmt.Fprintf(w, "%-*s", nw, "policy")
	for _, pt := range out.Sweep {
		fmt.Fprintf(w, " %18s", pt.Label)
	}
	fmt.Fprintln(w)
	for i := range out.Sweep[0].Policies {
		fmt.Fprintf(w, "%-*s", nw, out.Sweep[0].Policies[i].Name)
		for _, pt := range out.Sweep {
			p := pt.Policies[i]
			fmt.Fprintf(w, " %18s", Secs(p.TTFTp90)+" / "+strconv.FormatFloat(math.Round(p.OutTokPerS), 'f', 0, 64))
		}
		fmt.Fprintln(w)
	}
	fmt.Fprintf(w, "\n%s\n", ChartLine(out.Chart))
}

// maxChartLines bounds a chart's policies: more lines than this are unreadable.
const maxChartLines = 6

// familyColors colours a chart's line by the policy's scoring family, and
// knowledgeDashes dashes it by its knowledge of the caches.
var (
	familyColors = map[string]color.RGBA{
		route.FamilyDynamoCost: {R: 0xd6, G: 0x27, B: 0x28, A: 0xff}, route.FamilyLLMDScorer: {R: 0x1f, G: 0x77, B: 0xb4, A: 0xff},
		route.FamilyLLMDAffinity: {R: 0xff, G: 0x7f, B: 0x0e, A: 0xff}, route.FamilyLongestPrefix: {R: 0x17, G: 0xbe, B: 0xcf, A: 0xff},
		route.FamilyLLMDLoad: {R: 0x2c, G: 0xa0, B: 0x2c, A: 0xff}, route.FamilyLeastLoaded: {R: 0x94, G: 0x67, B: 0xbd, A: 0xff},
		route.FamilyRoundRobin: {R: 0x7f, G: 0x7f, B: 0x7f, A: 0xff}, route.FamilyRandom: {R: 0x8c, G: 0x56, B: 0x4b, A: 0xff},
	}
	knowledgeDashes = map[route.Knowledge][]vg.Length{
		route.Exact: nil, route.ExactPredict: {vg.Points(1), vg.Points(3)}, route.ExactSticky: {vg.Points(1), vg.Points(1)},
		route.ApproxTTL: {vg.Points(6), vg.Points(3)}, route.ApproxLRU: {vg.Points(3), vg.Points(3)},
		route.Blind: {vg.Points(8), vg.Points(2), vg.Points(2), vg.Points(2)},
	}
)

// writeTimedChart draws p90 TTFT (log scale, with the SLO as a line) and output
// throughput (linear, from 0) against the swept parameter, one line per policy (at
// most maxChartLines; colour by scoring family, dash by knowledge), as two panels of
// one image captioned with the workload.
func writeTimedChart(path string, out TimedJSON, sw Sweep) error {
	x := func(k int) float64 { return float64(k) }
	var ticks []plot.Tick
	for k, pt := range out.Sweep {
		ticks = append(ticks, plot.Tick{Value: x(k), Label: pt.Label})
	}
	xLabel := map[string]string{"speedup": "load (arrival rate x speedup)", "routers": "router replicas",
		"capacity": fmt.Sprintf("KV blocks of %d tokens per engine", out.Workload.BlockSize), "event-delay": "event delay"}[sw.Key]
	lines := min(len(out.Sweep[0].Policies), maxChartLines)
	panel := func(title, yLabel string, y func(timedPolicyJSON) float64, logY bool) (*plot.Plot, error) {
		p := plot.New()
		p.Title.Text = title
		p.X.Label.Text = xLabel
		p.Y.Label.Text = yLabel
		p.X.Tick.Marker = plot.ConstantTicks(ticks)
		p.Add(plotter.NewGrid())
		p.Legend.Top, p.Legend.Left = true, true
		if logY {
			p.Y.Scale = plot.LogScale{}
			p.Y.Tick.Marker = plot.LogTicks{Prec: -1}
		}
		for i := range lines {
			name := out.Sweep[0].Policies[i].Name
			pts := make(plotter.XYs, len(out.Sweep))
			for k, pt := range out.Sweep {
				pts[k].X, pts[k].Y = x(k), y(pt.Policies[i])
				if logY {
					pts[k].Y = max(pts[k].Y, 1e-3)
				}
			}
			l, err := plotter.NewLine(pts)
			if err != nil {
				return nil, err
			}
			if rt, err := sim.ParseRouting(strings.TrimSuffix(name, affinitySuffix)); err == nil {
				l.Color, l.Dashes = familyColors[rt.Family], knowledgeDashes[rt.Knowledge]
			}
			l.Width = vg.Points(1.5)
			p.Add(l)
			p.Legend.Add(name, l)
		}
		if logY && p.Y.Max <= p.Y.Min {
			// Every point alike (a run too small to queue): gonum pads an empty
			// range by 1 either side, below 0, which a log scale cannot draw.
			p.Y.Min, p.Y.Max = p.Y.Min/10, p.Y.Max*10
		}
		if !logY {
			p.Y.Min = 0
		}
		return p, nil
	}
	ttft, err := panel("p90 time to first token", "seconds (log scale)", func(p timedPolicyJSON) float64 { return p.TTFTp90 }, true)
	if err != nil {
		return err
	}
	if slo := out.Cluster.SLOTTFTs; slo > 0 {
		l, err := plotter.NewLine(plotter.XYs{{X: x(0), Y: slo}, {X: x(len(out.Sweep) - 1), Y: slo}})
		if err != nil {
			return err
		}
		l.Color, l.Dashes = color.Black, []vg.Length{vg.Points(2), vg.Points(2)}
		ttft.Add(l)
		ttft.Legend.Add(fmt.Sprintf("TTFT objective (%s)", Secs(slo)), l)
		ttft.Y.Min, ttft.Y.Max = min(ttft.Y.Min, slo/2), max(ttft.Y.Max, slo*2)
	}
	tput, err := panel("output throughput", "output tokens per second", func(p timedPolicyJSON) float64 { return p.OutTokPerS }, false)
	if err != nil {
		return err
	}
	tput.Legend.Top, tput.Legend.Left = false, false
	ttft.Title.Text += " - " + out.Workload.Name
	if err := saveTwoPanels(ttft, tput, path); err != nil {
		return fmt.Errorf("writing chart: %w", err)
	}
	return nil
}

// saveTwoPanels writes two plots side by side to path, in the format its extension
// names (an SVG embeds its fonts, as saveChart's does).
func saveTwoPanels(a, b *plot.Plot, path string) error {
	const w, h = 14 * vg.Inch, 5.5 * vg.Inch
	var c vg.CanvasWriterTo
	switch strings.ToLower(filepath.Ext(path)) {
	case ".svg":
		c = vgsvg.NewWith(vgsvg.UseWH(w, h), vgsvg.EmbedFonts(true))
	case ".pdf":
		c = vgpdf.New(w, h)
	default:
		c = vgimg.PngCanvas{Canvas: vgimg.New(w, h)}
	}
	tiles := draw.Tiles{Rows: 1, Cols: 2, PadX: 8 * vg.Millimeter, PadTop: 2 * vg.Millimeter, PadBottom: 2 * vg.Millimeter,
		PadLeft: 2 * vg.Millimeter, PadRight: 2 * vg.Millimeter}
	canvases := plot.Align([][]*plot.Plot{{a, b}}, tiles, draw.New(c))
	a.Draw(canvases[0][0])
	b.Draw(canvases[0][1])
	return WriteCanvas(c, path)
}

// WriteCanvas writes a drawn canvas to path.
func WriteCanvas(c vg.CanvasWriterTo, path string) (err error) {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	defer func() {
		if cerr := f.Close(); err == nil {
			err = cerr
		}
	}()
	_, err = c.WriteTo(f)
	return err
}

// indexName names an engine's index for the header: the locked index or its shards.
func indexName(shards int, locked bool) string {
	if locked {
		return "locked"
	}
	return fmt.Sprintf("%d shards", shards)
}
