package server

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvindex/kvindex/engine"
	"github.com/kvindex/kvindex/subscriber"
)

// Trust states: how far the index can vouch for a worker's blocks, and so where its
// score comes from (docs/serve.md, "Trust states", is the contract):
//
//   - exact: the worker's stream is healthy (subscriber live, no trust problem). Its
//     score is the index's (with the router's predictions filling in until its events
//     arrive, as always: Match.Predicted says how much).
//   - degraded: the stream delivers, but the index holds only part of the worker's
//     blocks: the subscriber is stale (history that could not be replayed), or its
//     stores are being rejected (parent_not_found, block_size_mismatch). What the
//     index holds the worker does hold, so its score is the index merged with the
//     predictions (the larger of the two, per block): a lower bound, and said so.
//   - approximate: the index cannot vouch for the worker at all: it publishes no
//     events (an engine without an endpoint, or no_events), its events stopped while it
//     serves (events_stopped), its block hashes do not follow from its tokens
//     (hash_mismatch: the index keys its blocks by inputs the engine did not cache
//     under), or there is no usable stream (connecting, syncing, disconnected). Its
//     score is its predictions alone (engine.PredictedIn): the index's blocks for it,
//     which may be long gone from the engine, count for nothing, and a worker with no
//     live prediction sharing the query's first block drops out of the matches.
//
// A worker returns to exact as soon as what lowered it is over: its subscriber is live
// again (a resync after a gap, a reconnection) and the problem has left the
// diagnostics' window (subscriber.Problems: an event arrives for no_events and
// events_stopped; a window without a mismatch or a rejected store for the rates).
//
// Ownership: the subscribers' states are read at each answer (one atomic load each);
// the problems, which take a status copy and the window arithmetic, are diagnosed by
// the trust loop every Trust.Interval into a copy-on-write map of the workers they
// lower (empty in a healthy fleet), which answers read with one atomic load.

// trust is a trust state; a larger value trusts the index less.
type trust uint8

const (
	trustExact trust = iota
	trustDegraded
	trustApproximate
	numTrust
)

// The trust states' names, as answers and metrics give them.
const (
	TrustExact       = "exact"
	TrustDegraded    = "degraded"
	TrustApproximate = "approximate"
)

var trustNames = [numTrust]string{TrustExact, TrustDegraded, TrustApproximate}

func (t trust) String() string { return trustNames[t] }

// TrustStates lists the trust states, most trusted first.
func TrustStates() []string { return slices.Clone(trustNames[:]) }

// Trust defaults and bounds.
const (
	DefaultTrustInterval = time.Second
	MinTrustInterval     = 10 * time.Millisecond
	MaxTrustInterval     = time.Minute
)

// TrustConfig configures the automatic fallback from the index to the router's
// predictions for workers whose events cannot be trusted (trust.go). On by default:
// a worker the diagnostics say the index cannot vouch for is otherwise scored from a
// state known to be wrong, and the thresholds behind those diagnoses are minutes long
// (no_events_after 2m, idle_after 5m, the rates over a 1m window), so a healthy fleet
// never sees it; the states are reported either way.
type TrustConfig struct {
	// Off scores every worker from the index, whatever its trust state: matches then
	// say "exact" for every worker with a stream ("approximate" still for engines
	// without events, which the index knows only through predictions), while
	// /v1/workers and kvindex_worker_trust keep reporting the diagnosed states.
	Off bool `json:"off,omitempty"`
	// Interval is how often the workers' problems are diagnosed for their trust state.
	// Default 1s; 10ms..1m.
	Interval Duration `json:"interval,omitempty"`
}

func (c TrustConfig) interval() time.Duration {
	if c.Interval == 0 {
		return DefaultTrustInterval
	}
	return time.Duration(c.Interval)
}

func (c TrustConfig) validate() error {
	if d := c.interval(); d < MinTrustInterval || d > MaxTrustInterval {
		return fmt.Errorf("%w: trust.interval %v: want %v..%v", ErrConfig, d, MinTrustInterval, MaxTrustInterval)
	}
	return nil
}

// problemTrust is the trust a diagnosed problem leaves a worker: approximate for the
// problems under which the index may credit the worker with blocks it does not hold
// (or holds under other keys), degraded for those under which it only misses some.
func problemTrust(code string) trust {
	switch code {
	case subscriber.ProblemNoEvents, subscriber.ProblemEventsStopped, subscriber.ProblemHashMismatch:
		return trustApproximate
	case subscriber.ProblemParentMiss, subscriber.ProblemBlockSize:
		return trustDegraded
	}
	return trustExact
}

