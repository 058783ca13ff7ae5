package sim

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"runtime"
	"time"

	"github.com/kvindex/kvindex/engine"
	"github.com/kvindex/kvindex/hash"
	"github.com/kvindex/kvindex/internal/replay"
	"github.com/kvindex/kvindex/route"
	"github.com/zeebo/xxh3"
)

// Defaults of the timed simulation (Simulate).
const (
	// DefaultTimedCapacity is 307,328 tokens in blocks of 64: the KV cache of one
	// Qwen3-32B engine (BF16) on two H100 80 GB GPUs with tensor parallelism 2, as
	// llm-d's benchmark reports it; DefaultCostModel times the same engine.
	DefaultTimedCapacity = 307328 / 64
	// DefaultTimedRate is the built-in workload's arrival rate under time, in requests
	// per simulated second (Poisson). sim/README.md, "The default run", says why.
	DefaultTimedRate = 16
	// DefaultMaxNumSeqs is vLLM's max_num_seqs for the OpenAI server on the default
	// engine's GPUs (H100: 70 GiB or more, not an A100; vllm/engine/arg_utils.py,
	// get_batch_defaults; 256 on smaller GPUs and A100s).
	DefaultMaxNumSeqs = 1024
	// DefaultSLOTTFT is the time-to-first-token objective goodput counts against.
	DefaultSLOTTFT = 2 * time.Second
	// DefaultMetricsInterval is how often the scorer's routers read the engines'
	// metrics (queue depth, KV utilisation).
	DefaultMetricsInterval = 50 * time.Millisecond
	// MaxRouters bounds TimedConfig.Routers.
	MaxRouters = 256
	// MaxSpeedup bounds TimedConfig.Speedup (and 1/MaxSpeedup is its least value).
	MaxSpeedup = 1e6
	// MaxOutput bounds TimedConfig.Output.
	MaxOutput = 1 << 20
	// MaxPrefillScale bounds TimedConfig.PrefillScale (and 1/MaxPrefillScale is its
	// least value).
	MaxPrefillScale = 100
	// DefaultThinkTime is the closed loop's least gap between a turn's last token and
	// the next turn of its conversation: the time a person takes to read a reply's
	// first lines and send the next message already typed (sim/README.md, "Closed
	// loop"). The Poisson clock still paces the turns; this only bounds them below.
	DefaultThinkTime = time.Second
	// MaxThinkTime bounds TimedConfig.ThinkTime.
	MaxThinkTime = time.Hour
)

// Affinity is how a front load balancer spreads requests over router replicas.
type Affinity int

const (
	// AffinityNone spreads requests round-robin over the replicas.
	AffinityNone Affinity = iota
	// AffinitySession sends all requests of a session (Request.Session) to one replica.
	AffinitySession
)

func (a Affinity) String() string {
	if a == AffinitySession {
		return "session"
	}
	return "none"
}

// TimedConfig describes a simulation under time. The zero value of every field means
// its default; Config's fields mean what they mean for Run, except: Capacity defaults
// to DefaultTimedCapacity, Rate to DefaultTimedRate (Poisson arrivals), ChunkTokens is
// the token budget of an engine step (vLLM's max_num_batched_tokens, 8192), EventDelay
// counts from the end of the engine step that stored or evicted the blocks, and
// HostCapacity must be 0 (host tiers are simulated by Run only).
type TimedConfig struct {
	Config
	// Speedup multiplies arrival rates: a trace's timestamps are divided by it, the
	// built-in workloads' Rate multiplied (default 1; 1/MaxSpeedup..MaxSpeedup).
	Speedup float64
	// Output, when > 0, replaces every request's output length (tokens generated).
	Output int
	// MaxNumSeqs bounds an engine's running requests (default DefaultMaxNumSeqs).
	MaxNumSeqs int
	// Cost times engine steps (default DefaultCostModel).
	Cost CostModel
	// PrefillScale multiplies the cost of prefill (0 means 1; at most MaxPrefillScale),
	// for the sensitivity of a result to the engine's speed. Cost must be a Roofline
	// or a Profile.
	PrefillScale float64
	// SLOTTFT is the time-to-first-token objective of Goodput (default
	// DefaultSLOTTFT).
	SLOTTFT time.Duration
	// Routers is the number of independent router replicas (default 1, at most
	// MaxRouters): each has its own load tracking, predictions and approximate cache;
	// all read the one exact index.
	Routers int
	// Affinity is how requests are spread over the replicas.
	Affinity Affinity
	// ShareLoad makes the replicas share their load, as kvindex serve's replicas do
	// over NATS (fabric.LoadShare): every replica's Tracker counts every replica's
	// requests, the deltas arriving at once (NATS takes a millisecond or so, far less
	// than the engines' steps).
	ShareLoad bool
	// OverlapWeight is route.Cost's (0: route.DefaultOverlapWeight).
	OverlapWeight float64
	// Scorer holds route.Scorer's weights (zero: llm-d's defaults).
	Scorer route.Scorer
	// Route holds the other parameters of the route policies (Cost's temperature,
	// Affinity's); its weights are OverlapWeight's and Scorer's.
	Route route.Params
	// MetricsInterval is how often the engines' metrics refresh for the scorer (default
	// DefaultMetricsInterval).
	MetricsInterval time.Duration
	// ApproxCapacity is approximate-lru's capacity per engine in its own keys of
	// ApproxBlock tokens (llm-d's lruCapacityPerServer), ApproxBlock the tokens one
	// key covers (llm-d's blockSizeTokens; it must divide, or be a multiple of, the
	// block size) and ApproxMaxBlocks the most keys of a prompt it matches (llm-d's
	// maxPrefixTokensToMatch / blockSizeTokens). Zero takes llm-d's auto-tuned value
	// (TimedConfig.Approx).
	ApproxCapacity               int
	ApproxBlock, ApproxMaxBlocks int
	// Ramp, when it has stages, replaces Rate: one staged load, its rates multiplied
	// by Speedup, until the ramp ends or the requests run out, each stage back to back
	// or draining first (Ramp.Drain); the result reports each stage
	// (TimedResult.Stages). Not for a trace, whose timestamps are its arrivals.
	Ramp Ramp
	// OpenLoop sends every turn at its arrival, even before the reply its prompt
	// repeats (Request.After) has been generated. By default (the closed loop) such a
	// turn is held until its predecessor's last token plus ThinkTime.
	OpenLoop bool
	// ThinkTime is the closed loop's least gap after a predecessor's last token
	// (default DefaultThinkTime; negative: none; at most MaxThinkTime).
	ThinkTime time.Duration
	// OnFinish, when set, sees every request as it finishes.
	OnFinish func(RequestOutcome)

	// emitted, when set (tests), sees every event as it leaves an engine, with the
	// simulated time it leaves at.
	emitted func(worker string, at time.Duration, stored bool, parent uint64, blocks []engine.Block, seq uint64)
}

