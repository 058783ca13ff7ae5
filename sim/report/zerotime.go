package report

import (
	"context"
	"fmt"
	"io"
	"math"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/kvindex/kvindex/bench"
	kvengine "github.com/kvindex/kvindex/engine"
	"github.com/kvindex/kvindex/sim"
	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgsvg"
)

// JSON shapes of `kvindex sim --zero-time --json` (ZeroTimeJSON is the whole of it).
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
		HitsJSON
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
		Index         IndexJSON `json:"index"`
	}
	sweepPointJSON struct {
		Capacity int `json:"capacity,omitempty"`
		// EventDelayMs is set in an event-delay sweep, HostCapacity in a host-capacity
		// sweep (capacity in a capacity sweep).
		EventDelayMs *float64     `json:"event_delay_ms,omitempty"`
		HostCapacity *int         `json:"host_capacity,omitempty"`
		Policies     []policyJSON `json:"policies"`
	}
	ZeroTimeJSON struct {
		Workload WorkloadInfo     `json:"workload"`
		Cluster  clusterJSON      `json:"cluster"`
		Ceiling  HitsJSON         `json:"ceiling"`
		Policies []policyJSON     `json:"policies,omitempty"`
		Index    *IndexJSON       `json:"index,omitempty"`
		Sweep    []sweepPointJSON `json:"sweep,omitempty"`
		Chart    string           `json:"chart,omitempty"`
		Seconds  float64          `json:"seconds"`
	}
)

// toPolicyJSON is a zero-time run's row; measured says whether it measured its heap,
// tiered whether the runs have a host tier (or sweep one).
func toPolicyJSON(r sim.Result, measured, tiered bool) policyJSON {
	pj := policyJSON{
		Name: r.Policy.String(), HitsJSON: HitsOf(r, r.HitBlocks, r.Blocks),
		MaxMeanLoad: r.MaxMeanLoad(), MaxMeanToken: r.MaxMeanTokens(), Seconds: r.Seconds,
		Index: IndexOf(r, measured),
	}
	if tiered {
		pj.HostHitRate, pj.HostHitBlocks, pj.LoadedTokens = ptr(r.HostHitRate()), ptr(r.HostHitBlocks), ptr(r.LoadedTokens)
		pj.PrefillWork, pj.Orphans = ptr(r.PrefillWork()), ptr(r.Orphans)
	}
	return pj
}

// ZeroTimeSweep is a parsed --sweep of the zero-time model: capacities, event delays or
// host capacities (exactly one of them set).
type ZeroTimeSweep struct {
	Caps   []int
	Delays []time.Duration
	Hosts  []int
}

// Points is the number of sweep points (0: no sweep).
func (sp ZeroTimeSweep) Points() int { return len(sp.Caps) + len(sp.Delays) + len(sp.Hosts) }

// DefaultZeroTimePolicies are the zero-time model's default policies; TierPolicies are
// the ones a host-capacity sweep compares unless --policies says otherwise: the three
// ways to score the tiers.
const (
	DefaultZeroTimePolicies = "longest-prefix/exact,longest-prefix/exact+predict,longest-prefix/approx-ttl,random,round-robin,least-loaded"
	TierPolicies            = "longest-prefix/exact,longest-prefix/exact:weighted-tiers,longest-prefix/exact:any-tier"
)

// ParseZeroTimeSweep reads "capacity=A,B,C", "event-delay=D1,D2,D3" (0 is at once) or
// "host-capacity=H1,H2,H3" (0 is none).
func ParseZeroTimeSweep(s string) (ZeroTimeSweep, error) {
	key, list, ok := strings.Cut(s, "=")
	var sp ZeroTimeSweep
	ints := func(what string, lo int, dst *[]int) error {
		for _, v := range strings.Split(list, ",") {
			c, err := strconv.Atoi(strings.TrimSpace(v))
			if err != nil || c < lo || c > sim.MaxCapacity {
				return fmt.Errorf("--sweep: %s %q is not a number of blocks in %d..%d", what, v, lo, sim.MaxCapacity)
			}
			*dst = append(*dst, c)
		}
		return nil
	}
	switch strings.TrimSpace(key) {
	case "capacity":
		if err := ints("capacity", 1, &sp.Caps); err != nil {
			return sp, err
		}
	case "event-delay":
		for _, v := range strings.Split(list, ",") {
			v = strings.TrimSpace(v)
			d, err := time.ParseDuration(v)
			if v == "0" {
				d, err = 0, nil
			}
			if err != nil || d < 0 || d > time.Hour {
				return sp, fmt.Errorf("--sweep: event delay %q is not a duration in 0..1h", v)
			}
			sp.Delays = append(sp.Delays, d)
		}
	case "host-capacity":
		if err := ints("host capacity", 0, &sp.Hosts); err != nil {
			return sp, err
		}
	default:
		ok = false
	}
	if !ok {
		return sp, fmt.Errorf("--sweep %q: want capacity=A,B,C, event-delay=D1,D2,D3 or host-capacity=H1,H2,H3", s)
	}
	if sp.Points() < 2 {
		return sp, fmt.Errorf("--sweep %q: give at least two points", s)
	}
	return sp, nil
}

