package server_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/url"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kvindex/kvindex/hash"
	"github.com/kvindex/kvindex/internal/freeport"
	"github.com/kvindex/kvindex/internal/oplog"
	"github.com/kvindex/kvindex/internal/refmodel"
	"github.com/kvindex/kvindex/server"
	"github.com/kvindex/kvindex/subscriber"
	"github.com/kvindex/kvindex/subscriber/pubtest"
)

// fleetHarness drives engines that come and go: one publisher process per engine
// ("e<i>", model "m", block size 4), a reference model of everything every engine
// published (served or not: an engine added later replays its whole history), and the
// server under test.
type fleetHarness struct {
	t    *testing.T
	pubs []*pubtest.Publisher
	s    *server.Server
	c    *client
	m    *refmodel.Model
	r    *rand.Rand
	last []uint64 // each engine's last published sequence
	qs   [][]uint64
}

const fleetBS = 4

func fleetTokens(c uint64) []uint32 { return []uint32{uint32(c), 7, 9, uint32(c >> 32)} }

func newFleetHarness(t *testing.T, engines int, cfgEngines []int) *fleetHarness {
	t.Helper()
	pubtest.Require(t)
	h := &fleetHarness{t: t, m: refmodel.New(), r: rand.New(rand.NewPCG(25, 1)), last: make([]uint64, engines)}
	for range engines {
		pub, err := pubtest.Start(pubtest.Options{Bind: true})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { pub.Close() })
		h.pubs = append(h.pubs, pub)
	}
	cfg := server.Config{Listen: "127.0.0.1:0", ReconnectMin: server.Duration(10 * time.Millisecond),
		ReconnectMax: server.Duration(100 * time.Millisecond), Index: server.IndexConfig{Shards: 2}}
	for _, i := range cfgEngines {
		cfg.Engines = append(cfg.Engines, h.spec(i))
	}
	h.s, h.c = start(t, cfg)
	return h
}

// spec is engine i's configuration.
func (h *fleetHarness) spec(i int) server.EngineConfig {
	r := h.pubs[i].Ranks[0]
	return server.EngineConfig{Endpoint: r.Endpoint, ReplayEndpoint: r.ReplayEndpoint,
		Worker: fmt.Sprintf("e%d", i), Model: "m", BlockSize: fleetBS}
}

// stream publishes n random ops over every rank (batches of 1-3 events) and applies
// them to the model; it keeps the queries.
func (h *fleetHarness) stream(n int) {
	h.t.Helper()
	ops := refmodel.RandomOps(h.r, n, refmodel.RandomOptions{Workers: len(h.last), MaxChain: 30})
	pending := make([][]pubtest.Event, len(h.last))
	flush := func(w int) {
		if len(pending[w]) == 0 {
			return
		}
		seq, err := h.pubs[w].Publish(0, true, pending[w]...)
		if err != nil {
			h.t.Fatal(err)
		}
		h.last[w], pending[w] = seq, nil
	}
	for _, op := range ops {
		if op.Kind == oplog.Query {
			if len(op.Content) == 0 {
				continue // an empty query is a 400 (bad_query), not a comparison
			}
			q := make([]uint64, len(op.Content))
			for i, c := range op.Content {
				q[i] = hash.Content(fleetTokens(c))
			}
			h.qs = append(h.qs, q)
			continue
		}
		var w int
		fmt.Sscanf(op.Worker, "w%d", &w)
		op.Worker = fmt.Sprintf("e%d", w)
		ev, blocks := pubtest.FromOp(&op, fleetBS, fleetTokens)
		switch op.Kind {
		case oplog.Stored:
			_ = h.m.Stored(op.Worker, op.Parent, op.HasParent, blocks)
		case oplog.Removed:
			h.m.Removed(op.Worker, op.Seqs)
		default:
			h.m.Cleared(op.Worker)
		}
		pending[w] = append(pending[w], ev)
		if len(pending[w]) >= 1+h.r.IntN(3) {
			flush(w)
		}
	}
	for w := range pending {
		flush(w)
	}
}

