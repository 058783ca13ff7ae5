package report

import (
	"context"
	"fmt"
	"io"
	"math"
	"strings"
	"time"

	"github.com/kvindex/kvindex/internal/parallel"
	"github.com/kvindex/kvindex/sim"
)

// The routing policies the validation compares (package route's, through sim).
const (
	precise    = "llmd-scorer/exact"      // llm-d's precise prefix scorer on KV events
	approx     = "llmd-scorer/approx-lru" // llm-d's approximate prefix scorer
	roundRobin = "round-robin"
	sticky     = "llmd-affinity/exact" // llm-d's sticky-until-saturated default on KV events
)

// ValidateConfig sizes a validation run. The zero value is the full validation.
type ValidateConfig struct {
	// Scale multiplies every ramp stage's duration and bounds the all-at-once rows'
	// requests (0 means 1, the published lengths; `make test` runs 0.1).
	Scale float64
	// Parallel is the simulations run at once (0 means 1).
	Parallel int
	// Progress, when set, is called with each finished simulation's name.
	Progress func(string)
}

// Check is one published claim beside what the simulator gives for it.
type Check struct {
	Claim string
	// Published and Simulated are the claim's figure (a ratio, a rate or seconds), and
	// Want what direction must hold for the simulated one ("> 1", "0.5..2", ...).
	Published, Simulated float64
	Want                 string
	// Holds says the direction holds; Within2x that Simulated is within a factor of
	// two of Published.
	Holds, Within2x bool
}

// Ratio is Simulated / Published.
func (c Check) Ratio() float64 { return c.Simulated / c.Published }

// Row is one published benchmark: its source, its workload and its checks.
type Row struct {
	Source, Workload string
	Checks           []Check
}

// row is a validation row's recipe: the runs it needs and how it judges them.
type row struct {
	source, workload string
	runs             func(scale float64) ([]run, error)
	judge            func(res map[string]sim.TimedResult) []Check
}

type run struct {
	name string
	w    *sim.Workload
	rt   sim.Routing
	cfg  sim.TimedConfig
	res  sim.TimedResult
	err  error
}

// Validate runs every row of the validation table.
func Validate(ctx context.Context, vc ValidateConfig) ([]Row, error) {
	scale := vc.Scale
	if scale == 0 {
		scale = 1
	}
	if !(scale > 0 && scale <= 1) {
		return nil, fmt.Errorf("%w: validation scale %g, want (0, 1]", sim.ErrConfig, scale)
	}
	var all [][]run
	for _, r := range rows {
		rs, err := r.runs(scale)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", r.source, err)
		}
		all = append(all, rs)
	}
	if err := runParallel(ctx, all, max(vc.Parallel, 1), vc.Progress); err != nil {
		return nil, err
	}
	res := map[string]sim.TimedResult{}
	for i := range all {
		for _, x := range all[i] {
			res[x.name] = x.res
		}
	}
	out := make([]Row, len(rows))
	for i, r := range rows {
		out[i] = Row{Source: r.source, Workload: r.workload, Checks: r.judge(res)}
	}
	return out, nil
}

// runParallel runs every simulation of all, workers at once (package internal/parallel),
// telling progress each one's name as it finishes; the first error in all's order wins.
func runParallel(ctx context.Context, all [][]run, workers int, progress func(string)) error {
	var runs []*run
	for i := range all {
		for j := range all[i] {
			runs = append(runs, &all[i][j])
		}
	}
	var done func(int)
	if progress != nil {
		done = func(i int) { progress(runs[i].name) }
	}
	parallel.Each(len(runs), workers, func(i int) {
		x := runs[i]
		x.res, x.err = sim.Simulate(ctx, x.w, x.rt, x.cfg)
	}, done)
	for i := range all {
		for _, x := range all[i] {
			if x.err != nil {
				return fmt.Errorf("%s: %w", x.name, x.err)
			}
		}
	}
	return nil
}

// scaled is the named ramp with its stages and pauses shortened by scale (stages at
// least 2 s each).
func scaled(name string, scale float64) sim.Ramp {
	r := sim.Ramps[name]
	out := make([]sim.Stage, len(r.Stages))
	for i, s := range r.Stages {
		out[i] = sim.Stage{Rate: s.Rate, Duration: max(2*time.Second, time.Duration(float64(s.Duration)*scale))}
	}
	r.Stages = out
	r.Pause = time.Duration(float64(r.Pause) * scale)
	return r
}

