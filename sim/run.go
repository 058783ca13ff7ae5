package sim

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"time"

	"github.com/kvindex/kvindex/engine"
	"github.com/kvindex/kvindex/internal/replay"
	"github.com/zeebo/xxh3"
)

// Defaults of the simulated cluster.
const (
	DefaultWorkers     = 8
	DefaultCapacity    = 4096 // blocks per worker
	DefaultChunkTokens = 8192 // vLLM's default max_num_batched_tokens
	MaxWorkers         = 4096
	// MaxCapacity bounds Capacity and HostCapacity, and MaxFleetBlocks bounds Workers x
	// (Capacity + HostCapacity) (each mock block takes 24 bytes, 48 with a host tier; a
	// host block about 40).
	MaxCapacity    = 1 << 24
	MaxFleetBlocks = 1 << 26
	// DefaultEventDelay is how long after a request is served its events reach the
	// index, in simulated time: the publisher's batching, the network and the
	// subscriber's decode (tens of milliseconds in production).
	DefaultEventDelay = 50 * time.Millisecond
	// DefaultRate spaces the arrivals of a workload without timestamps (the built-in
	// one), in requests per simulated second.
	DefaultRate = 100
	// DefaultPredictionTTL is how long kv-aware-predict's predictions outlive the event
	// delay, and DefaultApproximateTTL the lifetime of approximate's (Dynamo's
	// approximate mode keeps its predictions two minutes).
	DefaultPredictionTTL  = 2 * time.Second
	DefaultApproximateTTL = 120 * time.Second
	// DefaultApproximatePredictions is the per-worker bound on predictions (engine
	// Config.PredictionsPerWorker) under approximate, where they are the whole index.
	DefaultApproximatePredictions = 4096
	// DefaultHostLoadCost is what loading a block from the host tier costs, as a fraction
	// of recomputing it (Config.HostLoadCost). An assumption, not a measurement: it is
	// the complement of the host weight of engine.DefaultWeights (Dynamo's 0.75: a host
	// block is worth three quarters of a device block), so that the weighted policy and
	// the cost it is judged by agree.
	DefaultHostLoadCost = 0.25
)

// ErrConfig wraps every Config problem, including a capacity too small for the workload.
var ErrConfig = errors.New("sim: invalid config")

// Config describes the simulated cluster. The zero value of every field means its default.
type Config struct {
	// Workers is the number of mock engines (default 8, at most MaxWorkers).
	Workers int
	// Capacity is each engine's KV cache size in blocks (default 4096). It must hold the
	// workload's longest request (Workload.MaxBlocks).
	Capacity int
	// ChunkTokens is the prefill chunk: each chunk emits one stored event (default 8192).
	ChunkTokens int
	// Seed seeds the random policy and the engines' NONE_HASH values.
	Seed uint64
	// Engine configures the index.
	Engine engine.Config
	// MeasureMemory forces two garbage collections at the end of the run to measure the
	// index's heap (IndexStats.HeapBytes and BytesPerMembership).
	MeasureMemory bool
	// Observer, when set, sees every query and event before the index does.
	Observer Observer
	// Progress, when set, is called now and then with the number of requests served
	// since its previous call; the calls of one run add up to the workload's length.
	Progress func(requests int)
	// EventDelay is how long after a request is served (simulated time) its events
	// reach the index. Default DefaultEventDelay; negative: at once (before the next
	// request is routed).
	EventDelay time.Duration
	// Rate spaces the arrivals of a workload without timestamps, in requests per
	// simulated second. Default DefaultRate.
	Rate float64
	// PredictionTTL is the lifetime of the predictions of kv-aware-predict and
	// approximate. Default: the event delay plus DefaultPredictionTTL, and
	// DefaultApproximateTTL.
	PredictionTTL time.Duration
	// HostCapacity gives every engine a host-memory tier of that many blocks (default 0:
	// none). A block the device evicts is offloaded there (a host-tier stored event; the
	// host evicts its least recently used block with a host-tier removed event), and a
	// request whose prefix continues on the host loads those blocks back instead of
	// recomputing them.
	HostCapacity int
	// HostLoadCost is the cost of loading a block from the host tier as a fraction of
	// recomputing it, in (0, 1] (default DefaultHostLoadCost): Result.PrefillTokens counts
	// a loaded token as that much of a computed one.
	HostLoadCost float64
	// TierWeights are longest-prefix/exact:weighted-tiers' (engine.Match.Weighted); the zero value means
	// engine.DefaultWeights.
	TierWeights engine.Weights

	// picked, when set (tests), hears each routing decision: request i went to worker
	// w. force, when set, makes them: request i goes to worker force[i] (Simulate
	// only).
	picked func(i, w int)
	force  []int
}

