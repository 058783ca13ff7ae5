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

// Ramp is a staged load: its stages, and how the load generator runs them.
type Ramp struct {
	Stages []Stage
	// Even spaces each stage's arrivals evenly (inference-perf's "constant" load);
	// otherwise they are Poisson.
	Even bool
	// Drain runs the stages as inference-perf's multi-process load generator does
	// (inference_perf/loadgen/load_generator.py, run_stage and mp_run): a stage sends
	// its requests over its Duration, then waits until every one of them has finished;
	// the next stage starts Pause later (load.interval, plus the second run_stage
	// waits before its first send). Without Drain, each stage starts when the last
	// one's Duration is over and inherits its queues.
	Drain bool
	Pause time.Duration
}

// Ramps are the named ramps of the published benchmarks the validation reproduces.
var Ramps = map[string]Ramp{
	// llm-d/llm-d guides/precise-prefix-cache-routing/benchmark-templates/guide.yaml:
	// 50 s at 15 to seat the contexts, then the main ladder; inference-perf, Poisson,
	// load.interval 30 s between stages (plus run_stage's 1 s).
	"llm-d-guide": {Stages: stages(15, 50, 3, 20, 10, 20, 15, 20, 20, 38, 22, 34, 25, 30, 30, 25, 35, 21, 40, 38,
		43, 36, 46, 33, 49, 30, 52, 29, 55, 27, 57, 26, 60, 25), Drain: true, Pause: 31 * time.Second},
	// llm-d/llm-d-kv-cache-manager benchmarking/37-capacity/README.md: 25 s at 10,
	// then 3 to 20 requests per second (inference-perf, constant rate). Its config
	// sets no load.interval and does not name the inference-perf version, so whether
	// each stage waited for its requests is not known: the stages run back to back.
	"llm-d-37-capacity": {Stages: stages(10, 25, 3, 210, 4, 180, 5, 120, 6, 120, 8, 90, 10, 70, 12, 60, 15, 50, 20, 50), Even: true},
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

// ParseRamp reads a ramp: a named one (Ramps), run as its benchmark ran it, or
// "RATE:SECONDS,RATE:SECONDS,...", Poisson stages back to back.
func ParseRamp(s string) (Ramp, error) {
	if r, ok := Ramps[s]; ok {
		r.Stages = slices.Clone(r.Stages)
		return r, nil
	}
	stages, err := parseStages(s)
	return Ramp{Stages: stages}, err
}

// WithStages returns the ramp run as mode says: "" as it is, "back-to-back" (every
// stage inheriting the last one's queues), "drain" or "drain:PAUSE" (each stage
// waiting for its requests to finish, then PAUSE, default the ramp's own, before the
// next; Ramp.Drain).
func (r Ramp) WithStages(mode string) (Ramp, error) {
	switch m, pause, hasPause := strings.Cut(mode, ":"); {
	case mode == "":
	case mode == "back-to-back":
		r.Drain, r.Pause = false, 0
	case m == "drain" && !hasPause:
		r.Drain = true
	case m == "drain":
		d, err := time.ParseDuration(pause)
		if err != nil || d < 0 || d > 24*time.Hour {
			return r, fmt.Errorf("%w: ramp stages %q: the pause wants a duration in 0..24h", ErrConfig, mode)
		}
		r.Drain, r.Pause = true, d
	default:
		return r, fmt.Errorf("%w: ramp stages %q, want back-to-back, drain or drain:PAUSE", ErrConfig, mode)
	}
	return r, nil
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
// until the ramp ends or the workload's n requests run out. first[s] is the index of
// stage s's first arrival (first[len(r)] = len(arrivals)).
func rampArrivals(r []Stage, speedup float64, even bool, n int, seed uint64) (arrivals []time.Duration, first []int) {
	rng := rand.New(rand.NewPCG(seed, 0x617272697665)) // "arrive"
	out := make([]time.Duration, 0, n)
	first = make([]int, 0, len(r)+1)
	start := 0.0
	for _, s := range r {
		first = append(first, len(out))
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
	return out, append(first, len(out))
}

// StageResult is one ramp stage of a Simulate run.
type StageResult struct {
	Stage
	// Start is when the stage began, in simulated time, and Span how long it lasted:
	// its Duration, or with a draining ramp (Ramp.Drain) until its last request
	// finished, at least its Duration.
	Start, Span time.Duration
	// Requests arrived in the stage; TTFT is theirs; HitBlocks of Blocks their hits.
	Requests          int
	TTFT              Latency
	HitBlocks, Blocks int64
	// OutputTokPerS is the output tokens generated within the stage (each request's
	// spread evenly from its first token to its last) per second of its Span; with a
	// draining ramp, every output token of the stage's requests per second of its
	// Span (inference-perf's per-stage output_tokens_per_sec).
	OutputTokPerS float64
	// QueueMid and QueueEnd are the requests waiting at the engines, in all, three
	// quarters into the stage's Duration and at its end. Unstable says the queue still
	// grew at that end (QueueEnd above twice the engines, and more than one request
	// per engine above QueueMid): the stage's latencies depend on how long it ran,
	// and are no steady state.
	QueueMid, QueueEnd int
	Unstable           bool
	// Drained says the stage ran until its requests finished (Ramp.Drain): its
	// latencies are all of its requests', however long they waited.
	Drained bool
}

// BlockHitRate is HitBlocks / Blocks.
func (s StageResult) BlockHitRate() float64 { return ratio(s.HitBlocks, s.Blocks) }

// rampState runs a ramp's stages and gathers their outcomes. Without Drain every
// stage starts at its nominal time; with it, stage s+1 starts (its arrivals shifted
// later) Pause after stage s's last request finished, and only then are its
// arrivals released.
type rampState struct {
	drain   bool
	pause   time.Duration
	first   []int           // stage s's arrivals are [first[s], first[s+1])
	nominal []time.Duration // each stage's start without draining
	stageOf []int32         // each arrival's stage
	left    []int           // each stage's requests not yet finished
	started int             // the stages started (all, without Drain)
	next    int             // the next probe: stage next/2, 3/4 into it or at its end
	ttft    [][]float64
	out     []float64
	res     []StageResult
}

func newRampState(r Ramp, first []int) *rampState {
	n := len(r.Stages)
	st := &rampState{drain: r.Drain, pause: r.Pause, first: first, ttft: make([][]float64, n), out: make([]float64, n),
		res: make([]StageResult, n), left: make([]int, n), stageOf: make([]int32, first[n])}
	var t time.Duration
	for i, s := range r.Stages {
		st.res[i] = StageResult{Stage: s, Start: t, Span: s.Duration, Drained: r.Drain}
		st.nominal = append(st.nominal, t)
		st.left[i] = first[i+1] - first[i]
		for k := first[i]; k < first[i+1]; k++ {
			st.stageOf[k] = int32(i)
		}
		t += s.Duration
	}
	st.started = n
	if r.Drain {
		st.started = 0
	}
	return st
}

// start begins the ramp at time 0 (with Drain: its first stage, and every empty stage
// after it).
func (st *rampState) start(arrivals []time.Duration) {
	if st.drain && len(st.res) > 0 {
		st.begin(0, 0, arrivals)
	}
}

// released reports whether arrival i's stage has started.
func (st *rampState) released(i int) bool { return int(st.stageOf[i]) < st.started }

// begin starts stage s at t, shifting its arrivals from its nominal start to t; a
// stage without requests ends at once at the end of its Duration.
func (st *rampState) begin(s int, t time.Duration, arrivals []time.Duration) {
	for ; s < len(st.res); s++ {
		st.started = s + 1
		st.res[s].Start = t
		shift := t - st.nominal[s]
		for k := st.first[s]; k < st.first[s+1]; k++ {
			arrivals[k] += shift
		}
		if st.left[s] > 0 {
			return
		}
		t += st.res[s].Duration + st.pause
	}
}

// finished counts request i as finished at now; under Drain, the last request of the
// stage under way ends it and starts the next Pause later.
func (st *rampState) finished(i int, now time.Duration, arrivals []time.Duration) {
	s := int(st.stageOf[i])
	if st.left[s]--; st.left[s] > 0 || !st.drain {
		return
	}
	r := &st.res[s]
	end := max(now, r.Start+r.Duration)
	r.Span = end - r.Start
	st.begin(s+1, end+st.pause, arrivals)
}

// probe records the engines' total queue at every probe time up to now (of the
// stages started); queued is the total now, unchanged since the last event.
func (st *rampState) probe(now time.Duration, queued int) {
	for st.next < 2*st.started {
		s := &st.res[st.next/2]
		at := s.Start + s.Duration
		if st.next%2 == 0 {
			at = s.Start + s.Duration*3/4
		}
		if at > now {
			return
		}
		if st.next%2 == 0 {
			s.QueueMid = queued
		} else {
			s.QueueEnd = queued
		}
		st.next++
	}
}

// generated credits request i's n output tokens, generated over [from, to]: with
// Drain all to its stage, else spread evenly over the stages those times fall in.
func (st *rampState) generated(i, n int, from, to time.Duration) {
	if st.drain {
		st.out[st.stageOf[i]] += float64(n)
		return
	}
	if to <= from {
		if s := st.stageAt(to); s < len(st.out) {
			st.out[s] += float64(n)
		}
		return
	}
	per := float64(n) / float64(to-from)
	for s := st.stageAt(from); s < len(st.res); s++ {
		end := st.res[s].Start + st.res[s].Duration
		lo := max(from, st.res[s].Start)
		hi := min(to, end)
		if hi > lo {
			st.out[s] += per * float64(hi-lo)
		}
		if end >= to {
			break
		}
	}
}

// stageAt is the stage under way at t without Drain (len(res) past the ramp's end).
func (st *rampState) stageAt(t time.Duration) int {
	i, _ := slices.BinarySearchFunc(st.res, t, func(r StageResult, t time.Duration) int {
		if r.Start+r.Duration <= t {
			return -1
		}
		return 1
	})
	return i
}

// results finishes the stages' outcomes for a fleet of workers engines.
func (st *rampState) results(workers int) []StageResult {
	for i := range st.res {
		s := &st.res[i]
		t := st.ttft[i]
		s.TTFT = Latency{quantileOf(t, 0.5), quantileOf(t, 0.9), quantileOf(t, 0.99)}
		s.OutputTokPerS = st.out[i] / s.Span.Seconds()
		s.Unstable = s.QueueEnd > 2*workers && s.QueueEnd-s.QueueMid > workers
	}
	return st.res
}
