package sim

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Stage is one stage of a staged ramp (TimedConfig.Ramp): arrivals at Rate requests
// per second for Duration. A stage of rate 0 is a pause. Each stage inherits the
// queues the last one left, as one continuous benchmark run does.
type Stage struct {
	Rate     float64
	Duration time.Duration
}

// MaxStages bounds a ramp's stages, and MaxStageRate a stage's rate.
const (
	MaxStages    = 1024
	MaxStageRate = 1e6
)

// evenRamps are the named ramps whose benchmark sent its requests evenly spaced.
var evenRamps = map[string]bool{"llm-d-37-capacity": true}

// Ramps are the named ramps of the published benchmarks the validation reproduces.
var Ramps = map[string][]Stage{
	// llm-d/llm-d guides/precise-prefix-cache-routing/benchmark-templates/guide.yaml:
	// 50 s at 15 to seat the contexts, then the main ladder (inference-perf, Poisson).
	"llm-d-guide": stages(15, 50, 3, 20, 10, 20, 15, 20, 20, 38, 22, 34, 25, 30, 30, 25, 35, 21, 40, 38,
		43, 36, 46, 33, 49, 30, 52, 29, 55, 27, 57, 26, 60, 25),
	// llm-d/llm-d-kv-cache-manager benchmarking/37-capacity/README.md: 25 s at 10,
	// then 3 to 20 requests per second (inference-perf, constant rate).
	"llm-d-37-capacity": stages(10, 25, 3, 210, 4, 180, 5, 120, 6, 120, 8, 90, 10, 70, 12, 60, 15, 50, 20, 50),
}

// stages builds a ramp from (rate, seconds) pairs.
func stages(pairs ...float64) []Stage {
	out := make([]Stage, 0, len(pairs)/2)
	for i := 0; i+1 < len(pairs); i += 2 {
		out = append(out, Stage{Rate: pairs[i], Duration: time.Duration(pairs[i+1] * float64(time.Second))})
	}
	return out
}