// RequestOutcome is one request's life in Simulate.
type RequestOutcome struct {
	// Index is the request's index in the workload, Worker the engine that served it
	// and Router the replica that placed it.
	Index, Worker, Router int
	// Arrival, FirstToken and Finish are simulated times since the first request.
	Arrival, FirstToken, Finish time.Duration
	// Output is the tokens generated, Preemptions the times the request was preempted,
	// and HitBlocks the prefix its engine held when it first admitted it.
	Output, Preemptions, HitBlocks int
}

func (c TimedConfig) withDefaults() TimedConfig {
	if c.Capacity == 0 {
		c.Capacity = DefaultTimedCapacity
	}
	if c.Rate == 0 {
		c.Rate = DefaultTimedRate
	}
	c.Config = c.Config.withDefaults()
	if c.Speedup == 0 {
		c.Speedup = 1
	}
	if c.MaxNumSeqs == 0 {
		c.MaxNumSeqs = DefaultMaxNumSeqs
	}
	if c.Cost == nil {
		c.Cost = DefaultCostModel
	}
	if c.SLOTTFT == 0 {
		c.SLOTTFT = DefaultSLOTTFT
	}
	if c.Routers == 0 {
		c.Routers = 1
	}
	if c.MetricsInterval == 0 {
		c.MetricsInterval = DefaultMetricsInterval
	}
	if c.ThinkTime == 0 {
		c.ThinkTime = DefaultThinkTime
	}
	return c
}