func (c Config) withDefaults() Config {
	if c.Workers == 0 {
		c.Workers = DefaultWorkers
	}
	if c.Capacity == 0 {
		c.Capacity = DefaultCapacity
	}
	if c.ChunkTokens == 0 {
		c.ChunkTokens = DefaultChunkTokens
	}
	if c.EventDelay == 0 {
		c.EventDelay = DefaultEventDelay
	}
	if c.Rate == 0 {
		c.Rate = DefaultRate
	}
	if c.HostLoadCost == 0 {
		c.HostLoadCost = DefaultHostLoadCost
	}
	if c.TierWeights == (engine.Weights{}) {
		c.TierWeights = engine.DefaultWeights
	}
	return c
}

// Check validates c, defaults filled in, against a workload.
func (c Config) Check(w *Workload) error {
	c = c.withDefaults()
	switch {
	case c.Workers < 1 || c.Workers > MaxWorkers:
		return fmt.Errorf("%w: %d workers, want 1..%d", ErrConfig, c.Workers, MaxWorkers)
	case c.Capacity < 1 || c.Capacity > MaxCapacity:
		return fmt.Errorf("%w: capacity %d blocks, want 1..%d", ErrConfig, c.Capacity, MaxCapacity)
	case int64(c.Workers)*int64(c.Capacity) > MaxFleetBlocks:
		return fmt.Errorf("%w: %d workers x %d blocks is more than %d blocks in all", ErrConfig, c.Workers, c.Capacity, MaxFleetBlocks)
	case c.HostCapacity < 0 || c.HostCapacity > MaxCapacity:
		return fmt.Errorf("%w: host capacity %d blocks, want 0..%d", ErrConfig, c.HostCapacity, MaxCapacity)
	case int64(c.Workers)*(int64(c.Capacity)+int64(c.HostCapacity)) > MaxFleetBlocks:
		return fmt.Errorf("%w: %d workers x (%d + %d host) blocks is more than %d blocks in all", ErrConfig, c.Workers, c.Capacity, c.HostCapacity, MaxFleetBlocks)
	case !(c.HostLoadCost > 0 && c.HostLoadCost <= 1):
		return fmt.Errorf("%w: host load cost %g, want (0, 1] (a fraction of recomputing)", ErrConfig, c.HostLoadCost)
	case c.TierWeights.Validate() != nil:
		return fmt.Errorf("%w: tier weights: %w", ErrConfig, c.TierWeights.Validate())
	case c.ChunkTokens < 1:
		return fmt.Errorf("%w: prefill chunk %d tokens, want >= 1", ErrConfig, c.ChunkTokens)
	case c.EventDelay > time.Hour || !(c.Rate > 0 && c.Rate <= 1e9):
		return fmt.Errorf("%w: event delay %v (at most 1h) or rate %g (want (0, 1e9])", ErrConfig, c.EventDelay, c.Rate)
	case c.PredictionTTL < 0 || c.PredictionTTL > engine.MaxPredictionTTL:
		return fmt.Errorf("%w: prediction TTL %v, want 0..%v", ErrConfig, c.PredictionTTL, engine.MaxPredictionTTL)
	case w.BlockSize < 1:
		return fmt.Errorf("%w: workload block size %d", ErrConfig, w.BlockSize)
	case c.Capacity < w.MaxBlocks:
		return fmt.Errorf("%w: capacity %d blocks per worker cannot hold the longest request (%d blocks of %d tokens)",
			ErrConfig, c.Capacity, w.MaxBlocks, w.BlockSize)
	}
	return nil
}

// Observer sees the simulated stream in order: a Query before each request with at least
// one full block is routed, then the events the chosen engine emits, each with its tier
// (always the device without Config.HostCapacity). Slices are only valid during the
// call. An error stops the run.
type Observer interface {
	Query(content []uint64) error
	Stored(worker string, tier engine.Tier, parent uint64, hasParent bool, blocks []engine.Block) error
	Removed(worker string, tier engine.Tier, seqs []uint64) error
}

// WorkerName names the i-th worker as a vLLM endpoint: http://10.0.0.1:8000, ...
func WorkerName(i int) string {
	return fmt.Sprintf("http://10.0.%d.%d:8000", i/250, i%250+1)
}

