package route

import (
	"errors"
	"fmt"
	"sync"
	"time"
)

// Tracker defaults and bounds.
const (
	DefaultMaxInFlight = 1 << 20
	MaxInFlight        = 1 << 24
	// DefaultTrackerTTL is how long a request stays counted without a Finished: a
	// router that loses a report (a crashed client, a dropped stream) must not count the
	// request against its worker forever.
	DefaultTrackerTTL = 10 * time.Minute
	// MaxRequestBlocks bounds the block hashes Routed takes of one request.
	MaxRequestBlocks = 1 << 20
	// DefaultMaxBlocks bounds the block hashes kept across every request in flight:
	// each costs about TrackedBlockBytes (its copy in the request and its share of the
	// worker's refcount map), so the default keeps the tracker's hashes near 40 MiB.
	DefaultMaxBlocks = 1 << 20
	// MaxBlocks is the largest MaxBlocks a TrackerConfig may set.
	MaxBlocks = 1 << 28
	// TrackedBlockBytes is what one kept block hash costs, measured: 38,929 bytes for
	// a request of 1,024 hashes, rounded up.
	TrackedBlockBytes = 40
)

// ErrFull is returned by Routed when MaxInFlight requests are in flight.
var ErrFull = errors.New("route: tracker full")

// ErrDuplicate is returned by Routed for an id already in flight.
var ErrDuplicate = errors.New("route: request already routed")

// TrackerConfig configures a Tracker. The zero value of every field means its default.
type TrackerConfig struct {
	// MaxInFlight bounds the requests tracked at once (default DefaultMaxInFlight, at
	// most MaxInFlight).
	MaxInFlight int
	// TTL drops a request that has had no Finished for this long (default
	// DefaultTrackerTTL).
	TTL time.Duration
	// Capacity, when > 0, is a worker's KV cache in blocks: Load then estimates
	// KVUtil as ActiveBlocks / Capacity (default 0: KVUtil stays 0 unless the
	// caller lays the engine's own figure over it).
	Capacity int64
	// Now is the clock (default time.Now); the simulator passes its simulated one.
	Now func() time.Time
	// MaxBlocks bounds the block hashes kept across the requests in flight (default
	// DefaultMaxBlocks, at most MaxBlocks). A request routed past it is counted by its
	// number of blocks instead of its hashes: its load still counts, but its blocks
	// are not shared with other requests' in ActiveBlocks until hashes fit again.
	MaxBlocks int
	// TrackOutputBlocks counts the blocks a request generates (Generated) in its
	// worker's ActiveBlocks, each a block of its own: Dynamo's
	// router_track_output_blocks, off by default as Dynamo ships it
	// (ai-dynamo/dynamo lib/kv-router/src/scheduling/config.rs; the blocks are added by
	// ActiveSequences::add_output_block in lib/kv-router/src/sequences/single.rs, with
	// random hashes, so never shared). Off, Generated changes nothing.
	TrackOutputBlocks bool
}

// Tracker is the load a router knows from its own decisions: per worker, the requests
// it routed there and has not seen finish, and the distinct KV blocks they hold. It
// is safe for concurrent use.
//
// A request's life: Routed (its prompt, its block hashes, the tokens the router
// expects cached) counts it in Requests, Tokens, UncachedTokens, PrefillTokens,
// Prefilling and, per distinct block hash, ActiveBlocks; FirstToken takes it out of
// PrefillTokens and Prefilling; Finished (or the TTL) takes the rest out. Reports for
// unknown ids are ignored (reported false), so a late or repeated report is
// harmless. Active blocks are refcounted by hash per worker, as Dynamo's
// ActiveSequences counts them (ai-dynamo/dynamo lib/llm/src/kv_router/sequences/
// single.rs): a block shared by ten requests in flight is one block.
//
// On its own a Tracker yields every input the policies read: Load's Waiting is
// estimated as the requests with no first token yet, and KVUtil, with a Capacity, as
// the active blocks' share of it. A router that scrapes the engines lays their figures
// over these (Load.Override).
type Tracker[K comparable] struct {
	cfg TrackerConfig

	mu       sync.Mutex
	workers  map[string]*workerState // guarded by mu
	inflight map[K]*tracked          // guarded by mu
	// order holds the in-flight requests by routing time, for the TTL; an entry whose
	// request finished stays until it reaches the head (gen tells them apart).
	order []orderEntry[K] // guarded by mu
	head  int             // guarded by mu
	gen   uint64          // guarded by mu
	kept  int             // block hashes kept by the requests in flight; guarded by mu
	// onDrop is OnDrop's callback (nil: none); set before the Tracker is shared.
	onDrop func(id K, worker string, blocks int64)
}