// Check validates c, defaults filled in, against a workload.
func (c TimedConfig) Check(w *Workload) error {
	c = c.withDefaults()
	if err := c.Config.Check(w); err != nil {
		return err
	}
	seq := w.MaxSeqBlocks
	if c.Output > 0 {
		seq = 0
		for i := range w.Requests {
			seq = max(seq, seqBlocks(w.Requests[i].Tokens, c.Output, w.BlockSize))
		}
	}
	ablock, acap, amax := c.Approx(w.BlockSize)
	aerr := checkApproxBlock(ablock, w.BlockSize)
	var werr error
	for _, row := range route.Rows() {
		if _, err := route.New(row, c.routeParams()); err != nil {
			werr = err
		}
	}
	switch {
	case c.HostCapacity != 0:
		return fmt.Errorf("%w: a host tier (host capacity %d) is simulated without time only (Run)", ErrConfig, c.HostCapacity)
	case !(c.Speedup >= 1/MaxSpeedup && c.Speedup <= MaxSpeedup):
		return fmt.Errorf("%w: speedup %g, want %g..%g", ErrConfig, c.Speedup, 1/MaxSpeedup, float64(MaxSpeedup))
	case c.Output < 0 || c.Output > MaxOutput:
		return fmt.Errorf("%w: output length %d, want 0..%d", ErrConfig, c.Output, MaxOutput)
	case c.MaxNumSeqs < 1 || c.MaxNumSeqs > 1<<16:
		return fmt.Errorf("%w: max num seqs %d, want 1..%d", ErrConfig, c.MaxNumSeqs, 1<<16)
	case c.SLOTTFT < 0 || c.SLOTTFT > 24*time.Hour:
		return fmt.Errorf("%w: TTFT objective %v, want 0..24h", ErrConfig, c.SLOTTFT)
	case c.Routers < 1 || c.Routers > MaxRouters:
		return fmt.Errorf("%w: %d routers, want 1..%d", ErrConfig, c.Routers, MaxRouters)
	case c.Affinity != AffinityNone && c.Affinity != AffinitySession:
		return fmt.Errorf("%w: affinity %d", ErrConfig, c.Affinity)
	case c.PrefillScale != 0 && !(c.PrefillScale >= 1/MaxPrefillScale && c.PrefillScale <= MaxPrefillScale):
		return fmt.Errorf("%w: prefill scale %g, want %g..%g", ErrConfig, c.PrefillScale, 1.0/MaxPrefillScale, float64(MaxPrefillScale))
	case c.PrefillScale != 0 && !isScaler(c.Cost):
		return fmt.Errorf("%w: a prefill scale needs a Roofline or Profile cost model, not %T", ErrConfig, c.Cost)
	case len(c.Ramp.Stages) > 0 && w.Timed:
		return fmt.Errorf("%w: a ramp for a trace, whose timestamps are its arrivals", ErrConfig)
	case checkRamp(c.Ramp.Stages) != nil:
		return checkRamp(c.Ramp.Stages)
	case c.Ramp.Pause < 0 || c.Ramp.Pause > 24*time.Hour:
		return fmt.Errorf("%w: pause between ramp stages %v, want 0..24h", ErrConfig, c.Ramp.Pause)
	case c.ThinkTime > MaxThinkTime:
		return fmt.Errorf("%w: think time %v, want at most %v", ErrConfig, c.ThinkTime, MaxThinkTime)
	case c.MetricsInterval < time.Microsecond || c.MetricsInterval > time.Hour:
		return fmt.Errorf("%w: metrics interval %v, want 1µs..1h", ErrConfig, c.MetricsInterval)
	case acap < 1 || acap > route.MaxApproxCapacity:
		return fmt.Errorf("%w: approximate capacity %d blocks, want 1..%d", ErrConfig, acap, route.MaxApproxCapacity)
	case aerr != nil:
		return aerr
	case amax < 1 || amax > route.MaxApproxCapacity:
		return fmt.Errorf("%w: approximate match of %d blocks at most, want 1..%d", ErrConfig, amax, route.MaxApproxCapacity)
	case werr != nil:
		return fmt.Errorf("%w: %w", ErrConfig, werr)
	case c.Capacity < seq:
		return fmt.Errorf("%w: capacity %d blocks per worker cannot hold the longest request with its output (%d blocks of %d tokens)",
			ErrConfig, c.Capacity, seq, w.BlockSize)
	}
	return nil
}

func isScaler(m CostModel) bool {
	_, ok := m.(prefillScaler)
	return ok
}

// replica is one router replica's own state.
type replica struct {
	tracker *route.Tracker[int32]
	pred    *engine.Engine // its predictions (EventsPredict, ApproxTTL)
	lru     *route.ApproxCache
	rr      route.RoundRobin
	rng     *rand.Rand
}

// snapshot is an engine's metrics as the scorer's routers last read them.
type snapshot struct {
	waiting int
	kvUtil  float64
}

// stepAt is a pending step end.
type stepAt struct {
	t time.Duration
	e int
}

// fleet is one Simulate run's state; everything belongs to the goroutine running it.
type fleet struct {
	w    *Workload
	rt   Routing
	cfg  TimedConfig
	pol  route.Policy
	rq   *routerQueues // dynamo-cost's router queues (routing.go); nil: none
	d    *driver
	ttl  time.Duration
	eng  []*timedEngine
	ep   engineParams
	name []string
	idx  map[string]int
	reps []*replica

	arrivals []time.Duration
	now      time.Duration
	steps    timeHeap // engine e's step ends at t
	releases timeHeap // held turn e is released at t
	// finishAt is each request's last token (-1 before it), held[p] 1 + the turn held
	// until request p finishes (0: none), and think the closed loop's think time.
	finishAt []time.Duration
	held     []int32
	think    time.Duration
	ramp     *rampState // nil without a ramp
	stepDur  []time.Duration
	nextSnap time.Duration
	snap     []snapshot

	res        *TimedResult
	ttft, e2e  []float64
	itl        durHist
	met        int64 // requests whose TTFT met the SLO
	lastFinish time.Duration
	done       int
	pending    int // finished since the last Progress call

	free     []*job
	overlaps []int
	cands    []route.Candidate
	chain    []uint64
	matches  []engine.Match
	akeys    []uint64 // the request's keys in approximate-lru's blocks
	lat      []int64
	ctx      context.Context
}

// Simulate runs the workload on a fleet of timed engines (continuous batching, chunked
// prefill, decode, preemption) behind cfg.Routers router replicas running policy rt,
// and returns what users measure: time to first token, inter-token latency,
// throughput, goodput, KV utilisation, queues and preemptions, beside the hit rates.
// The exact index is driven through its public API as in Run. It returns ctx's error
// if ctx ends first.
func Simulate(ctx context.Context, w *Workload, rt Routing, cfg TimedConfig) (TimedResult, error) {
	cfg = cfg.withDefaults()
	if err := cfg.Check(w); err != nil {
		return TimedResult{}, err
	}
	if _, err := ParseRouting(rt.Name); err != nil {
		return TimedResult{}, fmt.Errorf("%w: %w", ErrConfig, err)
	}
	start := time.Now()
	f := &fleet{w: w, rt: rt, cfg: cfg, ctx: ctx, res: &TimedResult{Routing: rt, Routers: cfg.Routers}}
	defer f.close()
	if err := f.build(); err != nil {
		return TimedResult{}, err
	}
	if err := f.run(); err != nil {
		return *f.res, err
	}
	if err := f.finish(); err != nil {
		return *f.res, err
	}
	f.res.Seconds = time.Since(start).Seconds()
	return *f.res, nil
}