// Result is one policy's run over a workload.
type Result struct {
	Policy   Policy
	Requests int
	// HitBlocks of Blocks full request blocks were held by the chosen worker in device
	// memory when the request arrived (its longest cached prefix, by its own engine
	// hashes), and HostHitBlocks more extended that prefix from its host tier (0 without
	// Config.HostCapacity).
	HitBlocks, HostHitBlocks, Blocks int64
	// ReusedTokens of Tokens input tokens were not recomputed; LoadedTokens of them were
	// loaded from the host tier.
	ReusedTokens, LoadedTokens, Tokens int64
	// PrefillTokens is the prefill work in recomputed tokens: the tokens computed, plus
	// Config.HostLoadCost per token loaded from the host tier.
	PrefillTokens float64
	// Orphans counts the blocks the devices evicted but did not offload: no tier held
	// their parent any more (0 without a host tier).
	Orphans int64
	// Loads is the number of requests, and LoadTokens the prompt tokens, assigned to
	// each worker.
	Loads, LoadTokens []int64
	// Index describes the engine's side of the run.
	Index IndexStats
	// Seconds is the wall time of the whole run, simulation included.
	Seconds float64
}

// BlockHitRate is the prefix hit rate: HitBlocks / Blocks.
func (r Result) BlockHitRate() float64 { return ratio(r.HitBlocks, r.Blocks) }

// TokenHitRate is ReusedTokens / Tokens.
func (r Result) TokenHitRate() float64 { return ratio(r.ReusedTokens, r.Tokens) }

// HostHitRate is HostHitBlocks / Blocks: the hit rate the host tier adds.
func (r Result) HostHitRate() float64 { return ratio(r.HostHitBlocks, r.Blocks) }

// PrefillWork is PrefillTokens / Tokens: the prefill work left over that of a cold
// cache (1 - TokenHitRate without a host tier), the sim's proxy for prefill time.
func (r Result) PrefillWork() float64 {
	if r.Tokens == 0 {
		return 0
	}
	return r.PrefillTokens / float64(r.Tokens)
}

// MaxMeanLoad is the busiest worker's request count over the mean (1 is perfect).
func (r Result) MaxMeanLoad() float64 { return maxMean(r.Loads) }

// MaxMeanTokens is the busiest worker's prompt tokens over the mean.
func (r Result) MaxMeanTokens() float64 { return maxMean(r.LoadTokens) }

func maxMean(xs []int64) float64 {
	var m, t int64
	for _, x := range xs {
		m, t = max(m, x), t+x
	}
	if t == 0 {
		return 0
	}
	return float64(m) * float64(len(xs)) / float64(t)
}

// IndexStats describes the index during one run.
type IndexStats struct {
	// StoredEvents and RemovedEvents count the events sent; Events counts those the
	// engine accepted and Rejected those it refused (a parent it no longer holds: vLLM
	// can evict one copy of a hash it cached twice, see sim/README.md).
	StoredEvents, RemovedEvents, Rejected int64
	Events                                uint64
	// Queries counts FindMatches calls.
	Queries int64
	// QueryBlocks, StoredBlocks and RemovedBlocks are the block ops: query hashes,
	// stored blocks and removed hashes.
	QueryBlocks, StoredBlocks, RemovedBlocks int64
	// EngineSeconds is the time spent inside engine calls (events, Barrier, FindMatches).
	EngineSeconds float64
	// FindMatches latency percentiles in nanoseconds (0 without queries).
	FindMatchesP50, FindMatchesP99, FindMatchesP999 int64
	// Memberships is the sum of worker sizes (the index's (worker, engine hash) pairs)
	// at the end.
	Memberships int64
	// HeapBytes is the heap the engine held at the end (MeasureMemory only).
	HeapBytes int64
	// HostStoredEvents and HostRemovedEvents are the host-tier part of StoredEvents and
	// RemovedEvents, and HostMemberships the host-tier part of Memberships.
	HostStoredEvents, HostRemovedEvents, HostMemberships int64
}

// BlockOps is QueryBlocks + StoredBlocks + RemovedBlocks.
func (s IndexStats) BlockOps() int64 { return s.QueryBlocks + s.StoredBlocks + s.RemovedBlocks }

// BlockOpsPerS is BlockOps over EngineSeconds.
func (s IndexStats) BlockOpsPerS() float64 {
	if s.EngineSeconds <= 0 {
		return 0
	}
	return float64(s.BlockOps()) / s.EngineSeconds
}