// engine returns a config of workers engines of a shipped profile: its cost model,
// capacity and scheduler defaults.
func engine(profile string, workers, blockSize int) (sim.TimedConfig, error) {
	spec, err := sim.ShippedProfile(profile)
	if err != nil {
		return sim.TimedConfig{}, err
	}
	return sim.TimedConfig{Config: sim.Config{Workers: workers, Capacity: spec.KVTokens / blockSize, EventDelay: -1, Seed: 1,
		ChunkTokens: spec.MaxNumBatchedTokens}, Cost: spec.Roofline(), MaxNumSeqs: spec.MaxNumSeqs}, nil
}

// policyRun is the run of w under cfg with the named policy, named key/policy.
func policyRun(key string, w *sim.Workload, cfg sim.TimedConfig, policy string) (run, error) {
	rt, err := sim.ParseRouting(policy)
	return run{name: key + "/" + policy, w: w, rt: rt, cfg: cfg}, err
}

// rampedSharedContext is a shared-context workload long enough for a ramp, and the
// config that runs it on workers engines of the profile.
func rampedSharedContext(sc sim.SharedContextConfig, ramp sim.Ramp, workers int, profile string) (*sim.Workload, sim.TimedConfig, error) {
	sc.Requests = sim.RampRequests(ramp.Stages, 1)
	w, err := sim.SharedContext(sc)
	if err != nil {
		return nil, sim.TimedConfig{}, err
	}
	cfg, err := engine(profile, workers, w.BlockSize)
	cfg.Ramp = ramp
	return w, cfg, err
}

// knee is the highest stage rate before the first stage, at or above from, whose p90
// TTFT passes slo or is unstable (0 if the first does).
func knee(stages []sim.StageResult, from float64, slo float64) float64 {
	k := 0.0
	for _, s := range stages {
		if s.Rate < from {
			continue
		}
		if p90(s) > slo {
			break
		}
		k = max(k, s.Rate)
	}
	return k
}

// stageAt is the first stage of the given rate after the warm-up (the first stage).
func stageAt(stages []sim.StageResult, rate float64) sim.StageResult {
	for _, s := range stages[1:] {
		if s.Rate == rate {
			return s
		}
	}
	return sim.StageResult{}
}

// ladderOutput is the mean output throughput over the ramp's stages after the
// warm-up, weighted by their spans.
func ladderOutput(stages []sim.StageResult) float64 {
	var tok, secs float64
	for _, s := range stages[1:] {
		tok += s.OutputTokPerS * s.Span.Seconds()
		secs += s.Span.Seconds()
	}
	return tok / secs
}

// p90 is a stage's p90 TTFT, or the stage's length when it was unstable and did not
// drain (its latency then grows with the run, and is at least that long a wait for
// its last arrivals); a drained stage's p90 is all its requests'.
func p90(s sim.StageResult) float64 {
	if s.Unstable && !s.Drained {
		return math.Max(s.TTFT.P90, s.Duration.Seconds())
	}
	return s.TTFT.P90
}

func greater(claim string, pub, sim float64) Check {
	return check(claim, pub, sim, "> 1", sim > 1)
}

func check(claim string, pub, simulated float64, want string, holds bool) Check {
	c := Check{Claim: claim, Published: pub, Simulated: simulated, Want: want, Holds: holds}
	r := c.Ratio()
	c.Within2x = r >= 0.5 && r <= 2
	return c
}

// PrintValidation writes the table: each check's published and simulated figures,
// the direction wanted, the ratio and which hold.
func PrintValidation(w io.Writer, rows []Row) {
	holds, within := 0, 0
	n := 0
	for _, r := range rows {
		fmt.Fprintf(w, "%s\n  workload: %s\n", r.Source, r.Workload)
		fmt.Fprintf(w, "  %-72s %10s %10s %8s %7s  %s\n", "claim", "published", "simulated", "want", "ratio", "holds")
		for _, c := range r.Checks {
			n++
			verdict := "direction holds"
			if !c.Holds {
				verdict = "direction FAILS"
			} else {
				holds++
			}
			if c.Within2x {
				verdict += ", within 2x"
				within++
			}
			fmt.Fprintf(w, "  %-72s %10s %10s %8s %7.2f  %s\n", c.Claim, num(c.Published), num(c.Simulated), c.Want, c.Ratio(), verdict)
		}
		fmt.Fprintln(w)
	}
	fmt.Fprintf(w, "%d of %d checks hold their direction; %d are within 2x of the published figure\n", holds, n, within)
}

func num(x float64) string {
	switch a := math.Abs(x); {
	case a >= 1000:
		return fmt.Sprintf("%.0f", x)
	case a >= 10:
		return fmt.Sprintf("%.1f", x)
	}
	return strings.TrimRight(strings.TrimRight(fmt.Sprintf("%.3f", x), "0"), ".")
}