// policy is the routing's route policy, nil for round-robin (each replica has its own
// counter).
func (f *fleet) policy() (route.Policy, error) {
	if f.rt.Family == route.FamilyRoundRobin {
		return nil, nil
	}
	p, err := route.New(f.rt.Row(), f.cfg.routeParams())
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrConfig, err)
	}
	return p, nil
}

// routeParams are the route policies' parameters the config sets.
func (c TimedConfig) routeParams() route.Params {
	p := c.Route
	p.OverlapWeight = c.OverlapWeight
	p.PrefixWeight, p.KVWeight, p.QueueWeight = c.Scorer.PrefixWeight, c.Scorer.KVWeight, c.Scorer.QueueWeight
	return p
}

// build makes the engines, the exact index, the replicas and the arrival times.
func (f *fleet) build() error {
	cfg := f.cfg
	var err error
	if f.pol, err = f.policy(); err != nil {
		return err
	}
	if f.rq, err = newRouterQueues(f.rt, cfg); err != nil {
		return err
	}
	f.d = &driver{delay: cfg.EventDelay, drop: !f.rt.events(), obs: cfg.Observer, st: &f.res.Index, batch: true}
	epoch := time.Unix(0, 0)
	clock := func() time.Time { return epoch.Add(f.now) }
	ecfg := cfg.Engine
	ecfg.Clock = clock
	if f.rt.events() {
		e, err := engine.New(ecfg)
		if err != nil {
			return fmt.Errorf("%w: %w", ErrConfig, err)
		}
		f.d.e = e
	}
	f.ttl = cfg.PredictionTTL
	if f.ttl == 0 {
		f.ttl = min(DefaultPredictionTTL+max(cfg.EventDelay, 0), engine.MaxPredictionTTL)
		switch f.rt.Knowledge {
		case ApproxTTL:
			f.ttl = DefaultApproximateTTL
		case EventsSticky:
			f.ttl = route.DefaultStickyTTL
		}
	}
	pcfg := ecfg
	if (f.rt.Knowledge == ApproxTTL || f.rt.Knowledge == EventsSticky) && pcfg.PredictionsPerWorker == 0 {
		pcfg.PredictionsPerWorker = DefaultApproximatePredictions
	}
	var shared *route.Tracker[int32]
	for i := range cfg.Routers {
		tr, err := route.NewTracker[int32](route.TrackerConfig{MaxInFlight: route.MaxInFlight, TTL: math.MaxInt64, Now: clock,
			TrackOutputBlocks: cfg.Route.TrackOutputBlocks})
		if err != nil {
			return err
		}
		if cfg.ShareLoad {
			// One Tracker for all: each replica's deltas reach the others at once.
			if shared == nil {
				shared = tr
			}
			tr = shared
		}
		rep := &replica{tracker: tr, rng: rand.New(rand.NewPCG(cfg.Seed, 0x726f75746572+uint64(i)))} // "router"
		if f.rt.predicts() {
			if rep.pred, err = engine.New(pcfg); err != nil {
				return fmt.Errorf("%w: %w", ErrConfig, err)
			}
		}
		if f.rt.Knowledge == ApproxLRU {
			_, acap, _ := cfg.Approx(f.w.BlockSize)
			if rep.lru, err = route.NewApproxCache(acap); err != nil {
				return fmt.Errorf("%w: %w", ErrConfig, err)
			}
		}
		f.reps = append(f.reps, rep)
	}
	cost := cfg.Cost
	if sc, ok := cost.(prefillScaler); ok && cfg.PrefillScale != 0 {
		cost = sc.withPrefillScale(cfg.PrefillScale)
	}
	f.ep = engineParams{blockSize: f.w.BlockSize, budget: cfg.ChunkTokens, maxSeqs: cfg.MaxNumSeqs, cost: cost,
		outSalt: xxh3.HashSeed([]byte("generated"), cfg.Seed)}
	f.idx = make(map[string]int, cfg.Workers)
	for i := range cfg.Workers {
		name := WorkerName(i)
		var seed [16]byte
		for j := range 8 {
			seed[j] = byte(cfg.Seed >> (8 * j))
			seed[8+j] = byte(uint64(i) >> (8 * j))
		}
		m := newMockEngine(name, xxh3.HashSeed(seed[:], 0x6e6f6e65), cfg.Capacity, 0, f.w.BlockSize, cfg.ChunkTokens) // "none"
		f.eng = append(f.eng, newTimedEngine(m, &f.ep))
		f.name = append(f.name, name)
		f.idx[name] = i
	}
	f.stepDur = make([]time.Duration, cfg.Workers)
	f.snap = make([]snapshot, cfg.Workers)
	f.overlaps = make([]int, cfg.Workers)
	f.cands = make([]route.Candidate, cfg.Workers)
	f.res.Loads = make([]int64, cfg.Workers)
	f.res.LoadTokens = make([]int64, cfg.Workers)
	f.ttft = make([]float64, 0, len(f.w.Requests))
	f.e2e = make([]float64, 0, len(f.w.Requests))
	if f.rt.events() || f.rt.predicts() {
		f.lat = make([]int64, 0, len(f.w.Requests))
	}
	f.arrivals = arrivals(f.w, cfg)
	if len(cfg.Ramp.Stages) > 0 {
		var first []int
		f.arrivals, first = rampArrivals(cfg.Ramp.Stages, cfg.Speedup, cfg.Ramp.Even, len(f.w.Requests), cfg.Seed)
		f.ramp = newRampState(cfg.Ramp, first)
		f.ramp.start(f.arrivals)
	}
	f.finishAt = make([]time.Duration, len(f.w.Requests))
	for i := range f.finishAt {
		f.finishAt[i] = -1
	}
	f.held = make([]int32, len(f.w.Requests))
	f.think = max(cfg.ThinkTime, 0)
	return nil
}