// RampNames lists the named ramps, sorted.
func RampNames() []string {
	var names []string
	for n := range Ramps {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}

// ParseRamp reads a ramp: a named one (Ramps) or "RATE:SECONDS,RATE:SECONDS,...".
// even says the named ramp's benchmark spaced its arrivals evenly
// (TimedConfig.EvenArrivals).
func ParseRamp(s string) (stages []Stage, even bool, err error) {
	if r, ok := Ramps[s]; ok {
		return slices.Clone(r), evenRamps[s], nil
	}
	stages, err = parseStages(s)
	return stages, false, err
}

func parseStages(s string) ([]Stage, error) {
	var out []Stage
	for _, part := range strings.Split(s, ",") {
		rs, ds, ok := strings.Cut(strings.TrimSpace(part), ":")
		rate, rerr := strconv.ParseFloat(rs, 64)
		secs, derr := strconv.ParseFloat(ds, 64)
		if !ok || rerr != nil || derr != nil {
			return nil, fmt.Errorf("%w: ramp stage %q, want RATE:SECONDS (or one of %s)", ErrConfig, part, strings.Join(RampNames(), ", "))
		}
		out = append(out, Stage{Rate: rate, Duration: time.Duration(secs * float64(time.Second))})
	}
	return out, checkRamp(out)
}

func checkRamp(r []Stage) error {
	if len(r) > MaxStages {
		return fmt.Errorf("%w: %d ramp stages, want at most %d", ErrConfig, len(r), MaxStages)
	}
	var total time.Duration
	for i, s := range r {
		if !(s.Rate >= 0 && s.Rate <= MaxStageRate) || s.Duration <= 0 || s.Duration > 24*time.Hour {
			return fmt.Errorf("%w: ramp stage %d: %g requests/s for %v, want 0..%g for (0, 24h]", ErrConfig, i+1, s.Rate, s.Duration, float64(MaxStageRate))
		}
		total += s.Duration
	}
	if total > 7*24*time.Hour {
		return fmt.Errorf("%w: a ramp of %v, want at most a week", ErrConfig, total)
	}
	return nil
}

// RampRequests is about how many requests a ramp sends (its mean, plus a margin for
// the Poisson spread): the workload must hold at least as many.
func RampRequests(r []Stage, speedup float64) int {
	var n float64
	for _, s := range r {
		n += s.Rate * speedup * s.Duration.Seconds()
	}
	return int(n*1.05) + 64
}

// rampArrivals draws arrivals along a ramp: Poisson within each stage (memoryless, so
// a draw past a stage's end restarts at the next stage's rate), or evenly spaced,
// until the ramp ends or the workload's n requests run out.
func rampArrivals(r []Stage, speedup float64, even bool, n int, seed uint64) []time.Duration {
	rng := rand.New(rand.NewPCG(seed, 0x617272697665)) // "arrive"
	out := make([]time.Duration, 0, n)
	start := 0.0
	for _, s := range r {
		end := start + s.Duration.Seconds()
		rate := s.Rate * speedup
		if rate > 0 {
			t := start
			if !even {
				t += rng.ExpFloat64() / rate
			}
			for t < end && len(out) < n {
				out = append(out, time.Duration(t*1e9))
				if even {
					t += 1 / rate
				} else {
					t += rng.ExpFloat64() / rate
				}
			}
		}
		start = end
	}
	return out
}

// StageResult is one ramp stage of a Simulate run.
type StageResult struct {
	Stage
	// Start is when the stage began, in simulated time.
	Start time.Duration
	// Requests arrived in the stage; TTFT is theirs; HitBlocks of Blocks their hits.
	Requests          int
	TTFT              Latency
	HitBlocks, Blocks int64
	// OutputTokPerS is the output tokens generated within the stage (each request's
	// spread evenly from its first token to its last), per second of it.
	OutputTokPerS float64
	// QueueMid and QueueEnd are the requests waiting at the engines, in all, three
	// quarters into the stage and at its end. Unstable says the queue still grew at
	// the stage's end (QueueEnd above twice the engines, and more than one request
	// per engine above QueueMid): the stage's latencies depend on how long it ran,
	// and are no steady state.
	QueueMid, QueueEnd int
	Unstable           bool
}

// BlockHitRate is HitBlocks / Blocks.
func (s StageResult) BlockHitRate() float64 { return ratio(s.HitBlocks, s.Blocks) }

// rampState gathers a run's per-stage outcomes.
type rampState struct {
	ends   []time.Duration // each stage's end
	probes []time.Duration // 3/4 into each stage, then its end
	next   int             // the next probe
	ttft   [][]float64
	out    []float64
	res    []StageResult
}

func newRampState(r []Stage) *rampState {
	st := &rampState{ttft: make([][]float64, len(r)), out: make([]float64, len(r)), res: make([]StageResult, len(r))}
	var t time.Duration
	for i, s := range r {
		st.res[i] = StageResult{Stage: s, Start: t}
		st.probes = append(st.probes, t+s.Duration*3/4, t+s.Duration)
		t += s.Duration
		st.ends = append(st.ends, t)
	}
	return st
}

// stageAt is the stage under way at t (len(ends) past the ramp's end).
func (st *rampState) stageAt(t time.Duration) int {
	i, _ := slices.BinarySearchFunc(st.ends, t, func(e, t time.Duration) int {
		if e <= t {
			return -1
		}
		return 1
	})
	return i
}

// probe records the engines' total queue at every probe time up to now; queued is
// the total now, unchanged since the last event.
func (st *rampState) probe(now time.Duration, queued int) {
	for st.next < len(st.probes) && st.probes[st.next] <= now {
		s := &st.res[st.next/2]
		if st.next%2 == 0 {
			s.QueueMid = queued
		} else {
			s.QueueEnd = queued
		}
		st.next++
	}
}

// generated spreads a request's n output tokens evenly over [from, to] and adds each
// stage's share.
func (st *rampState) generated(n int, from, to time.Duration) {
	if to <= from {
		if s := st.stageAt(to); s < len(st.out) {
			st.out[s] += float64(n)
		}
		return
	}
	per := float64(n) / float64(to-from)
	for s := st.stageAt(from); s < len(st.ends); s++ {
		lo := max(from, st.res[s].Start)
		hi := min(to, st.ends[s])
		if hi > lo {
			st.out[s] += per * float64(hi-lo)
		}
		if st.ends[s] >= to {
			break
		}
	}
}

// results finishes the stages' outcomes for a fleet of workers engines.
func (st *rampState) results(workers int) []StageResult {
	for i := range st.res {
		s := &st.res[i]
		t := st.ttft[i]
		s.TTFT = Latency{quantileOf(t, 0.5), quantileOf(t, 0.9), quantileOf(t, 0.99)}
		s.OutputTokPerS = st.out[i] / s.Duration.Seconds()
		s.Unstable = s.QueueEnd > 2*workers && s.QueueEnd-s.QueueMid > workers
	}
	return st.res
}
