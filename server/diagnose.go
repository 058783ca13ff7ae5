package server

import (
	"fmt"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvindex/kvindex/subscriber"
)

// Diagnostics the server adds to the subscribers' (subscriber.Problems): per model, the
// queries that match nothing while the model's workers hold blocks, the signature of a
// router that tokenizes or templates prompts differently from the engines; and the
// rate-limited log line for every problem.

// Defaults of DiagnoseConfig's server-side fields.
const (
	DefaultUnmatchedRate    = 0.95
	DefaultMinQueries       = 20
	DefaultLogInterval      = 5 * time.Minute
	diagnoseCheckInterval   = 10 * time.Second
	ProblemUnmatchedQueries = "unmatched_queries"
)

// queryWindow counts a model's queries, and those that matched nothing while its
// workers held blocks, over the current and the previous Window. Reading never moves
// the window (a scrape at registration time must not start it on another clock).
type queryWindow struct {
	mu    sync.Mutex
	w     qwin
	total [2]uint64 // since start, for /metrics
}

type qwin struct {
	start     time.Time
	cur, prev [2]uint64
	hasPrev   bool
}

func (w *qwin) roll(now time.Time, period time.Duration) {
	if w.start.IsZero() {
		w.start = now
		return
	}
	el := now.Sub(w.start)
	if el < period {
		return
	}
	if el < 2*period {
		w.prev, w.start = w.cur, w.start.Add(period)
	} else {
		w.prev, w.start = [2]uint64{}, now
	}
	w.hasPrev, w.cur = true, [2]uint64{}
}

func (q *queryWindow) record(now time.Time, period time.Duration, unmatched bool) {
	q.mu.Lock()
	q.w.roll(now, period)
	q.w.cur[0]++
	q.total[0]++
	if unmatched {
		q.w.cur[1]++
		q.total[1]++
	}
	q.mu.Unlock()
}

// recent returns (queries, unmatched) over the last one to two windows as of now, the
// totals, and the span the recent counts cover.
func (q *queryWindow) recent(now time.Time, period time.Duration) (recent, total [2]uint64, span time.Duration) {
	q.mu.Lock()
	w, total := q.w, q.total
	q.mu.Unlock()
	if w.start.IsZero() {
		return recent, total, 0
	}
	w.roll(now, period)
	recent, span = w.cur, now.Sub(w.start)
	if w.hasPrev {
		recent[0] += w.prev[0]
		recent[1] += w.prev[1]
		span += period
	}
	return recent, total, span
}

func (s *Server) diagWindow() time.Duration {
	if w := time.Duration(s.cfg.Diagnose.Window); w > 0 {
		return w
	}
	return subscriber.DefaultDiagWindow
}

// populated reports whether any worker of m holds a block.
func (s *Server) populated(m *model) bool {
	sizer := s.sizer()
	if sizer == nil {
		return true // cannot tell: count every miss
	}
	for _, sub := range m.subs.All() {
		if n, ok := sizer.WorkerSize(sub.Worker()); ok && n > 0 {
			return true
		}
	}
	return false
}

// noteQuery records a non-empty query's outcome for the model's diagnostics.
func (s *Server) noteQuery(m *model, matched bool) {
	now := s.now()
	m.queries.record(now, s.diagWindow(), !matched && s.populated(m))
}

// modelProblems diagnoses a model as of now.
func (s *Server) modelProblems(m *model, now time.Time) []subscriber.Problem {
	rate, minQ := s.cfg.Diagnose.UnmatchedRate, s.cfg.Diagnose.MinSamples
	if rate == 0 {
		rate = DefaultUnmatchedRate
	}
	if minQ == 0 {
		minQ = DefaultMinQueries
	}
	r, _, span := m.queries.recent(now, s.diagWindow())
	if r[0] < uint64(minQ) || float64(r[1]) < rate*float64(r[0]) || r[1] == 0 {
		return nil
	}
	return []subscriber.Problem{{Code: ProblemUnmatchedQueries,
		Message: fmt.Sprintf("%d of %d queries in the last %s (%.1f%%, %.2f/s) matched no block while the model's workers hold blocks",
			r[1], r[0], span.Round(time.Second), 100*float64(r[1])/float64(r[0]), float64(r[1])/max(span.Seconds(), 1)),
		Hint: "the router's token ids differ from the engines': use the engine's tokenizer and chat template (same special tokens, BOS, generation prompt), the same block size, the same lora_name/cache_salt namespace, and per-block extra_keys for multimodal prompts; compare a request's tokens with a BlockStored event's token_ids"}}
}