// arrivals returns each request's arrival: a trace's timestamps divided by the
// speedup, or a Poisson process at Rate x Speedup.
func arrivals(w *Workload, cfg TimedConfig) []time.Duration {
	out := make([]time.Duration, len(w.Requests))
	if w.Timed {
		for i := range w.Requests {
			out[i] = time.Duration(float64(w.Requests[i].At) / cfg.Speedup)
		}
		return out
	}
	rng := rand.New(rand.NewPCG(cfg.Seed, 0x617272697665)) // "arrive"
	rate := cfg.Rate * cfg.Speedup
	t := 0.0
	for i := range out {
		out[i] = time.Duration(t * 1e9)
		t += rng.ExpFloat64() / rate
	}
	return out
}

func (f *fleet) close() {
	if f.d != nil && f.d.e != nil {
		f.d.e.Close()
		f.d.e = nil
	}
	for _, r := range f.reps {
		if r.pred != nil {
			r.pred.Close()
			r.pred = nil
		}
	}
}

// timeHeap is a binary min-heap of (time, index) by time, then index: the engines'
// pending step ends, and the held turns' releases.
type timeHeap []stepAt

func (h timeHeap) less(a, b int) bool {
	return h[a].t < h[b].t || (h[a].t == h[b].t && h[a].e < h[b].e)
}

func (h *timeHeap) push(s stepAt) {
	*h = append(*h, s)
	x := *h
	for i := len(x) - 1; i > 0; {
		p := (i - 1) / 2
		if !x.less(i, p) {
			break
		}
		x[i], x[p] = x[p], x[i]
		i = p
	}
}

func (h *timeHeap) pop() stepAt {
	x := *h
	top := x[0]
	last := len(x) - 1
	x[0] = x[last]
	x = x[:last]
	for i := 0; ; {
		l, r, m := 2*i+1, 2*i+2, i
		if l < last && x.less(l, m) {
			m = l
		}
		if r < last && x.less(r, m) {
			m = r
		}
		if m == i {
			break
		}
		x[i], x[m] = x[m], x[i]
		i = m
	}
	*h = x
	return top
}

// next is the earliest time in the heap, or never.
func (h timeHeap) next() time.Duration {
	if len(h) == 0 {
		return time.Duration(math.MaxInt64)
	}
	return h[0].t
}

// run is the event loop: step ends, held turns' releases and arrivals in time order,
// in that order at equal times.
func (f *fleet) run() error {
	next := 0
	for iter := 0; ; iter++ {
		if iter&1023 == 0 {
			if err := f.ctx.Err(); err != nil {
				return err
			}
		}
		arr := time.Duration(math.MaxInt64)
		if next < len(f.arrivals) && (f.ramp == nil || f.ramp.released(next)) {
			arr = f.arrivals[next]
		}
		step, rel := f.steps.next(), f.releases.next()
		switch {
		case len(f.steps) == 0 && len(f.releases) == 0 && next == len(f.arrivals):
			return nil
		case len(f.steps) == 0 && len(f.releases) == 0 && arr == time.Duration(math.MaxInt64):
			return fmt.Errorf("sim: ramp stage %d never started: nothing runs, %d requests to come", f.ramp.stageOf[next]+1, len(f.arrivals)-next)
		case len(f.steps) > 0 && step <= rel && step <= arr:
			s := f.steps.pop()
			f.advance(s.t)
			if err := f.endStep(s.e); err != nil {
				return err
			}
			if err := f.rq.drain(f); err != nil {
				return err
			}
		case len(f.releases) > 0 && rel <= arr:
			r := f.releases.pop()
			f.advance(r.t)
			if err := f.route(r.e); err != nil {
				return err
			}
		default:
			f.advance(arr)
			if err := f.arrive(next); err != nil {
				return err
			}
			next++
		}
	}
}