// BytesPerMembership is HeapBytes / Memberships (0 when not measured).
func (s IndexStats) BytesPerMembership() float64 { return ratio(s.HeapBytes, s.Memberships) }

// driver forwards the fleet's events to the observer and the engine, timing the engine.
// With a delay, events wait in a queue (in emission order, so each worker's order holds)
// until the simulated clock passes their emission time plus the delay; with drop set
// (approximate) they never reach the index.
type driver struct {
	e     *engine.Engine
	obs   Observer
	st    *IndexStats
	spent time.Duration
	one   [1]uint64
	seqs  []uint64 // removeRun's
	// batch lets removeRun apply runs of removals with one call (Simulate's); merged
	// counts the events it folded into another's call.
	batch  bool
	merged int64
	ev     engine.Event // a tiered event's, reused

	delay time.Duration // <= 0: at once
	now   time.Duration // the simulated clock
	drop  bool
	queue []queued
	head  int
	// blocks holds the queued stored events' blocks, in queue order: one arena instead
	// of a copy per event, compacted with the queue.
	blocks []engine.Block
}

// queued is a delayed event: a stored event (blocks) or one removed seq.
type queued struct {
	at        time.Duration
	worker    string
	tier      engine.Tier
	parent    uint64
	hasParent bool
	stored    bool // else a removal of seq
	off, n    int  // a stored event's blocks: driver.blocks[off:off+n]
	seq       uint64
}

// emitter: the fleet's events enter here.
type delayed struct{ d *driver }

func (q delayed) stored(worker string, tier engine.Tier, parent uint64, hasParent bool, blocks []engine.Block) error {
	d := q.d
	switch {
	case d.drop:
		return nil
	case d.delay <= 0:
		return d.stored(worker, tier, parent, hasParent, blocks)
	}
	d.queue = append(d.queue, queued{at: d.now + d.delay, worker: worker, tier: tier, parent: parent, hasParent: hasParent,
		stored: true, off: len(d.blocks), n: len(blocks)})
	d.blocks = append(d.blocks, blocks...)
	return nil
}

func (q delayed) removed(worker string, tier engine.Tier, seq uint64) error {
	d := q.d
	switch {
	case d.drop:
		return nil
	case d.delay <= 0:
		return d.removed(worker, tier, seq)
	}
	d.queue = append(d.queue, queued{at: d.now + d.delay, worker: worker, tier: tier, seq: seq})
	return nil
}

// deliver applies the queued events due by the simulated time t (all of them when all
// is set).
func (d *driver) deliver(t time.Duration, all bool) error {
	for d.head < len(d.queue) && (all || d.queue[d.head].at <= t) {
		ev := &d.queue[d.head]
		var err error
		switch {
		case ev.stored:
			err = d.stored(ev.worker, ev.tier, ev.parent, ev.hasParent, d.blocks[ev.off:ev.off+ev.n:ev.off+ev.n])
		case d.batch && d.obs == nil && ev.tier == engine.TierDevice:
			if err := d.removeRun(t, all); err != nil {
				return err
			}
			continue
		default:
			err = d.removed(ev.worker, ev.tier, ev.seq)
		}
		if err != nil {
			return err
		}
		*ev = queued{}
		d.head++
	}
	if d.head > 4096 && d.head*2 > len(d.queue) {
		d.compact()
	}
	return nil
}

// compact drops the delivered events from the queue and their blocks from the arena:
// the blocks of the events left start at the first stored one's offset (offsets grow in
// queue order).
func (d *driver) compact() {
	d.queue = append(d.queue[:0], d.queue[d.head:]...)
	d.head = 0
	base := len(d.blocks)
	for i := range d.queue {
		if d.queue[i].stored {
			base = d.queue[i].off
			break
		}
	}
	d.blocks = append(d.blocks[:0], d.blocks[base:]...)
	for i := range d.queue {
		if d.queue[i].stored {
			d.queue[i].off -= base
		}
	}
}

func (d *driver) stored(worker string, tier engine.Tier, parent uint64, hasParent bool, blocks []engine.Block) error {
	if d.obs != nil {
		if err := d.obs.Stored(worker, tier, parent, hasParent, blocks); err != nil {
			return err
		}
	}
	t := time.Now()
	var err error
	switch {
	case tier != engine.TierDevice:
		d.ev = engine.Event{Kind: engine.EventStored, Worker: worker, Tier: tier, Parent: parent, HasParent: hasParent, Blocks: blocks}
		err = d.e.Apply(&d.ev)
		d.ev = engine.Event{}
		d.st.HostStoredEvents++
	case hasParent:
		err = d.e.StoreUnder(worker, parent, blocks)
	default:
		err = d.e.Store(worker, blocks)
	}
	d.spent += time.Since(t)
	d.st.StoredEvents++
	d.st.StoredBlocks += int64(len(blocks))
	if engine.IsRejection(err) {
		d.st.Rejected++
		return nil
	}
	return err
}