// ModelInfo is one entry of the "models" list of GET /v1/workers.
type ModelInfo struct {
	Model     string `json:"model"`
	BlockSize int    `json:"block_size"`
	// Queries counts the non-empty /v1/match queries; Unmatched those that matched
	// nothing while the model's workers held blocks.
	Queries   uint64               `json:"queries"`
	Unmatched uint64               `json:"unmatched"`
	Problems  []subscriber.Problem `json:"problems"`
}

func (s *Server) modelInfos(now time.Time) []ModelInfo {
	models := s.fleet().models
	out := make([]ModelInfo, 0, models.Len())
	for name, m := range models.All() {
		_, total, _ := m.queries.recent(now, s.diagWindow())
		ps := s.modelProblems(m, now)
		if ps == nil {
			ps = []subscriber.Problem{}
		}
		out = append(out, ModelInfo{Model: name, BlockSize: m.blockSize, Queries: total[0], Unmatched: total[1], Problems: ps})
	}
	return out
}

// WorkerDiag is the "diagnostics" object of a /v1/workers entry.
type WorkerDiag struct {
	Problems []subscriber.Problem `json:"problems"`
	// LiveSince is when the worker became synced on its connection; LastEvent when an
	// event was last applied; both null when not yet.
	LiveSince       *time.Time `json:"live_since"`
	LastEvent       *time.Time `json:"last_event"`
	EventsSinceLive uint64     `json:"events_since_live"`
	// BlockSizeRejects counts stores with another block_size (ForeignBlockSize the last).
	BlockSizeRejects uint64 `json:"block_size_rejects"`
	ForeignBlockSize int    `json:"foreign_block_size,omitempty"`
	// HashCheck is null unless the engine's hashes are checked.
	HashCheck *subscriber.HashCounts `json:"hash_check"`
	// SkippedKVGroups counts events of KV-cache groups not indexed, by kind.
	SkippedKVGroups map[string]uint64 `json:"skipped_kv_groups"`
}

func workerDiag(st *subscriber.Status, ps []subscriber.Problem) *WorkerDiag {
	d := &st.Diag
	if ps == nil {
		ps = []subscriber.Problem{}
	}
	wd := &WorkerDiag{Problems: ps, EventsSinceLive: d.EventsSinceLive, BlockSizeRejects: d.BlockSizeRejects,
		ForeignBlockSize: d.ForeignBlockSize, SkippedKVGroups: map[string]uint64{}}
	if !d.LiveSince.IsZero() {
		t := d.LiveSince
		wd.LiveSince = &t
	}
	if !d.LastEvent.IsZero() {
		t := d.LastEvent
		wd.LastEvent = &t
	}
	if d.HashCheck {
		h := d.Hash
		wd.HashCheck = &h
	}
	for _, g := range d.SkippedGroups {
		wd.SkippedKVGroups[g.Group] = g.Count
	}
	return wd
}

// logProblems logs every problem as of now: when it appears, then at most once per
// LogInterval while it lasts, and once when it is over. The diagnose loop calls it
// every 10 s; tests call it with their own clock.
func (s *Server) logProblems(now time.Time) {
	every := time.Duration(s.cfg.Diagnose.LogInterval)
	if every == 0 {
		every = DefaultLogInterval
	}
	s.logMu.Lock()
	defer s.logMu.Unlock()
	seen := map[problemKey]bool{}
	report := func(kind, who, model string, p subscriber.Problem) {
		key := problemKey{kind, who, p.Code}
		seen[key] = true
		if last, ok := s.logged[key]; ok && now.Sub(last) < every {
			return
		}
		s.logged[key] = now
		if kind == "model" {
			s.log.Warn("routing may ignore the cache: "+p.Message, "model", model, "problem", p.Code, "hint", p.Hint)
			return
		}
		s.log.Warn("routing may ignore the cache: "+p.Message, kind, who, "model", model, "problem", p.Code, "hint", p.Hint)
	}
	f := s.fleet()
	for _, sub := range f.subs.All() {
		for _, p := range sub.Problems(now) {
			report("worker", sub.Worker(), sub.Model(), p)
		}
	}
	for name, m := range f.models.All() {
		for _, p := range s.modelProblems(m, now) {
			report("model", name, name, p)
		}
	}
	for key := range s.logged {
		if !seen[key] {
			delete(s.logged, key)
			s.log.Info("problem resolved", key.kind, key.who, "problem", key.code)
		}
	}
}