// advance moves the clock to t: the engines' metrics and the ramp's queue probes
// due before t see the state as it has been since the last event.
func (f *fleet) advance(t time.Duration) {
	if f.ramp != nil {
		f.ramp.probe(t, f.queued())
	}
	f.now = t
	f.snapshotIfDue()
}

// queued is the requests waiting at the engines, in all.
func (f *fleet) queued() int {
	n := 0
	for _, e := range f.eng {
		n += e.queued()
	}
	return n
}

// stage is the ramp stage request i arrived in (past the last: none).
func (f *fleet) stage(i int32) *StageResult {
	if f.ramp == nil {
		return nil
	}
	if int(i) < len(f.ramp.stageOf) {
		return &f.ramp.res[f.ramp.stageOf[i]]
	}
	return nil
}

// arrive takes request i at its arrival: a turn whose predecessor has not finished
// (its last token plus the think time) is held under the closed loop, and counted as
// early under the open loop; every other request is routed now.
func (f *fleet) arrive(i int) error {
	if s := f.stage(int32(i)); s != nil {
		s.Requests++
	}
	p := f.w.Requests[i].After - 1
	if p < 0 {
		return f.route(i)
	}
	f.res.Turns++
	ready := f.finishAt[p] + f.think
	if f.finishAt[p] >= 0 && ready <= f.now {
		return f.route(i)
	}
	f.res.Waited++
	switch {
	case f.cfg.OpenLoop:
		return f.route(i)
	case f.finishAt[p] >= 0:
		f.releases.push(stepAt{t: ready, e: i})
	default:
		f.held[p] = int32(i) + 1
	}
	return nil
}

// release schedules the turn held on request p, if any, now that p has finished.
func (f *fleet) release(p int32) {
	if i := f.held[p] - 1; i >= 0 {
		f.held[p] = 0
		f.releases.push(stepAt{t: f.now + f.think, e: int(i)})
	}
}

// snapshotIfDue refreshes the engines' metrics when an interval boundary has passed:
// nothing changed since the last event, so the state now is the state at the boundary.
func (f *fleet) snapshotIfDue() {
	if f.now < f.nextSnap {
		return
	}
	for i, e := range f.eng {
		f.snap[i] = snapshot{waiting: e.queued(), kvUtil: float64(e.m.inUse) / float64(len(e.m.blocks))}
	}
	iv := f.cfg.MetricsInterval
	f.nextSnap = (f.now/iv + 1) * iv
}

func (f *fleet) startStep(i int) error {
	e := f.eng[i]
	d, err := e.schedule(f.now, f.admitted)
	if err != nil {
		return err
	}
	if d > 0 {
		f.stepDur[i] = d
		f.steps.push(stepAt{t: f.now + d, e: i})
	}
	return nil
}

func (f *fleet) endStep(i int) error {
	e := f.eng[i]
	e.stepDone(f.now, f.stepDur[i], f.firstToken, &f.itl, f.finished)
	f.noteGenerated(i)
	f.d.now = f.now
	var em emitter = delayed{f.d}
	if f.cfg.emitted != nil {
		em = tee{em, f}
	}
	if err := e.ev.flush(f.name[i], em); err != nil {
		return err
	}
	return f.startStep(i)
}

func (f *fleet) admitted(j *job, hit, reused int) {
	j.hit = min(hit, len(j.r.Blocks))
	f.res.HitBlocks += int64(j.hit)
	f.res.Blocks += int64(len(j.r.Blocks))
	f.res.ReplyHitBlocks += int64(j.r.replyBlocks(j.hit))
	f.res.ReplyBlocks += int64(j.r.replyBlocks(len(j.r.Blocks)))
	if s := f.stage(j.idx); s != nil {
		s.HitBlocks += int64(j.hit)
		s.Blocks += int64(len(j.r.Blocks))
	}
	f.res.ReusedTokens += int64(reused * f.w.BlockSize)
	f.res.Tokens += int64(j.r.Tokens)
}

func (f *fleet) firstToken(j *job) {
	t := f.now - j.arrival
	j.firstTok = f.now
	f.ttft = append(f.ttft, t.Seconds())
	if f.ramp != nil {
		if int(j.idx) < len(f.ramp.stageOf) {
			s := f.ramp.stageOf[j.idx]
			f.ramp.ttft[s] = append(f.ramp.ttft[s], t.Seconds())
		}
	}
	if t <= f.cfg.SLOTTFT {
		f.met++
	}
	f.reps[j.router].tracker.FirstToken(j.idx)
}

func (f *fleet) finished(j *job) {
	f.e2e = append(f.e2e, (f.now - j.arrival).Seconds())
	f.res.OutputTokens += int64(j.generated)
	f.res.Requests++
	f.reps[j.router].tracker.Finished(j.idx)
	f.lastFinish = max(f.lastFinish, f.now)
	f.finishAt[j.idx] = f.now
	f.release(j.idx)
	if f.ramp != nil && int(j.idx) < len(f.ramp.stageOf) {
		f.ramp.generated(int(j.idx), j.generated, j.firstTok, f.now)
		f.ramp.finished(int(j.idx), f.now, f.arrivals)
	}
	if f.cfg.OnFinish != nil {
		f.cfg.OnFinish(RequestOutcome{Index: int(j.idx), Worker: j.worker, Router: int(j.router),
			Arrival: j.arrival, FirstToken: j.firstTok, Finish: f.now,
			Output: j.generated, Preemptions: j.preempts, HitBlocks: j.hit})
	}
	f.free = append(f.free, j)
	f.done++
	if f.pending++; f.cfg.Progress != nil && f.pending == 64 {
		f.cfg.Progress(f.pending)
		f.pending = 0
	}
}