// OnDrop makes the Tracker call f with each request that stops counting (Finished, or
// the TTL), its worker and its blocks. f runs under the Tracker's lock and must not
// call it. A caller that bounds what each of its clients has in flight gives the
// client's share back there. Call it before the Tracker is shared.
func (t *Tracker[K]) OnDrop(f func(id K, worker string, blocks int64)) { t.onDrop = f }

// workerState is one worker's load and its active blocks' refcounts.
type workerState struct {
	load   Load
	blocks map[uint64]int32 // distinct active block hash -> requests holding it
	anon   int64            // blocks of the requests routed without hashes
	out    int64            // output blocks of the requests in flight (TrackOutputBlocks)
}

// active is the worker's distinct active blocks.
func (w *workerState) active() int64 { return int64(len(w.blocks)) + w.anon + w.out }

type tracked struct {
	worker   *workerState
	name     string
	tokens   int64
	uncached int64
	prefill  int64 // 0 once the first token came
	filling  bool  // no first token yet
	hashes   []uint64
	anon     int64
	out      int64 // output blocks counted (TrackOutputBlocks)
	bs       int   // the request's block size
	gen      uint64
}

type orderEntry[K comparable] struct {
	id  K
	at  time.Time
	gen uint64
}

// NewTracker returns an empty Tracker.
func NewTracker[K comparable](cfg TrackerConfig) (*Tracker[K], error) {
	if cfg.MaxInFlight == 0 {
		cfg.MaxInFlight = DefaultMaxInFlight
	}
	if cfg.TTL == 0 {
		cfg.TTL = DefaultTrackerTTL
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.MaxBlocks == 0 {
		cfg.MaxBlocks = DefaultMaxBlocks
	}
	switch {
	case cfg.MaxInFlight < 1 || cfg.MaxInFlight > MaxInFlight:
		return nil, fmt.Errorf("%w: tracker max in flight %d, want 1..%d", ErrConfig, cfg.MaxInFlight, MaxInFlight)
	case cfg.TTL < 0:
		return nil, fmt.Errorf("%w: tracker TTL %v, want > 0", ErrConfig, cfg.TTL)
	case cfg.MaxBlocks < 1 || cfg.MaxBlocks > MaxBlocks:
		return nil, fmt.Errorf("%w: tracker max blocks %d, want 1..%d", ErrConfig, cfg.MaxBlocks, MaxBlocks)
	case cfg.Capacity < 0:
		return nil, fmt.Errorf("%w: tracker capacity %d blocks, want >= 0", ErrConfig, cfg.Capacity)
	}
	return &Tracker[K]{cfg: cfg, workers: map[string]*workerState{}, inflight: map[K]*tracked{}}, nil
}

// Routed counts request id, req (its prompt tokens and, when known, block hashes) of
// which cached tokens were expected cached, against worker. It returns ErrDuplicate
// for an id in flight, ErrFull when MaxInFlight requests are, and ErrConfig for
// negative lengths, a block size < 1 or more than MaxRequestBlocks hashes.
func (t *Tracker[K]) Routed(id K, worker string, req Request, cached int) error {
	if req.Tokens < 0 || cached < 0 || req.BlockSize < 1 || len(req.Blocks) > MaxRequestBlocks {
		return fmt.Errorf("%w: routed %d tokens (%d block hashes), %d cached, block size %d",
			ErrConfig, req.Tokens, len(req.Blocks), cached, req.BlockSize)
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	now := t.cfg.Now()
	t.expireLocked(now)
	if _, ok := t.inflight[id]; ok {
		return ErrDuplicate
	}
	if len(t.inflight) >= t.cfg.MaxInFlight {
		return ErrFull
	}
	w := t.workers[worker]
	if w == nil {
		w = &workerState{blocks: map[uint64]int32{}}
		t.workers[worker] = w
	}
	t.gen++
	uncached := int64(max(req.Tokens-min(cached, req.Tokens), 0))
	r := &tracked{worker: w, name: worker, tokens: int64(req.Tokens), uncached: uncached, prefill: uncached,
		filling: true, bs: req.BlockSize, gen: t.gen}
	if len(req.Blocks) > 0 && t.kept+len(req.Blocks) <= t.cfg.MaxBlocks {
		r.hashes = append([]uint64(nil), req.Blocks...)
		t.kept += len(r.hashes)
		for _, h := range r.hashes {
			w.blocks[h]++
		}
	} else {
		r.anon = req.blocks()
		w.anon += r.anon
	}
	t.inflight[id] = r
	t.order = append(t.order, orderEntry[K]{id: id, at: now, gen: t.gen})
	l := &w.load
	l.Requests++
	l.Prefilling++
	l.Tokens += r.tokens
	l.UncachedTokens += r.uncached
	l.PrefillTokens += r.prefill
	l.ActiveBlocks = w.active()
	return nil
}

// FirstToken says request id has its first token: its prefill is done. It reports
// whether the id was in flight with its prefill outstanding.
func (t *Tracker[K]) FirstToken(id K) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	r := t.liveLocked(id)
	if r == nil || !r.filling {
		return false
	}
	l := &r.worker.load
	l.PrefillTokens -= r.prefill
	l.Prefilling--
	r.prefill, r.filling = 0, false
	return true
}

// Generated says request id has generated tokens output tokens in all so far. With
// TrackOutputBlocks, the blocks its sequence has completed past its prompt's full
// blocks, (prompt + tokens) / block size - prompt / block size, count in its worker's
// ActiveBlocks, each a block of its own, until Finished. It reports whether the id
// was in flight; without TrackOutputBlocks it changes nothing. A count lower than an
// earlier one is ignored: output only grows.
func (t *Tracker[K]) Generated(id K, tokens int) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	r := t.liveLocked(id)
	if r == nil {
		return false
	}
	if !t.cfg.TrackOutputBlocks || tokens <= 0 {
		return true
	}
	bs := int64(r.bs)
	out := (r.tokens+int64(tokens))/bs - r.tokens/bs
	if out <= r.out {
		return true
	}
	w := r.worker
	w.out += out - r.out
	r.out = out
	w.load.ActiveBlocks = w.active()
	return true
}

