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
	// Now is the clock (default time.Now); the simulator passes its simulated one.
	Now func() time.Time
}

// Tracker is the load a router knows from its own decisions: per worker, the requests
// it routed there and has not seen finish. It is safe for concurrent use.
//
// A request's life: Routed (its prompt tokens, the tokens the router expects cached,
// the block size) counts it in Requests, Tokens, PrefillTokens and ActiveBlocks;
// FirstToken takes its prefill out of PrefillTokens; Finished (or the TTL) takes the
// rest out. Reports for unknown ids are ignored (reported false), so a late or
// repeated report is harmless.
type Tracker[K comparable] struct {
	cfg TrackerConfig

	mu       sync.Mutex
	workers  map[string]*Load // guarded by mu
	inflight map[K]*tracked   // guarded by mu
	// order holds the in-flight requests by routing time, for the TTL; an entry whose
	// request finished stays until it reaches the head (gen tells them apart).
	order []orderEntry[K] // guarded by mu
	head  int             // guarded by mu
	gen   uint64          // guarded by mu
}

type tracked struct {
	worker  *Load
	name    string
	tokens  int64
	prefill int64 // 0 once the first token came
	blocks  int64
	gen     uint64
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
	switch {
	case cfg.MaxInFlight < 1 || cfg.MaxInFlight > MaxInFlight:
		return nil, fmt.Errorf("%w: tracker max in flight %d, want 1..%d", ErrConfig, cfg.MaxInFlight, MaxInFlight)
	case cfg.TTL < 0:
		return nil, fmt.Errorf("%w: tracker TTL %v, want > 0", ErrConfig, cfg.TTL)
	}
	return &Tracker[K]{cfg: cfg, workers: map[string]*Load{}, inflight: map[K]*tracked{}}, nil
}

// Routed counts request id, of tokens prompt tokens of which cached were expected
// cached, against worker. It returns ErrDuplicate for an id in flight, ErrFull when
// MaxInFlight requests are, and ErrConfig for negative lengths or a block size < 1.
func (t *Tracker[K]) Routed(id K, worker string, tokens, cached, blockSize int) error {
	if tokens < 0 || cached < 0 || blockSize < 1 {
		return fmt.Errorf("%w: routed %d tokens, %d cached, block size %d", ErrConfig, tokens, cached, blockSize)
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
		w = &Load{}
		t.workers[worker] = w
	}
	t.gen++
	r := &tracked{worker: w, name: worker, tokens: int64(tokens), prefill: int64(max(tokens-min(cached, tokens), 0)),
		blocks: int64((tokens + blockSize - 1) / blockSize), gen: t.gen}
	t.inflight[id] = r
	t.order = append(t.order, orderEntry[K]{id: id, at: now, gen: t.gen})
	w.Requests++
	w.Tokens += r.tokens
	w.PrefillTokens += r.prefill
	w.ActiveBlocks += r.blocks
	return nil
}

// FirstToken says request id has its first token: its prefill is done. It reports
// whether the id was in flight with its prefill outstanding.
func (t *Tracker[K]) FirstToken(id K) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.expireLocked(t.cfg.Now())
	r := t.inflight[id]
	if r == nil || r.prefill == 0 {
		return false
	}
	r.worker.PrefillTokens -= r.prefill
	r.prefill = 0
	return true
}

// Finished says request id is done (or failed): it no longer counts. It reports
// whether the id was in flight.
func (t *Tracker[K]) Finished(id K) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.expireLocked(t.cfg.Now())
	r := t.inflight[id]
	if r == nil {
		return false
	}
	t.dropLocked(id, r)
	return true
}

func (t *Tracker[K]) dropLocked(id K, r *tracked) {
	w := r.worker
	w.Requests--
	w.Tokens -= r.tokens
	w.PrefillTokens -= r.prefill
	w.ActiveBlocks -= r.blocks
	delete(t.inflight, id)
	if w.Requests == 0 {
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

// Load returns what the tracker knows of worker's load (the zero Load for a worker
// with nothing in flight). Waiting and KVUtil are always zero: they are the worker's
// own reports, which a Tracker does not see.
func (t *Tracker[K]) Load(worker string) Load {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.expireLocked(t.cfg.Now())
	if w := t.workers[worker]; w != nil {
		return *w
	}
	return Load{}
}

// InFlight returns the number of requests tracked.
func (t *Tracker[K]) InFlight() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.expireLocked(t.cfg.Now())
	return len(t.inflight)
}