// tee shows a test the events an engine emits, then passes them on.
type tee struct {
	em emitter
	f  *fleet
}

func (t tee) stored(worker string, tier engine.Tier, parent uint64, hasParent bool, blocks []engine.Block) error {
	t.f.cfg.emitted(worker, t.f.now, true, parent, blocks, 0)
	return t.em.stored(worker, tier, parent, hasParent, blocks)
}

func (t tee) removed(worker string, tier engine.Tier, seq uint64) error {
	t.f.cfg.emitted(worker, t.f.now, false, 0, nil, seq)
	return t.em.removed(worker, tier, seq)
}

// replicaFor is the router replica the front load balancer sends request i to.
func (f *fleet) replicaFor(i int) int {
	n := len(f.reps)
	if n == 1 {
		return 0
	}
	if s := f.w.Requests[i].Session; f.cfg.Affinity == AffinitySession && s != 0 {
		return int(hash.Next(0x6166666e, s) % uint64(n)) // "affn"
	}
	return i % n
}

// query fills f.overlaps from engine e's answer for the request's blocks, keeping the
// larger of what is there and what e says.
func (f *fleet) query(e *engine.Engine, blocks []uint64, count bool) error {
	t0 := time.Now()
	// The Barrier makes every earlier event and prediction visible: routing is
	// deterministic.
	if err := e.Barrier(f.ctx); err != nil {
		return err
	}
	t1 := time.Now()
	var err error
	f.matches, err = e.FindMatches(f.ctx, blocks, f.matches[:0])
	t2 := time.Now()
	if err != nil {
		return err
	}
	f.d.spent += t2.Sub(t0)
	f.lat = append(f.lat, t2.Sub(t1).Nanoseconds())
	if count {
		f.res.Index.Queries++
		f.res.Index.QueryBlocks += int64(len(blocks))
	}
	for k := range f.matches {
		if j, ok := f.idx[f.matches[k].Worker]; ok {
			f.overlaps[j] = max(f.overlaps[j], f.matches[k].Score)
		}
	}
	return nil
}

// route places request i: the replica's knowledge of the caches, its load, its pick.
func (f *fleet) route(i int) error {
	r := &f.w.Requests[i]
	ri := f.replicaFor(i)
	rep := f.reps[ri]
	if f.rq.park(f, ri, i) {
		return nil
	}
	clear(f.overlaps)
	if len(r.Blocks) > 0 {
		if f.rt.events() {
			if err := f.d.deliver(f.now, false); err != nil {
				return err
			}
			if err := f.query(f.d.e, r.Blocks, true); err != nil {
				return err
			}
		}
		if rep.pred != nil {
			if err := f.query(rep.pred, r.Blocks, !f.rt.events()); err != nil {
				return err
			}
		}
		if rep.lru != nil {
			ablock, _, amax := f.cfg.Approx(f.w.BlockSize)
			f.akeys = approxKeys(f.akeys[:0], r.Blocks, f.w.BlockSize, ablock, amax)
			f.overlaps = rep.lru.MatchAll(f.name, f.akeys, f.overlaps)
			for k, n := range f.overlaps {
				f.overlaps[k] = engineBlocks(n, f.w.BlockSize, ablock)
			}
		}
	}
	req := route.Request{Tokens: r.Tokens, BlockSize: f.w.BlockSize}
	if f.rt.Family == route.FamilyDynamoCost {
		// Only Dynamo's cost reads the Tracker's active blocks (Load.ActiveBlocks,
		// Candidate.ActiveOverlap), counted by these hashes; for the other families
		// the Tracker's per-block refcounts would be work that changes no pick.
		f.chain = chainBlocks(r.Blocks, f.chain)
		req.Blocks = f.chain
	}
	f.cands = rep.tracker.Candidates(f.name, req, f.overlaps, f.cands)
	for k := range f.cands {
		f.cands[k].Load.Override(route.Metrics{Waiting: f.snap[k].waiting, KVUtil: f.snap[k].kvUtil})
	}
	var k int
	switch {
	case f.cfg.force != nil:
		k = f.cfg.force[i]
	case f.pol == nil:
		k = rep.rr.Pick(req, f.cands, 0)
	default:
		k = f.pol.Pick(req, f.cands, rep.rng.Uint64())
	}
	name := f.name[k]
	if err := rep.tracker.Routed(int32(i), name, req, f.overlaps[k]*f.w.BlockSize); err != nil {
		return err
	}
	if rep.pred != nil && len(r.Blocks) > 0 {
		t := time.Now()
		if err := rep.pred.Predict(f.ctx, name, "", r.Blocks, f.ttl); err != nil {
			return err
		}
		f.d.spent += time.Since(t)
	}
	if rep.lru != nil && len(r.Blocks) > 0 {
		rep.lru.Record(name, f.akeys)
	}
	f.res.Loads[k]++
	f.res.LoadTokens[k] += int64(r.Tokens)

	j := f.newJob(i, ri)
	j.arrival = f.rq.arrival(j.idx, f.now)
	j.worker = k
	e := f.eng[k]
	e.assign(j)
	e.pushBack(f.now, j)
	if !e.busy {
		return f.startStep(k)
	}
	return nil
}