// removeRun applies the due device removals of one worker that follow each other in
// the queue from its head with one Remove call, as an ingester applies a batch: the
// index ends the same as with one call per event (each worker's order is kept), for a
// fraction of the calls. Without an Observer only: an Observer sees every event.
func (d *driver) removeRun(t time.Duration, all bool) error {
	worker := d.queue[d.head].worker
	d.seqs = d.seqs[:0]
	for d.head < len(d.queue) {
		ev := &d.queue[d.head]
		if ev.stored || ev.tier != engine.TierDevice || ev.worker != worker || !(all || ev.at <= t) {
			break
		}
		d.seqs = append(d.seqs, ev.seq)
		*ev = queued{}
		d.head++
	}
	start := time.Now()
	err := d.e.Remove(worker, d.seqs...)
	d.spent += time.Since(start)
	d.st.RemovedEvents += int64(len(d.seqs))
	d.st.RemovedBlocks += int64(len(d.seqs))
	d.merged += int64(len(d.seqs) - 1)
	return err
}

func (d *driver) removed(worker string, tier engine.Tier, seq uint64) error {
	d.one[0] = seq
	if d.obs != nil {
		if err := d.obs.Removed(worker, tier, d.one[:]); err != nil {
			return err
		}
	}
	t := time.Now()
	var err error
	if tier != engine.TierDevice {
		d.ev = engine.Event{Kind: engine.EventRemoved, Worker: worker, Tier: tier, Seqs: d.one[:]}
		err = d.e.Apply(&d.ev)
		d.ev = engine.Event{}
		d.st.HostRemovedEvents++
	} else {
		err = d.e.Remove(worker, d.one[:]...)
	}
	d.spent += time.Since(t)
	d.st.RemovedEvents++
	d.st.RemovedBlocks++
	return err
}