// stateTrust is the trust a subscriber state leaves a worker.
func stateTrust(st subscriber.State) trust {
	switch st {
	case subscriber.StateLive:
		return trustExact
	case subscriber.StateStale:
		return trustDegraded
	}
	return trustApproximate
}

// trustTable is the server's trust bookkeeping.
type trustTable struct {
	// lowered maps each subscribed worker whose problems lower its trust to that trust
	// (no entry: exact). Written by refresh, copied on write; never nil once New
	// returns.
	lowered atomic.Pointer[map[string]trust]
	// fallback counts the matches scored from predictions, by trust state
	// (kvindex_trust_fallback_matches_total).
	fallback [numTrust]prometheus.Counter
	// off is Config.Trust.Off, set by New (tests flip it between answers).
	off atomic.Bool
	// mu serialises refresh (the trust loop's, and tests').
	mu sync.Mutex
}

// preds pools PredictedIn's answers: only answers with a worker below exact take one.
var preds = sync.Pool{New: func() any { s := make([]engine.WorkerPrediction, 0, 16); return &s }}

func (s *Server) initTrust() *prometheus.CounterVec {
	empty := map[string]trust{}
	s.trust.lowered.Store(&empty)
	s.trust.off.Store(s.cfg.Trust.Off)
	v := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "kvindex_trust_fallback_matches_total",
		Help: "Matches answered for workers below exact trust, by the state their score came from (degraded: the index merged with predictions; approximate: predictions alone).",
	}, []string{"trust"})
	for t := range numTrust {
		s.trust.fallback[t] = v.WithLabelValues(t.String())
	}
	return v
}

// trustOf is worker's diagnosed trust state in fleet f, lowered by the problems in
// lowered.
func trustOf(f *fleet, lowered map[string]trust, worker string) trust {
	return f.lookup(worker).trust(lowered, worker)
}

// trust is the worker's diagnosed trust state (its id is worker), lowered by the
// problems in lowered.
func (fw fleetWorker) trust(lowered map[string]trust, worker string) trust {
	if fw.sub != nil {
		return max(stateTrust(fw.sub.State()), lowered[worker])
	}
	if fw.approx != nil {
		return trustApproximate // no events: predictions are all the index knows of it
	}
	return trustExact // fed by another process (a relay), which vouches for its stream
}

// scoredTrust is the trust state the score of worker fw (its id is worker) comes from:
// its diagnosed one, or exact for a worker with a stream when the fallback is off.
func (s *Server) scoredTrust(fw fleetWorker, lowered map[string]trust, worker string) trust {
	if s.trust.off.Load() && fw.approx == nil {
		return trustExact
	}
	return fw.trust(lowered, worker)
}

// trustScorer rescores one answer's matches by their workers' trust states.
type trustScorer struct {
	s        *Server
	f        *fleet
	lowered  map[string]trust
	ns       string
	q        []uint64
	byPrefix bool                       // q holds prefix hashes (Mooncake's rolling hashes)
	preds    *[]engine.WorkerPrediction // nil until a worker needs its predictions
}

func (s *Server) newTrustScorer(f *fleet, ns string, q []uint64) trustScorer {
	return trustScorer{s: s, f: f, lowered: *s.trust.lowered.Load(), ns: ns, q: q}
}

// rescore sets m to what its worker's trust state t scores it: unchanged for exact and
// degraded (the engine's answer merges the index with the predictions), the predicted
// length alone for approximate. keep is false when nothing is left of it.
func (ts *trustScorer) rescore(m *engine.Match, t trust) (keep bool) {
	if t != trustApproximate {
		return true
	}
	p := ts.predicted(m.Worker)
	if p == 0 {
		return false
	}
	m.Score, m.Predicted, m.Tiers = p, p, [engine.NumTiers]int{p, p, p} // predicted blocks are device blocks
	return true
}

// predicted is worker's predicted length for the query, asking the engine once per
// answer.
func (ts *trustScorer) predicted(worker string) int {
	if ts.preds == nil {
		ts.preds = preds.Get().(*[]engine.WorkerPrediction)
		predicted := ts.s.eng.PredictedIn
		if ts.byPrefix {
			predicted = ts.s.eng.PredictedByPrefixIn
		}
		ps := predicted(ts.ns, ts.q, (*ts.preds)[:0])
		slices.SortFunc(ps, func(a, b engine.WorkerPrediction) int { return strings.Compare(a.Worker, b.Worker) })
		*ts.preds = ps
	}
	ps := *ts.preds
	if i, ok := slices.BinarySearchFunc(ps, worker, func(p engine.WorkerPrediction, w string) int { return strings.Compare(p.Worker, w) }); ok {
		return ps[i].Blocks
	}
	return 0
}