// chainBlocks fills dst with the prefix hashes of a request's block content hashes
// (each block's hash chained to its predecessors'), the keys by which the Tracker
// counts a worker's distinct active blocks.
func chainBlocks(content, dst []uint64) []uint64 {
	dst = dst[:0]
	h := uint64(0x616374697665) // "active"
	for _, b := range content {
		h = hash.Next(h, b)
		dst = append(dst, h)
	}
	return dst
}

func (f *fleet) newJob(i, router int) *job {
	var j *job
	if n := len(f.free); n > 0 {
		j = f.free[n-1]
		f.free = f.free[:n-1]
		*j = job{hashes: j.hashes[:0], blocks: j.blocks[:0], memo: j.memo[:0], memoGen: j.memoGen[:0]}
	} else {
		j = &job{}
	}
	r := &f.w.Requests[i]
	j.idx, j.router, j.r = int32(i), int32(router), r
	j.output = max(r.Output, 1)
	if f.cfg.Output > 0 {
		j.output = f.cfg.Output
	}
	j.arrival = f.now
	return j
}

// finish delivers the last events, then gathers the outcomes.
func (f *fleet) finish() error {
	if err := f.d.deliver(0, true); err != nil {
		return err
	}
	res := f.res
	if f.cfg.Progress != nil && f.pending > 0 {
		f.cfg.Progress(f.pending)
	}
	if e := f.d.e; e != nil {
		t := time.Now()
		if err := e.Barrier(f.ctx); err != nil {
			return err
		}
		f.d.spent += time.Since(t)
		st := e.Stats()
		res.Index.Events = st.Events + uint64(f.d.merged)
		res.Index.Memberships = st.Blocks
	}
	res.Index.EngineSeconds = f.d.spent.Seconds()
	res.Index.FindMatchesP50 = replay.Percentile(f.lat, 0.50)
	res.Index.FindMatchesP99 = replay.Percentile(f.lat, 0.99)
	res.Index.FindMatchesP999 = replay.Percentile(f.lat, 0.999)

	first := time.Duration(0)
	if len(f.arrivals) > 0 {
		first = f.arrivals[0]
	}
	span := (f.lastFinish - first).Seconds()
	res.Makespan = span
	res.TTFT = Latency{quantileOf(f.ttft, 0.5), quantileOf(f.ttft, 0.9), quantileOf(f.ttft, 0.99)}
	res.E2E = Latency{quantileOf(f.e2e, 0.5), quantileOf(f.e2e, 0.9), quantileOf(f.e2e, 0.99)}
	res.ITL = Latency{f.itl.quantile(0.5), f.itl.quantile(0.9), f.itl.quantile(0.99)}
	if span > 0 {
		res.OutputTokPerS = float64(res.OutputTokens) / span
		res.Goodput = float64(f.met) / span
	}
	res.SLOMet = ratio(f.met, int64(res.Requests))
	if f.ramp != nil {
		f.ramp.probe(time.Duration(math.MaxInt64), 0) // everything has finished
		res.Stages = f.ramp.results(len(f.eng))
	}

	// Gauges over [0, lastFinish] for every engine; idle time counts as empty.
	total := f.lastFinish
	var kvHist [101]int64
	var qHist []int64
	var kvArea, qArea float64
	var busy time.Duration
	for _, e := range f.eng {
		e.noteQueue(total)
		kvArea += e.st.kvArea
		qArea += e.st.qArea
		busy += e.st.busy
		for i, x := range e.st.kvHist {
			kvHist[i] += x
		}
		kvHist[0] += int64(max(total-e.st.busy, 0))
		for len(qHist) < len(e.st.qHist) {
			qHist = append(qHist, 0)
		}
		for i, x := range e.st.qHist {
			qHist[i] += x
			if x > 0 {
				res.QueueMax = max(res.QueueMax, i)
			}
		}
		res.Preemptions += e.st.preemptions
		res.Steps += e.st.steps
	}
	if total > 0 {
		denom := total.Seconds() * float64(len(f.eng))
		res.KVUtilMean = kvArea / denom
		res.QueueMean = qArea / denom
		res.BusyFrac = busy.Seconds() / denom
	}
	res.KVUtilP90 = float64(weightedQuantile(kvHist[:], 0.9)) / 100
	res.QueueP90 = weightedQuantile(qHist, 0.9)

	if f.cfg.MeasureMemory && f.d.e != nil {
		var with, without runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&with)
		f.d.e.Close()
		f.d.e = nil
		runtime.GC()
		runtime.ReadMemStats(&without)
		res.Index.HeapBytes = int64(with.HeapAlloc) - int64(without.HeapAlloc)
		runtime.KeepAlive(f.eng)
		runtime.KeepAlive(f.w)
	}
	return nil
}