// served returns the workers /v1/workers lists.
func (h *fleetHarness) served() []server.WorkerInfo {
	h.t.Helper()
	var ws struct{ Workers []server.WorkerInfo }
	if got := h.c.do("GET", "/v1/workers", "", &ws); got != 200 {
		h.t.Fatalf("workers: %d", got)
	}
	return ws.Workers
}

// check waits until every served worker has applied its rank's last batch, takes a
// barrier, and compares /v1/match with the model's answers restricted to the workers
// served, which must be exactly want.
func (h *fleetHarness) check(want ...int) {
	h.t.Helper()
	names := map[string]bool{}
	for _, i := range want {
		names[fmt.Sprintf("e%d", i)] = true
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		ws := h.served()
		done := len(ws) == len(want)
		for _, w := range ws {
			var rank int
			fmt.Sscanf(w.Worker, "e%d", &rank)
			if !names[w.Worker] {
				h.t.Fatalf("worker %s served, want %v", w.Worker, want)
			}
			if w.LastSeq == nil || *w.LastSeq != h.last[rank] || w.State != "live" {
				done = false
			}
		}
		if done {
			break
		}
		if time.Now().After(deadline) {
			h.t.Fatalf("workers never caught up with %v: %+v", h.last, ws)
		}
		time.Sleep(5 * time.Millisecond) // bounded poll of a condition
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := h.s.Engine().Barrier(ctx); err != nil {
		h.t.Fatal(err)
	}
	for _, q := range h.qs {
		body, _ := json.Marshal(map[string]any{"model": "m", "content_hashes": q})
		var mr server.MatchResponse
		if got := h.c.do("POST", "/v1/match", string(body), &mr); got != 200 {
			h.t.Fatalf("match: %d", got)
		}
		var exp []refmodel.Answer
		for _, a := range h.m.Query(q) {
			if names[a.Worker] {
				exp = append(exp, a)
			}
		}
		slices.SortFunc(mr.Matches, func(a, b server.Match) int {
			if a.Score != b.Score {
				return b.Score - a.Score
			}
			return strings.Compare(a.Worker, b.Worker)
		})
		ok := len(mr.Matches) == len(exp)
		for i := 0; ok && i < len(exp); i++ {
			g := mr.Matches[i]
			ok = g.Worker == exp[i].Worker && g.Score == exp[i].Score && g.Size == exp[i].Size
		}
		if !ok {
			for _, w := range h.served() {
				n, _ := h.m.Size(w.Worker)
				h.t.Logf("%s: size %v, model %d, rejected %v, seq %v", w.Worker, *w.Size, n, w.Rejected, *w.LastSeq)
			}
			h.t.Fatalf("query %v: server %+v, model %+v (served %v)", q, mr.Matches, exp, want)
		}
	}
	for i := range h.pubs {
		if name := fmt.Sprintf("e%d", i); !names[name] {
			if n, ok := h.s.Engine().WorkerSize(name); ok {
				h.t.Fatalf("%s is not served but the index holds %d of its blocks", name, n)
			}
		}
	}
	if n := runningSubscribers(); n != len(want) {
		h.t.Fatalf("%d subscriber goroutines running, want %d (one per served worker)", n, len(want))
	}
}

// runningSubscribers counts the goroutines inside a subscriber's Run.
func runningSubscribers() int {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			return strings.Count(string(buf[:n]), "subscriber.(*Subscriber).Run(")
		}
		buf = make([]byte, 2*len(buf))
	}
}

// subs returns the server's subscriber of each served worker.
func (h *fleetHarness) subs() map[string]*subscriber.Subscriber {
	out := map[string]*subscriber.Subscriber{}
	for _, sub := range h.s.Subscribers() {
		out[sub.Worker()] = sub
	}
	return out
}