// CheckFleet checks the fleet's bounds at every sweep point: it needs no workload, which
// can take seconds to build.
func (sp ZeroTimeSweep) CheckFleet(workers, capacity, hostCapacity int) error {
	for _, c := range sp.capacities(capacity) {
		if int64(workers)*(int64(c)+int64(hostCapacity)) > sim.MaxFleetBlocks {
			return fmt.Errorf("--workers %d x (capacity %d + --host-capacity %d): more than %d blocks in all", workers, c, hostCapacity, sim.MaxFleetBlocks)
		}
	}
	for _, h := range sp.Hosts {
		if int64(workers)*(int64(capacity)+int64(h)) > sim.MaxFleetBlocks {
			return fmt.Errorf("--workers %d x (capacity %d + host capacity %d): more than %d blocks in all", workers, capacity, h, sim.MaxFleetBlocks)
		}
	}
	return nil
}

// CheckWorkload checks that every sweep point's capacity holds w's longest request.
func (sp ZeroTimeSweep) CheckWorkload(capacity int, w *sim.Workload) error {
	for _, c := range sp.capacities(capacity) {
		if c < w.MaxBlocks {
			return fmt.Errorf("capacity %d blocks per worker cannot hold the longest request (%d blocks of %d tokens); raise --capacity or the sweep's capacities",
				c, w.MaxBlocks, w.BlockSize)
		}
	}
	return nil
}

// capacities are the device capacities the runs take: the swept ones, else capacity.
func (sp ZeroTimeSweep) capacities(capacity int) []int {
	if len(sp.Caps) > 0 {
		return sp.Caps
	}
	return []int{capacity}
}

// ZeroTime is one `kvindex sim --zero-time` experiment: every policy on one workload,
// once, or at each point of a sweep. The runs go one at a time, on the caller's
// goroutine; Config.Progress, when set, sees every request of every run.
type ZeroTime struct {
	Workload *sim.Workload
	Info     WorkloadInfo
	Config   sim.Config
	Policies []sim.Policy
	Sweep    ZeroTimeSweep
	Chart    string // with a sweep: the chart file to write ("" for none)
}

// ZeroTimeReport is a ZeroTime experiment's outcome: JSON is what --json prints, Print
// the tables.
type ZeroTimeReport struct {
	JSON    ZeroTimeJSON
	results []sim.Result // a run without a sweep: each policy's
	ceil    sim.Ceiling
}

// RunZeroTime runs the experiment. Without a sweep every run measures its heap; the
// index section reports the kv-aware run (else the first).
func RunZeroTime(ctx context.Context, z ZeroTime) (*ZeroTimeReport, error) {
	start := time.Now()
	w, cfg, sp := z.Workload, z.Config, z.Sweep
	ceil := sim.InfiniteCache(w)
	tiered := cfg.HostCapacity > 0 || sp.Hosts != nil
	rep := &ZeroTimeReport{JSON: ZeroTimeJSON{Workload: z.Info, Cluster: zeroTimeCluster(cfg, tiered),
		Ceiling: HitsOf(ceil, ceil.HitBlocks, ceil.Blocks)}, ceil: ceil}
	out := &rep.JSON
	if sp.Points() == 0 {
		cfg.MeasureMemory = true
		for _, p := range z.Policies {
			r, err := sim.Run(ctx, w, p, cfg)
			if err != nil {
				return nil, err
			}
			rep.results = append(rep.results, r)
			out.Policies = append(out.Policies, toPolicyJSON(r, true, tiered))
		}
		ix := IndexOf(rep.results[0], true)
		for _, r := range rep.results {
			if r.Policy == sim.KVAware {
				ix = IndexOf(r, true)
			}
		}
		out.Index = &ix
		out.Seconds = time.Since(start).Seconds()
		return rep, nil
	}
	for k := range sp.Points() {
		pt := sp.apply(&cfg, k)
		for _, p := range z.Policies {
			r, err := sim.Run(ctx, w, p, cfg)
			if err != nil {
				return nil, err
			}
			pt.Policies = append(pt.Policies, toPolicyJSON(r, false, tiered))
		}
		out.Sweep = append(out.Sweep, pt)
	}
	switch {
	case sp.Caps != nil:
		out.Cluster.Capacity = 0
	case sp.Hosts != nil:
		out.Cluster.HostCapacity = nil
	default:
		out.Cluster.EventDelayMs = 0
	}
	if z.Chart != "" {
		if err := writeChart(z.Chart, *out); err != nil {
			return nil, err
		}
	}
	out.Chart = z.Chart
	out.Seconds = time.Since(start).Seconds()
	return rep, nil
}