// Run simulates the cluster serving w under policy p, on a fresh engine and fresh mock
// engines, and returns what happened. It returns ctx's error if ctx ends first.
func Run(ctx context.Context, w *Workload, p Policy, cfg Config) (Result, error) {
	cfg = cfg.withDefaults()
	if err := cfg.Check(w); err != nil {
		return Result{}, err
	}
	if p < KVAware || p > KVAnyTier {
		return Result{}, fmt.Errorf("%w: %v", ErrConfig, p)
	}
	start := time.Now()
	// The index runs on the simulated clock, so predictions expire in simulated time.
	d := &driver{delay: cfg.EventDelay, drop: p == Approximate}
	ecfg := cfg.Engine
	epoch := time.Unix(0, 0)
	ecfg.Clock = func() time.Time { return epoch.Add(d.now) }
	ttl := cfg.PredictionTTL
	if ttl == 0 {
		// A prediction must outlive the delay it bridges.
		ttl = min(DefaultPredictionTTL+max(cfg.EventDelay, 0), engine.MaxPredictionTTL)
		if p == Approximate {
			ttl = DefaultApproximateTTL
		}
	}
	if p == Approximate && ecfg.PredictionsPerWorker == 0 {
		ecfg.PredictionsPerWorker = DefaultApproximatePredictions
	}
	e, err := engine.New(ecfg)
	if err != nil {
		return Result{}, fmt.Errorf("%w: %w", ErrConfig, err)
	}
	defer func() {
		if e != nil {
			e.Close()
		}
	}()

	fleet := make([]*mockEngine, cfg.Workers)
	byName := make(map[string]int, cfg.Workers)
	for i := range fleet {
		name := WorkerName(i)
		var seed [16]byte
		for j := range 8 {
			seed[j] = byte(cfg.Seed >> (8 * j))
			seed[8+j] = byte(uint64(i) >> (8 * j))
		}
		fleet[i] = newMockEngine(name, xxh3.HashSeed(seed[:], 0x6e6f6e65), cfg.Capacity, cfg.HostCapacity, w.BlockSize, cfg.ChunkTokens) // "none"
		byName[name] = i
	}
	rt := newRouter(p, cfg.Workers, cfg.Seed)
	res := Result{Policy: p}
	d.e, d.obs, d.st = e, cfg.Observer, &res.Index
	scores := make([]float64, cfg.Workers)
	var matches []engine.Match
	var lat []int64
	if p.queries() {
		lat = make([]int64, 0, len(w.Requests))
	}
	pending := 0
	for i := range w.Requests {
		if err := ctx.Err(); err != nil {
			return res, err
		}
		r := &w.Requests[i]
		// The clock moves to the request's arrival, and the events due by then arrive.
		if w.Timed {
			d.now = max(d.now, r.At)
		} else {
			d.now = time.Duration(float64(i) * float64(time.Second) / cfg.Rate)
		}
		if err := d.deliver(d.now, false); err != nil {
			return res, err
		}
		if len(r.Blocks) > 0 && cfg.Observer != nil {
			if err := cfg.Observer.Query(r.Blocks); err != nil {
				return res, err
			}
		}
		if p.queries() && len(r.Blocks) > 0 {
			clear(scores)
			t0 := time.Now()
			// The Barrier makes every earlier event visible, so routing is deterministic.
			if err := e.Barrier(ctx); err != nil {
				return res, err
			}
			t1 := time.Now()
			matches, err = e.FindMatches(ctx, r.Blocks, matches[:0])
			t2 := time.Now()
			if err != nil {
				return res, err
			}
			d.spent += t2.Sub(t0)
			lat = append(lat, t2.Sub(t1).Nanoseconds())
			res.Index.Queries++
			res.Index.QueryBlocks += int64(len(r.Blocks))
			for i := range matches {
				if j, ok := byName[matches[i].Worker]; ok {
					scores[j] = p.score(&matches[i], cfg.TierWeights)
				}
			}
		}
		wi := rt.pick(scores, r.Tokens)
		if cfg.picked != nil {
			cfg.picked(i, wi)
		}
		if p.predicts() && len(r.Blocks) > 0 {
			t := time.Now()
			if err := e.Predict(ctx, fleet[wi].name, "", r.Blocks, ttl); err != nil {
				return res, err
			}
			d.spent += time.Since(t)
		}
		out, err := fleet[wi].serve(r, delayed{d})
		if err != nil {
			return res, err
		}
		res.Requests++
		res.HitBlocks += int64(out.hit)
		res.HostHitBlocks += int64(out.hostHit)
		res.Blocks += int64(len(r.Blocks))
		res.ReusedTokens += int64(out.reused * w.BlockSize)
		res.LoadedTokens += int64(out.loaded * w.BlockSize)
		res.Tokens += int64(r.Tokens)
		if pending++; cfg.Progress != nil && pending == 64 {
			cfg.Progress(pending)
			pending = 0
		}
	}
	if err := d.deliver(0, true); err != nil {
		return res, err
	}
	t := time.Now()
	if err := e.Barrier(ctx); err != nil {
		return res, err
	}
	d.spent += time.Since(t)
	if cfg.Progress != nil && pending > 0 {
		cfg.Progress(pending)
	}
	// Prefill work: the tokens computed, and the loaded ones at their cost. Summed
	// once, in integers first, so that it does not depend on float rounding order.
	res.PrefillTokens = float64(res.Tokens-res.ReusedTokens) + cfg.HostLoadCost*float64(res.LoadedTokens)
	for _, m := range fleet {
		res.Orphans += m.orphans
	}
	st := e.Stats()
	res.Index.HostMemberships = st.TierBlocks[engine.TierHost]
	res.Loads = slices.Clone(rt.loads)
	res.LoadTokens = slices.Clone(rt.tokens)
	res.Index.Events = st.Events
	res.Index.Memberships = st.Blocks
	res.Index.EngineSeconds = d.spent.Seconds()
	res.Index.FindMatchesP50 = replay.Percentile(lat, 0.50)
	res.Index.FindMatchesP99 = replay.Percentile(lat, 0.99)
	res.Index.FindMatchesP999 = replay.Percentile(lat, 0.999)
	if cfg.MeasureMemory {
		// The heap with the engine minus the heap without it: everything else (the
		// workload, the fleet) is alive in both readings.
		var with, without runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&with)
		e.Close()
		e, d.e = nil, nil
		runtime.GC()
		runtime.ReadMemStats(&without)
		res.Index.HeapBytes = int64(with.HeapAlloc) - int64(without.HeapAlloc)
		runtime.KeepAlive(fleet)
		runtime.KeepAlive(w)
	}
	res.Seconds = time.Since(start).Seconds()
	return res, nil
}