// TestEnginesChangeAtRuntime adds, removes, re-adds and replaces engines through the
// admin API and SetEngines (what a reload and discovery call) while every rank keeps
// publishing: after each change the served workers' answers equal the reference
// model's restricted to them, an untouched worker's subscriber keeps running (its
// batch count only grows, it is never re-synced), and exactly one subscriber
// goroutine runs per served worker (TestMain's goleak checks the rest at the end).
func TestEnginesChangeAtRuntime(t *testing.T) {
	h := newFleetHarness(t, 4, []int{0, 1})
	h.stream(150)
	h.check(0, 1)

	// The API adds e2; e0 and e1 go on.
	before := h.subs()
	body, _ := json.Marshal(h.spec(2))
	var added struct {
		Engine server.EngineInfo
		Added  bool
	}
	if got := h.c.do("POST", "/v1/engines", string(body), &added); got != 201 || !added.Added ||
		added.Engine.Key != "e2" || added.Engine.Source != server.SourceAPI || !slices.Equal(added.Engine.Workers, []string{"e2"}) {
		t.Fatalf("POST: %d %+v", got, added)
	}
	// A retry of the same request is not an error.
	if got := h.c.do("POST", "/v1/engines", string(body), &added); got != 200 || added.Added {
		t.Fatalf("POST again: %d %+v", got, added)
	}
	h.stream(150)
	h.check(0, 1, 2)
	h.untouched(before, "e0", "e1")

	// The configuration drops e0 (a reload): e1 and e2 go on.
	before = h.subs()
	ch, err := h.s.SetEngines(server.SourceConfig, []server.EngineConfig{h.spec(1)})
	if err != nil || !slices.Equal(ch.Removed, []string{"e0"}) || !slices.Equal(ch.Unchanged, []string{"e1"}) || len(ch.Added)+len(ch.Replaced)+len(ch.Rejected) != 0 {
		t.Fatalf("SetEngines: %v %+v", err, ch)
	}
	h.stream(150)
	h.check(1, 2)
	h.untouched(before, "e1", "e2")

	// The API removes e2.
	before = h.subs()
	var removed struct {
		Removed string
		Workers []string
	}
	if got := h.c.do("DELETE", "/v1/engines/e2", "", &removed); got != 200 || removed.Removed != "e2" || !slices.Equal(removed.Workers, []string{"e2"}) {
		t.Fatalf("DELETE: %d %+v", got, removed)
	}
	h.stream(100)
	h.check(1)
	h.untouched(before, "e1")

	// e0 comes back through the API: its subscriber replays its whole history.
	body, _ = json.Marshal(h.spec(0))
	if got := h.c.do("POST", "/v1/engines", string(body), &added); got != 201 {
		t.Fatalf("POST e0: %d", got)
	}
	h.stream(100)
	h.check(0, 1)

	// The configuration changes e1's spec and adds e3: e1 is replaced (removed, then
	// synced again from its replay buffer), e0 goes on.
	before = h.subs()
	e1 := h.spec(1)
	e1.Media = []string{"*"}
	ch, err = h.s.SetEngines(server.SourceConfig, []server.EngineConfig{e1, h.spec(3)})
	if err != nil || !slices.Equal(ch.Replaced, []string{"e1"}) || !slices.Equal(ch.Added, []string{"e3"}) || len(ch.Removed)+len(ch.Rejected) != 0 {
		t.Fatalf("SetEngines: %v %+v", err, ch)
	}
	h.stream(100)
	h.check(0, 1, 3)
	h.untouched(before, "e0")

	var list struct{ Engines []server.EngineInfo }
	if got := h.c.do("GET", "/v1/engines", "", &list); got != 200 || len(list.Engines) != 3 {
		t.Fatalf("GET /v1/engines: %d %+v", got, list)
	}
	srcs := map[string]string{}
	for _, e := range list.Engines {
		srcs[e.Key] = e.Source
	}
	if srcs["e0"] != "api" || srcs["e1"] != "config" || srcs["e3"] != "config" {
		t.Fatalf("sources %v", srcs)
	}
	m := h.c.text("/metrics")
	for _, want := range []string{
		`kvindex_engines{source="api"} 1`,
		`kvindex_engines{source="config"} 2`,
		`kvindex_engine_changes_total{change="added",source="api"} 2`,
		`kvindex_engine_changes_total{change="removed",source="api"} 1`,
		`kvindex_engine_changes_total{change="removed",source="config"} 1`,
		`kvindex_engine_changes_total{change="replaced",source="config"} 1`,
		`kvindex_engine_changes_total{change="added",source="config"} 1`,
	} {
		if !strings.Contains(m, want) {
			t.Errorf("metrics lack %q", want)
		}
	}
}