// zeroTimeCluster is the cluster section of cfg's report; tiered adds the host tier's.
func zeroTimeCluster(cfg sim.Config, tiered bool) clusterJSON {
	eff := cfg.Engine.WithDefaults()
	c := clusterJSON{Workers: cfg.Workers, Capacity: cfg.Capacity, ChunkTokens: cfg.ChunkTokens,
		Shards: eff.Shards, Jump: eff.JumpSize, EventDelayMs: float64(max(cfg.EventDelay, 0)) / 1e6}
	if tiered {
		c.HostCapacity, c.HostLoadCost = ptr(cfg.HostCapacity), ptr(cfg.HostLoadCost)
		if cfg.HostLoadCost == 0 {
			c.HostLoadCost = ptr(sim.DefaultHostLoadCost)
		}
		wts := cfg.TierWeights
		if wts == (kvengine.Weights{}) {
			wts = kvengine.DefaultWeights
		}
		c.TierWeights = wts[:]
	}
	return c
}

// apply sets the swept parameter of cfg to point k and returns the point's JSON.
func (sp ZeroTimeSweep) apply(cfg *sim.Config, k int) sweepPointJSON {
	var pt sweepPointJSON
	switch {
	case sp.Caps != nil:
		cfg.Capacity = sp.Caps[k]
		pt.Capacity = cfg.Capacity
	case sp.Hosts != nil:
		cfg.HostCapacity = sp.Hosts[k]
		pt.HostCapacity = ptr(cfg.HostCapacity)
	default:
		cfg.EventDelay = sp.Delays[k]
		if cfg.EventDelay == 0 {
			cfg.EventDelay = -1 // at once
		}
		ms := float64(sp.Delays[k]) / 1e6
		pt.EventDelayMs = &ms
	}
	return pt
}

// Print writes the tables: the header, then the policies and the index, or the sweep.
func (r *ZeroTimeReport) Print(w io.Writer) {
	if len(r.JSON.Sweep) > 0 {
		printSweep(w, r.JSON)
		return
	}
	printReport(w, r.JSON, r.results, r.ceil)
}