// done gives the scorer's scratch back.
func (ts *trustScorer) done() {
	if ts.preds != nil && cap(*ts.preds) <= 1<<12 {
		preds.Put(ts.preds)
	}
	ts.preds = nil
}

// trustFound rescores an engine answer in place by its workers' trust states (the
// Mooncake API's, which folds matches into instances without naming their states) and
// returns what is left of it. With byPrefix, q holds the query's prefix hashes.
func (s *Server) trustFound(ns string, q []uint64, byPrefix bool, found []engine.Match) []engine.Match {
	f := s.fleet()
	ts := s.newTrustScorer(f, ns, q)
	ts.byPrefix = byPrefix
	defer ts.done()
	out := found[:0]
	for _, m := range found {
		t := s.scoredTrust(f.lookup(m.Worker), ts.lowered, m.Worker)
		if !ts.rescore(&m, t) {
			continue
		}
		if t != trustExact {
			s.trust.fallback[t].Inc()
		}
		out = append(out, m)
	}
	return out
}

// refreshTrust diagnoses every subscribed worker's problems as of now and publishes
// the workers they lower; a change of a worker's problem trust is logged (the
// subscribers log their own state changes). The trust loop calls it every
// Trust.Interval; tests call it with their own clock.
func (s *Server) refreshTrust(now time.Time) {
	s.trust.mu.Lock()
	defer s.trust.mu.Unlock()
	old := *s.trust.lowered.Load()
	next := map[string]trust{}
	var codes []string
	for _, sub := range s.fleet().subs.All() {
		t := trustExact
		codes = codes[:0]
		for _, p := range sub.Problems(now) {
			if pt := problemTrust(p.Code); pt > trustExact {
				t = max(t, pt)
				codes = append(codes, p.Code)
			}
		}
		w := sub.Worker()
		if t > trustExact {
			next[w] = t
		}
		switch was := old[w]; {
		case t > was:
			s.log.Warn("worker scored from predictions, not its events", "worker", w, "model", sub.Model(), "trust", t.String(), "problems", strings.Join(codes, ","))
		case t < was && t == trustExact:
			s.log.Info("worker's events trusted again", "worker", w, "model", sub.Model(), "trust", t.String())
		case t < was:
			s.log.Info("worker's trust raised", "worker", w, "model", sub.Model(), "trust", t.String(), "problems", strings.Join(codes, ","))
		}
	}
	if !maps.Equal(old, next) {
		s.trust.lowered.Store(&next)
	}
}

// trustLoop refreshes the trust states every Trust.Interval until stop closes.
func (s *Server) trustLoop(stop <-chan struct{}) {
	t := time.NewTicker(s.cfg.Trust.interval())
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-t.C:
			s.refreshTrust(s.now())
		}
	}
}

// workerTrust is worker's diagnosed trust state as /v1/workers reports it.
func (s *Server) workerTrust(worker string) string {
	return trustOf(s.fleet(), *s.trust.lowered.Load(), worker).String()
}

// trustCollector exports kvindex_worker_trust{worker, state}: 1 for the worker's
// diagnosed state, 0 for the others.
type trustCollector struct {
	s    *Server
	desc *prometheus.Desc
}

func newTrustCollector(s *Server) *trustCollector {
	return &trustCollector{s: s, desc: prometheus.NewDesc("kvindex_worker_trust",
		"1 for the trust state the worker's score comes from (exact: its events; degraded: the index merged with predictions; approximate: predictions alone), 0 for the others; the diagnosed state even with trust.off.",
		[]string{"worker", "state"}, nil)}
}

func (c *trustCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

func (c *trustCollector) Collect(ch chan<- prometheus.Metric) {
	f := c.s.fleet()
	lowered := *c.s.trust.lowered.Load()
	emit := func(worker string) {
		t := trustOf(f, lowered, worker)
		for u := range numTrust {
			v := 0.0
			if u == t {
				v = 1
			}
			ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, v, worker, u.String())
		}
	}
	for _, sub := range f.subs.All() {
		emit(sub.Worker())
	}
	for _, w := range slices.Sorted(f.approx.Keys()) {
		emit(w)
	}
}