// untouched checks that the workers' subscribers kept running through a change: the
// same subscriber, which never reconnected nor re-synced (one connection, no
// invalidation, no restart).
func (h *fleetHarness) untouched(before map[string]*subscriber.Subscriber, workers ...string) {
	h.t.Helper()
	after := h.subs()
	for _, w := range workers {
		st := after[w].Status()
		if after[w] != before[w] || st.Connects != 1 || st.Invalidations != 0 || st.Restarts != 0 {
			h.t.Fatalf("%s: its subscriber was replaced or re-synced across the change: %+v", w, st)
		}
	}
}

// TestEngineAPIErrors: every way an admin request can fail says why, and changes
// nothing.
func TestEngineAPIErrors(t *testing.T) {
	a, b := freeport.Endpoint(t), freeport.Endpoint(t)
	cfg := server.Config{Listen: "127.0.0.1:0", MaxBodyBytes: 4096,
		Engines: []server.EngineConfig{{Endpoint: a, Worker: "cfg-0", Model: "m", BlockSize: 4}}}
	s, c := start(t, cfg)
	spec := func(f string, args ...any) string { return fmt.Sprintf(f, args...) }
	for _, tc := range []struct {
		method, path, body string
		status             int
		code               string
	}{
		{"POST", "/v1/engines", `{`, 400, "bad_json"},
		{"POST", "/v1/engines", `{"endpoint":"` + b + `","bogus":1}`, 400, "bad_json"},
		{"POST", "/v1/engines", `{"endpoint":"` + b + `","endpoint":"` + b + `"}`, 400, "bad_json"},
		{"POST", "/v1/engines", `{"endpoint":"` + b + `"} {}`, 400, "bad_json"},
		{"POST", "/v1/engines", `{"endpoint":"` + b + `","block_size":"4"}`, 400, "bad_json"},
		{"POST", "/v1/engines", `{"endpoint":""}`, 400, "bad_engine"},
		{"POST", "/v1/engines", `{"endpoint":"tcp://*:1"}`, 400, "bad_engine"},
		{"POST", "/v1/engines", spec(`{"endpoint":%q,"worker":"x","dp_ranks":2000}`, b), 400, "bad_engine"},
		// Conflicts with the configured engine: its endpoint, its worker id, its model's
		// block size.
		{"POST", "/v1/engines", spec(`{"endpoint":%q,"worker":"other","model":"m","block_size":4}`, a), 400, "bad_engine"},
		{"POST", "/v1/engines", spec(`{"endpoint":%q,"worker":"cfg-0"}`, b), 409, "engine_exists"},
		{"POST", "/v1/engines", spec(`{"endpoint":%q,"worker":"y","model":"m","block_size":16}`, b), 400, "bad_engine"},
		{"DELETE", "/v1/engines/nope", ``, 404, "unknown_engine"},
		{"DELETE", "/v1/engines/cfg-0", ``, 409, "engine_source"},
		{"PUT", "/v1/engines", ``, 405, "method_not_allowed"},
		{"GET", "/v1/engines/cfg-0", ``, 405, "method_not_allowed"},
		{"POST", "/v1/engines", `{"endpoint":"` + b + `","topic":"` + strings.Repeat("x", 5000) + `"}`, 413, "body_too_large"},
	} {
		var e struct{ Error, Code string }
		if got := c.do(tc.method, tc.path, tc.body, &e); got != tc.status || e.Code != tc.code || e.Error == "" {
			t.Errorf("%s %s %.60s: %d %+v, want %d %s", tc.method, tc.path, tc.body, got, e, tc.status, tc.code)
		}
	}
	if es := s.Engines(); len(es) != 1 || es[0].Key != "cfg-0" {
		t.Fatalf("engines after the errors: %+v", es)
	}
	// A rank's worker id is claimed too: "p" with one rank is worker "p#dp0".
	if _, _, err := s.AddEngine(server.EngineConfig{Endpoint: b, Worker: "p", DPRanks: 1, Model: "m", BlockSize: 4}); err != nil {
		t.Fatal(err)
	}
	var e struct{ Error, Code string }
	if got := c.do("POST", "/v1/engines", `{"worker":"p#dp0","model":"m","block_size":4}`, &e); got != 400 || e.Code != "bad_engine" || !strings.Contains(e.Error, `worker id "p#dp0" also used by engine "p"`) {
		t.Fatalf("rank id clash: %d %+v", got, e)
	}
	if _, err := s.RemoveEngine("p"); err != nil {
		t.Fatal(err)
	}
	// An endpoint key is percent-encoded in the path.
	if _, added, err := s.AddEngine(server.EngineConfig{Endpoint: b, Model: "m", BlockSize: 4}); err != nil || !added {
		t.Fatal(err)
	}
	var removed struct{ Removed string }
	if got := c.do("DELETE", "/v1/engines/"+url.PathEscape(b), "", &removed); got != 200 || removed.Removed != b {
		t.Fatalf("DELETE by endpoint: %d %+v", got, removed)
	}
	// After Shutdown nothing changes.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := s.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	if _, _, err := s.AddEngine(server.EngineConfig{Endpoint: b}); err != server.ErrServerState {
		t.Fatalf("AddEngine after Shutdown: %v", err)
	}
	if _, err := s.SetEngines("file", nil); err != server.ErrServerState {
		t.Fatalf("SetEngines after Shutdown: %v", err)
	}
}