// Finished says request id is done (or failed): it no longer counts. It reports
// whether the id was in flight.
func (t *Tracker[K]) Finished(id K) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	r := t.liveLocked(id)
	if r == nil {
		return false
	}
	t.dropLocked(id, r)
	return true
}

// liveLocked expires what the TTL drops, then returns request id, nil when not in
// flight.
func (t *Tracker[K]) liveLocked(id K) *tracked {
	t.expireLocked(t.cfg.Now())
	return t.inflight[id]
}

func (t *Tracker[K]) dropLocked(id K, r *tracked) {
	w := r.worker
	l := &w.load
	l.Requests--
	l.Tokens -= r.tokens
	l.UncachedTokens -= r.uncached
	l.PrefillTokens -= r.prefill
	if r.filling {
		l.Prefilling--
	}
	for _, h := range r.hashes {
		if n := w.blocks[h] - 1; n > 0 {
			w.blocks[h] = n
		} else {
			delete(w.blocks, h)
		}
	}
	w.anon -= r.anon
	w.out -= r.out
	t.kept -= len(r.hashes)
	l.ActiveBlocks = w.active()
	delete(t.inflight, id)
	if t.onDrop != nil {
		t.onDrop(id, r.name, int64(len(r.hashes))+r.anon)
	}
	if l.Requests == 0 {
		delete(t.workers, r.name)
	}
}