// problemKey names one ongoing problem in the log's memory: a worker's or a model's
// (kind), by its id, and the problem's code.
type problemKey struct{ kind, who, code string }

// diagnoseLoop logs problems every diagnoseCheckInterval until stop closes.
func (s *Server) diagnoseLoop(stop <-chan struct{}) {
	t := time.NewTicker(diagnoseCheckInterval)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-t.C:
			s.logProblems(s.now())
		}
	}
}

// diagCollector exports the diagnostics at scrape time.
type diagCollector struct {
	s                                           *Server
	problem, hash, groups, modelQ, modelUnm, mp *prometheus.Desc
}

func newDiagCollector(s *Server) *diagCollector {
	d := func(name, help string, labels ...string) *prometheus.Desc {
		return prometheus.NewDesc("kvindex_"+name, help, labels, nil)
	}
	return &diagCollector{
		s:        s,
		problem:  d("worker_problem", "1 while the worker shows the problem (no_events, events_stopped, block_size_mismatch, parent_not_found, hash_mismatch).", "worker", "model", "problem"),
		hash:     d("hash_check_blocks_total", "Blocks whose engine hash was recomputed, by result (matched, mismatched, unverifiable, sampled_out).", "worker", "result"),
		groups:   d("kv_group_events_skipped_total", "Events of KV-cache groups not indexed, by group kind.", "worker", "group"),
		modelQ:   d("model_queries_total", "Non-empty /v1/match queries per model.", "model"),
		modelUnm: d("model_queries_unmatched_total", "Queries that matched nothing while the model's workers held blocks.", "model"),
		mp:       d("model_problem", "1 while the model shows the problem (unmatched_queries).", "model", "problem"),
	}
}

func (c *diagCollector) Describe(ch chan<- *prometheus.Desc) { prometheus.DescribeByCollect(c, ch) }

func (c *diagCollector) Collect(ch chan<- prometheus.Metric) {
	s := c.s
	now := s.now()
	f := s.fleet()
	for _, sub := range f.subs.All() {
		st := sub.Status()
		active := map[string]bool{}
		for _, p := range sub.Problems(now) {
			active[p.Code] = true
		}
		for _, code := range subscriber.ProblemCodes() {
			v := 0.0
			if active[code] {
				v = 1
			}
			ch <- prometheus.MustNewConstMetric(c.problem, prometheus.GaugeValue, v, st.Worker, st.Model, code)
		}
		if st.Diag.HashCheck {
			h := st.Diag.Hash
			for _, r := range []struct {
				name string
				v    uint64
			}{{"matched", h.Matched}, {"mismatched", h.Mismatched}, {"unverifiable", h.Unverifiable}, {"sampled_out", h.SampledOut}} {
				ch <- prometheus.MustNewConstMetric(c.hash, prometheus.CounterValue, float64(r.v), st.Worker, r.name)
			}
		}
		for _, g := range st.Diag.SkippedGroups {
			ch <- prometheus.MustNewConstMetric(c.groups, prometheus.CounterValue, float64(g.Count), st.Worker, g.Group)
		}
	}
	for name, m := range f.models.All() {
		_, total, _ := m.queries.recent(now, s.diagWindow())
		ch <- prometheus.MustNewConstMetric(c.modelQ, prometheus.CounterValue, float64(total[0]), name)
		ch <- prometheus.MustNewConstMetric(c.modelUnm, prometheus.CounterValue, float64(total[1]), name)
		v := 0.0
		if len(s.modelProblems(m, now)) > 0 {
			v = 1
		}
		ch <- prometheus.MustNewConstMetric(c.mp, prometheus.GaugeValue, v, name, ProblemUnmatchedQueries)
	}
}