// TestReloadReportsFixedSettings: Reload applies the engine list and names every other
// setting that changed (an empty map is no change); an invalid configuration changes
// nothing; engines of the API survive a reload that does not name them.
func TestReloadReportsFixedSettings(t *testing.T) {
	a, b, c := freeport.Endpoint(t), freeport.Endpoint(t), freeport.Endpoint(t)
	cfg := server.Config{Listen: "127.0.0.1:0", Engines: []server.EngineConfig{{Endpoint: a, Worker: "a"}}}
	s, _ := start(t, cfg)
	if _, _, err := s.AddEngine(server.EngineConfig{Endpoint: c, Worker: "api"}); err != nil {
		t.Fatal(err)
	}
	next := cfg
	next.Engines = []server.EngineConfig{{Endpoint: b, Worker: "b"}}
	next.Tiers = map[string]string{}
	next.Grace = server.Duration(time.Minute) // the default, spelled out
	res, err := s.Reload(next)
	if err != nil || !slices.Equal(res.Engines.Added, []string{"b"}) || !slices.Equal(res.Engines.Removed, []string{"a"}) || len(res.NotApplied) != 0 {
		t.Fatalf("reload: %v %+v", err, res)
	}
	next.Policy, next.Index.Shards, next.Listen = server.PolicyRandom, 3, "127.0.0.1:1"
	if res, err = s.Reload(next); err != nil || !slices.Equal(res.NotApplied, []string{"listen", "policy", "index"}) || !res.Engines.Empty() {
		t.Fatalf("reload: %v %+v", err, res)
	}
	next.Engines = append(next.Engines, server.EngineConfig{Endpoint: b, Worker: "b2"})
	if _, err = s.Reload(next); !errors.Is(err, server.ErrConfig) {
		t.Fatalf("reload of a config whose engines share an endpoint: %v", err)
	}
	var keys []string
	for _, e := range s.Engines() {
		keys = append(keys, e.Key)
	}
	if !slices.Equal(keys, []string{"api", "b"}) {
		t.Fatalf("engines %v", keys)
	}
}