func printHeader(w io.Writer, out ZeroTimeJSON, capacity string) {
	wl := out.Workload
	fmt.Fprintf(w, "workload  %s\n", wl.Name)
	fmt.Fprintf(w, "          %s requests, %s input tokens, %s full blocks of %d tokens\n",
		bench.Thousands(int64(wl.Requests)), bench.Thousands(wl.Tokens), bench.Thousands(wl.Blocks), wl.BlockSize)
	if wl.TraceIDHitRate != nil {
		fmt.Fprintf(w, "          trace's own ceiling at 512-token ids: %s of block references\n", Pct(*wl.TraceIDHitRate))
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
		fmt.Fprintf(w, "          host tier: %s blocks per engine; loading a block costs %g of recomputing it (--host-load-cost, an assumption); weighted-tiers' weights %s\n",
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
	nw := nameWidth(16, len(pols), func(i int) string { return pols[i].Name })
	if header {
		label := ""
		if lead != "" {
			label = "host"
		}
		fmt.Fprintf(w, "%-*s%-*s %10s %9s %10s %13s %14s %16s\n", len(lead), label, nw, "policy", "device hit", "host hit", "token hit", "prefill work", "max/mean reqs", "max/mean tokens")
	}
	for _, p := range pols {
		fmt.Fprintf(w, "%s%-*s %10s %9s %10s %13s %14.3f %16.3f\n", lead, nw, p.Name, Pct(p.BlockHitRate), Pct(*p.HostHitRate), Pct(p.TokenHitRate), Pct(*p.PrefillWork), p.MaxMeanLoad, p.MaxMeanToken)
	}
}

func printReport(w io.Writer, out ZeroTimeJSON, results []sim.Result, ceil sim.Ceiling) {
	printHeader(w, out, bench.Thousands(int64(out.Cluster.Capacity))+fmt.Sprintf(" blocks (%s tokens each)", bench.Thousands(int64(out.Cluster.Capacity*out.Workload.BlockSize))))
	if out.Cluster.HostLoadCost != nil {
		fmt.Fprintf(w, "infinite cache: block hit %s, token hit %s\n", Pct(ceil.BlockHitRate()), Pct(ceil.TokenHitRate()))
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
	nw := nameWidth(16, len(results), func(i int) string { return results[i].Policy.String() })
	fmt.Fprintf(w, "%-*s %10s %10s %11s %14s %16s %8s\n", nw, "policy", "block hit", "token hit", "of ceiling", "max/mean reqs", "max/mean tokens", "seconds")
	fmt.Fprintf(w, "%-*s %10s %10s %11s %14s %16s %8s\n", nw, "infinite cache", Pct(ceil.BlockHitRate()), Pct(ceil.TokenHitRate()), "100.0%", "-", "-", "-")
	for _, r := range results {
		of := "-"
		if c := ceil.BlockHitRate(); c > 0 {
			of = fmt.Sprintf("%.1f%%", 100*r.BlockHitRate()/c)
		}
		fmt.Fprintf(w, "%-*s %10s %10s %11s %14.3f %16.3f %8.2f\n", nw, r.Policy, Pct(r.BlockHitRate()), Pct(r.TokenHitRate()), of, r.MaxMeanLoad(), r.MaxMeanTokens(), r.Seconds)
	}
}

// printIndex is the index section of a run.
func printIndex(w io.Writer, out ZeroTimeJSON, results []sim.Result) {
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
	PrintIndexOps(w, s)
	fmt.Fprintf(w, "\ntotal %.1f s\n", out.Seconds)
}

func printSweep(w io.Writer, out ZeroTimeJSON) {
	caps := make([]string, len(out.Sweep))
	for i, p := range out.Sweep {
		caps[i] = sweepLabel(p)
	}
	if out.Sweep[0].HostCapacity != nil {
		printHeader(w, out, bench.Thousands(int64(out.Cluster.Capacity))+" blocks")
		fmt.Fprintf(w, "by host capacity (blocks per worker); infinite cache: block hit %s; prefill work = (computed tokens + %g x loaded tokens) / input tokens\n",
			Pct(out.Ceiling.BlockHitRate), *out.Cluster.HostLoadCost)
		for i, p := range out.Sweep {
			printTiered(w, fmt.Sprintf("%-8s ", caps[i]), p.Policies, i == 0)
		}
		fmt.Fprintf(w, "\n%s\ntotal %.1f s\n", ChartLine(out.Chart), out.Seconds)
		return
	}
	if out.Sweep[0].EventDelayMs != nil {
		printHeader(w, out, bench.Thousands(int64(out.Cluster.Capacity))+" blocks")
		fmt.Fprintf(w, "block hit rate by event delay (simulated time from a request to its events); infinite cache %s\n", Pct(out.Ceiling.BlockHitRate))
	} else {
		printHeader(w, out, "{"+strings.Join(caps, ", ")+"} blocks")
		fmt.Fprintf(w, "block hit rate by capacity (blocks per worker); infinite cache %s\n", Pct(out.Ceiling.BlockHitRate))
	}
	pols := out.Sweep[0].Policies
	nw := nameWidth(16, len(pols), func(i int) string { return pols[i].Name })
	fmt.Fprintf(w, "%-*s", nw, "policy")
	for _, c := range caps {
		fmt.Fprintf(w, " %9s", c)
	}
	fmt.Fprintln(w)
	for i := range out.Sweep[0].Policies {
		fmt.Fprintf(w, "%-*s", nw, out.Sweep[0].Policies[i].Name)
		for _, p := range out.Sweep {
			fmt.Fprintf(w, " %9s", Pct(p.Policies[i].BlockHitRate))
		}
		fmt.Fprintln(w)
	}
	fmt.Fprintf(w, "\n%s\ntotal %.1f s\n", ChartLine(out.Chart), out.Seconds)
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

// writeChart draws hit rate against the swept parameter, one line per policy and the
// ceiling.
func writeChart(path string, out ZeroTimeJSON) error {
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
func writeDelayChart(path string, out ZeroTimeJSON) error {
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
func policyLines(out ZeroTimeJSON, x func(int, sweepPointJSON) float64, y func(policyJSON) float64) []any {
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
func ceilingLine(out ZeroTimeJSON, x func(int, sweepPointJSON) float64) []any {
	lo, hi := xRange(out, x)
	return []any{"infinite cache", plotter.XYs{{X: lo, Y: out.Ceiling.BlockHitRate}, {X: hi, Y: out.Ceiling.BlockHitRate}}}
}

// xRange returns the least and greatest x of the sweep points.
func xRange(out ZeroTimeJSON, x func(int, sweepPointJSON) float64) (lo, hi float64) {
	lo, hi = math.Inf(1), math.Inf(-1)
	for j, pt := range out.Sweep {
		lo, hi = min(lo, x(j, pt)), max(hi, x(j, pt))
	}
	return lo, hi
}

// finishChart names each sweep point by a tick at its x, draws the lines and writes the
// chart to path.
func finishChart(p *plot.Plot, path string, out ZeroTimeJSON, x func(int, sweepPointJSON) float64, label func(sweepPointJSON) string, lines []any) error {
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
func writeTierChart(path string, out ZeroTimeJSON) error {
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
	return WriteCanvas(c, path)
}