// expireLocked drops the requests routed more than TTL before now, and compacts the
// order queue.
func (t *Tracker[K]) expireLocked(now time.Time) {
	for t.head < len(t.order) {
		e := t.order[t.head]
		r := t.inflight[e.id]
		if r != nil && r.gen == e.gen {
			if now.Sub(e.at) < t.cfg.TTL {
				break
			}
			t.dropLocked(e.id, r)
		}
		t.order[t.head] = orderEntry[K]{}
		t.head++
	}
	switch {
	case len(t.order)-t.head >= 2*t.cfg.MaxInFlight:
		// Mostly finished requests behind a long-running head: keep the live ones
		// only, so the queue stays within twice the in-flight bound.
		live := t.order[:0]
		for _, e := range t.order[t.head:] {
			if r := t.inflight[e.id]; r != nil && r.gen == e.gen {
				live = append(live, e)
			}
		}
		clear(t.order[len(live):])
		t.order, t.head = live, 0
	case t.head > 1024 && t.head*2 > len(t.order):
		n := copy(t.order, t.order[t.head:])
		clear(t.order[n:])
		t.order, t.head = t.order[:n], 0
	}
}

// estimateLocked is w's load with the Tracker's own estimates of Waiting and KVUtil.
func (t *Tracker[K]) estimateLocked(w *workerState) Load {
	if w == nil {
		return Load{}
	}
	l := w.load
	l.Waiting = l.Prefilling
	if t.cfg.Capacity > 0 {
		l.KVUtil = min(float64(l.ActiveBlocks)/float64(t.cfg.Capacity), 1)
	}
	return l
}

// Load returns what the tracker knows of worker's load (the zero Load for a worker
// with nothing in flight), Waiting and KVUtil estimated (see Tracker).
func (t *Tracker[K]) Load(worker string) Load {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.expireLocked(t.cfg.Now())
	return t.estimateLocked(t.workers[worker])
}

// Candidates fills dst (grown when short) with one Candidate per worker: its load as
// Load returns it, overlaps[i] as its Overlap (none when overlaps is nil), and how
// many of req.Blocks are active on it (ActiveOverlap), under one lock.
func (t *Tracker[K]) Candidates(workers []string, req Request, overlaps []int, dst []Candidate) []Candidate {
	dst = append(dst[:0], make([]Candidate, len(workers))...)
	t.mu.Lock()
	defer t.mu.Unlock()
	t.expireLocked(t.cfg.Now())
	for i, name := range workers {
		c := &dst[i]
		if overlaps != nil {
			c.Overlap = overlaps[i]
		}
		w := t.workers[name]
		if w == nil {
			continue
		}
		c.Load = t.estimateLocked(w)
		// The hashes are chained (Request.Blocks) and Routed keeps all of a request's
		// or none, so a worker's active blocks of req are a prefix of it: the count
		// stops at the first block not active there.
		for _, h := range req.Blocks {
			if w.blocks[h] == 0 {
				break
			}
			c.ActiveOverlap++
		}
	}
	return dst
}

// KeptBlocks returns the block hashes kept by the requests in flight (at most
// TrackerConfig.MaxBlocks).
func (t *Tracker[K]) KeptBlocks() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.expireLocked(t.cfg.Now())
	return t.kept
}

// InFlight returns the number of requests tracked.
func (t *Tracker[K]) InFlight() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.expireLocked(t.cfg.Now())
	return len(t.inflight)
}

// Metrics are a worker's own reports, which override a Tracker's estimates.
type Metrics struct {
	// Waiting is the requests queued at the worker (vLLM's num_requests_waiting).
	Waiting int
	// KVUtil is its KV cache use in [0, 1] (vLLM's kv_cache_usage_perc).
	KVUtil float64
}

// Override lays the worker's own metrics over l's estimates.
func (l *Load) Override(m Metrics) {
	l.Waiting, l.KVUtil = m.Waiting, min(max(m.KVUtil, 0), 1)
}
