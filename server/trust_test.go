package server

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	kvindexv1 "github.com/kvindex/kvindex/api/kvindexv1"
	"github.com/kvindex/kvindex/subscriber"
	"github.com/kvindex/kvindex/subscriber/pubtest"
	"github.com/kvindex/kvindex/vllmhash"
)

// The trust states end to end: a real subscriber follows the Python test publisher
// into a started server whose trust loop never fires on its own (trust.interval 1m):
// each test diagnoses with refreshTrust at the moment it chooses, so every answer's
// state and score is known in advance.

// trustBS is the tests' block size.
const trustBS = 4

// toks returns the token ids of blocks b0, b0+1, ..., b0+n-1 (block b is trustBS
// copies of b).
func toks(b0, n int) []uint32 {
	out := make([]uint32, 0, n*trustBS)
	for b := b0; b < b0+n; b++ {
		for range trustBS {
			out = append(out, uint32(b))
		}
	}
	return out
}

func tokJSON(ts []uint32) string { b, _ := json.Marshal(ts); return string(b) }

type trustHarness struct {
	t   *testing.T
	s   *Server
	pub *pubtest.Publisher
	sub *subscriber.Subscriber
}

// newTrustHarness starts a publisher and a server following it as worker "pod" of
// model "m"; mod adjusts the configuration.
func newTrustHarness(t *testing.T, popts pubtest.Options, mod func(*Config, *EngineConfig)) *trustHarness {
	t.Helper()
	pubtest.Require(t)
	popts.Bind = true
	pub, err := pubtest.Start(popts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = pub.Close() })
	ec := EngineConfig{Endpoint: pub.Ranks[0].Endpoint, ReplayEndpoint: pub.Ranks[0].ReplayEndpoint, Worker: "pod", Model: "m", BlockSize: trustBS}
	cfg := Config{Listen: "127.0.0.1:0", ReconnectMin: Duration(5 * time.Millisecond), ReconnectMax: Duration(100 * time.Millisecond),
		Trust: TrustConfig{Interval: Duration(time.Minute)}}
	if mod != nil {
		mod(&cfg, &ec)
	}
	cfg.Engines = []EngineConfig{ec}
	s, err := New(cfg, Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Shutdown(context.Background()) })
	if err := s.Start(); err != nil {
		t.Fatal(err)
	}
	h := &trustHarness{t: t, s: s, pub: pub, sub: s.Subscribers()[0]}
	h.waitFor("synced", func() bool { return h.sub.Status().Synced })
	return h
}

// waitFor polls cond (a bounded poll of a condition, not a sleep for synchronisation).
func (h *trustHarness) waitFor(what string, cond func() bool) {
	h.t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			h.t.Fatalf("timed out waiting for %s: %+v", what, h.sub.Status())
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// publish publishes events live and waits until the server applied their batch.
func (h *trustHarness) publish(events ...pubtest.Event) {
	h.t.Helper()
	seq, err := h.pub.Publish(0, true, events...)
	if err != nil {
		h.t.Fatal(err)
	}
	h.waitFor(fmt.Sprintf("batch %d", seq), func() bool { st := h.sub.Status(); return st.HasSeq && st.LastSeq >= seq })
	if err := h.s.eng.Barrier(context.Background()); err != nil {
		h.t.Fatal(err)
	}
}

// stored is a BlockStored event of blocks b0..b0+n-1 with engine hashes seq0...,
// under parent (nil: a root).
func stored(b0, n int, seq0 uint64, parent *uint64) pubtest.Event {
	hs := make([]uint64, n)
	for i := range hs {
		hs[i] = seq0 + uint64(i)
	}
	return pubtest.Event{Type: "BlockStored", BlockHashes: hs, Parent: parent, TokenIDs: toks(b0, n), BlockSize: trustBS}
}

func (h *trustHarness) do(method, path, body string, out any) int {
	h.t.Helper()
	rec := httptest.NewRecorder()
	h.s.Handler().ServeHTTP(rec, httptest.NewRequest(method, path, strings.NewReader(body)))
	if out != nil && rec.Code == http.StatusOK {
		if err := json.Unmarshal(rec.Body.Bytes(), out); err != nil {
			h.t.Fatal(err)
		}
	}
	return rec.Code
}

// route records a prediction of blocks b0..b0+n-1 for pod (ten minutes).
func (h *trustHarness) route(b0, n int) {
	h.t.Helper()
	body := fmt.Sprintf(`{"model":"m","worker":"pod","tokens":%s,"ttl_ms":600000}`, tokJSON(toks(b0, n)))
	if code := h.do("POST", "/v1/routed", body, nil); code != 200 {
		h.t.Fatalf("routed: %d", code)
	}
}

// match asks /v1/match and gRPC Match for blocks b0..b0+n-1 and returns pod's match
// (nil when it is not among them), checking that both APIs agree.
func (h *trustHarness) match(b0, n int) *Match {
	h.t.Helper()
	var resp MatchResponse
	if code := h.do("POST", "/v1/match", fmt.Sprintf(`{"model":"m","tokens":%s}`, tokJSON(toks(b0, n))), &resp); code != 200 {
		h.t.Fatalf("match: %d", code)
	}
	g, err := (&grpcService{s: h.s}).Match(context.Background(), &kvindexv1.MatchRequest{Model: "m", Tokens: toks(b0, n)})
	if err != nil {
		h.t.Fatal(err)
	}
	if len(g.Matches) != len(resp.Matches) {
		h.t.Fatalf("HTTP %+v, gRPC %+v", resp.Matches, g.Matches)
	}
	for i, m := range resp.Matches {
		gm := g.Matches[i]
		if gm.Worker != m.Worker || int(gm.Score) != m.Score || int(gm.Predicted) != m.Predicted || gm.Trust != m.Trust {
			h.t.Fatalf("HTTP %+v, gRPC %+v", m, gm)
		}
	}
	for i := range resp.Matches {
		if resp.Matches[i].Worker == "pod" {
			return &resp.Matches[i]
		}
	}
	return nil
}

// want checks pod's match: its score, predicted part and trust state (score 0: no
// match).
func (h *trustHarness) want(got *Match, score, predicted int, trust string) {
	h.t.Helper()
	if score == 0 {
		if got != nil {
			h.t.Fatalf("pod matched %+v, want no match", *got)
		}
		return
	}
	if got == nil || got.Score != score || got.Predicted != predicted || got.Trust != trust ||
		got.Tiers != [3]int{score, score, score} {
		h.t.Fatalf("pod matched %+v, want score %d, predicted %d, trust %s", got, score, predicted, trust)
	}
}

// workerTrust returns pod's trust as /v1/workers and gRPC Workers report it.
func (h *trustHarness) workerTrust() string {
	h.t.Helper()
	var out struct{ Workers []WorkerInfo }
	h.do("GET", "/v1/workers", "", &out)
	g, err := (&grpcService{s: h.s}).Workers(context.Background(), &kvindexv1.WorkersRequest{})
	if err != nil {
		h.t.Fatal(err)
	}
	if len(out.Workers) != 1 || len(g.Workers) != 1 || g.Workers[0].Trust != out.Workers[0].Trust {
		h.t.Fatalf("workers: HTTP %+v, gRPC %+v", out.Workers, g.Workers)
	}
	return out.Workers[0].Trust
}

// metric returns the value of a /metrics line with the given name and labels.
func (h *trustHarness) metric(series string) string {
	h.t.Helper()
	rec := httptest.NewRecorder()
	h.s.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	for _, line := range strings.Split(rec.Body.String(), "\n") {
		if v, ok := strings.CutPrefix(line, series+" "); ok {
			return v
		}
	}
	return "absent"
}

func (h *trustHarness) wantTrustMetric(state string) {
	h.t.Helper()
	for _, u := range TrustStates() {
		want := "0"
		if u == state {
			want = "1"
		}
		if got := h.metric(fmt.Sprintf(`kvindex_worker_trust{state=%q,worker="pod"}`, u)); got != want {
			h.t.Fatalf("kvindex_worker_trust{state=%q} = %s, want %s", u, got, want)
		}
	}
}

// TestTrustEventsStopped: a worker whose events stop while the router keeps picking it
// (events_stopped) is scored from its predictions alone, its four indexed blocks
// counting for nothing: a query of blocks 1-4 against a prediction of blocks 1, 2, 9
// scores 2, all predicted, "approximate", over HTTP, gRPC and the Mooncake API (8
// tokens); with trust.off the index answers again; when its events resume it is exact.
func TestTrustEventsStopped(t *testing.T) {
	h := newTrustHarness(t, pubtest.Options{}, func(c *Config, _ *EngineConfig) {
		// Any pick after the last event is events_stopped: the test decides when the
		// diagnosis runs, and so what it sees.
		c.Diagnose.IdleAfter = Duration(time.Nanosecond)
	})
	h.publish(stored(1, 4, 101, nil))
	h.route(1, 2)
	h.route(9, 1) // another worker's first block: no part of a query of 1-4
	body := fmt.Sprintf(`{"model":"m","worker":"pod","tokens":%s,"ttl_ms":600000}`, tokJSON(append(toks(1, 2), toks(9, 1)...)))
	if code := h.do("POST", "/v1/routed", body, nil); code != 200 {
		t.Fatal(code)
	}
	h.want(h.match(1, 4), 4, 0, TrustExact) // and the pick marks pod served
	h.wantTrustMetric(TrustExact)

	h.s.refreshTrust(time.Now())
	if got := h.workerTrust(); got != TrustApproximate {
		t.Fatalf("trust %s after events stopped", got)
	}
	h.wantTrustMetric(TrustApproximate)
	h.want(h.match(1, 4), 2, 2, TrustApproximate)
	h.want(h.match(1, 1), 1, 1, TrustApproximate)
	h.want(h.match(9, 2), 1, 1, TrustApproximate) // the index holds nothing of it
	h.want(h.match(3, 2), 0, 0, "")               // neither holds anything of it
	var mc map[string]map[string]map[string]any
	if code := h.do("POST", "/query", fmt.Sprintf(`{"model":"m","token_ids":%s}`, tokJSON(toks(1, 4))), &mc); code != 200 {
		t.Fatalf("/query %d", code)
	}
	if got := mc["default"]["pod"]["longest_matched"]; got != float64(2*trustBS) {
		t.Fatalf("/query: %v, want %d tokens", mc, 2*trustBS)
	}
	if got := h.metric(`kvindex_trust_fallback_matches_total{trust="approximate"}`); got == "absent" || got == "0" {
		t.Fatalf("fallback counter %s", got)
	}

	// The off switch: the index answers; the diagnosed state is still reported.
	h.s.trust.off.Store(true)
	h.want(h.match(1, 4), 4, 0, TrustExact)
	if got := h.workerTrust(); got != TrustApproximate {
		t.Fatalf("trust.off: /v1/workers says %s, want the diagnosed approximate", got)
	}
	h.s.trust.off.Store(false)

	// Its events resume: exact at the next diagnosis.
	p := uint64(104)
	h.publish(stored(5, 1, 105, &p))
	h.s.refreshTrust(time.Now())
	h.want(h.match(1, 5), 5, 0, TrustExact)
	if got := h.workerTrust(); got != TrustExact {
		t.Fatalf("trust %s after events resumed", got)
	}
	h.wantTrustMetric(TrustExact)
}

// TestTrustHashMismatch: an engine whose block hashes do not follow from its tokens
// (PYTHONHASHSEED 1, checked with 0) is approximate: its two indexed blocks count for
// nothing against a one-block prediction. Once a diagnosis window has passed without
// a mismatch it is exact again.
func TestTrustHashMismatch(t *testing.T) {
	h := newTrustHarness(t, pubtest.Options{}, func(_ *Config, e *EngineConfig) {
		e.HashCheck = &HashCheckConfig{Seed: "0"}
	})
	h.publish(mismatched(1, 2))
	h.route(1, 1)
	h.want(h.match(1, 2), 2, 0, TrustExact) // not diagnosed yet
	h.s.refreshTrust(time.Now())
	h.want(h.match(1, 2), 1, 1, TrustApproximate)
	h.wantTrustMetric(TrustApproximate)
	// Three windows on, the mismatch is history.
	h.s.refreshTrust(time.Now().Add(3 * subscriber.DefaultDiagWindow))
	h.want(h.match(1, 2), 2, 0, TrustExact)
	h.wantTrustMetric(TrustExact)
}

// mismatched is a BlockStored root of blocks b0..b0+n-1 hashed as vLLM does with
// PYTHONHASHSEED 1 (the tests check with 0).
func mismatched(b0, n int) pubtest.Event {
	var hs vllmhash.Hasher
	d := vllmhash.RootPickle("1")
	ev := pubtest.Event{Type: "BlockStored", TokenIDs: toks(b0, n), BlockSize: trustBS}
	for b := b0; b < b0+n; b++ {
		d, _ = hs.BlockPickle(&d, toks(b, 1), nil)
		ev.BlockHashes = append(ev.BlockHashes, d.Low64())
	}
	return ev
}

// TestTrustStaleDegraded: a worker whose history could not be replayed (stale: the
// index holds a subset of its blocks) is degraded, scored from the index merged with
// its predictions: a query of blocks 15, 20, 21, 22 against indexed 15, 20 and a
// prediction of all four scores 4, 2 of them predicted; a shorter prediction leaves the
// index's 2. When the engine clears its cache the worker is live, and exact, again.
func TestTrustStaleDegraded(t *testing.T) {
	h := newTrustHarness(t, pubtest.Options{BufferSteps: 3}, nil)
	h.publish(stored(1, 1, 100, nil))
	for i := range 6 { // lost, and more than the buffer holds
		if _, err := h.pub.Publish(0, false, stored(10+i, 1, uint64(200+i), nil)); err != nil {
			t.Fatal(err)
		}
	}
	p := uint64(205)
	h.publish(stored(20, 1, 300, &p))
	if st := h.sub.State(); st != subscriber.StateStale {
		t.Fatalf("state %v, want stale", st)
	}
	if got := h.workerTrust(); got != TrustDegraded {
		t.Fatalf("stale worker's trust %s", got)
	}
	h.wantTrustMetric(TrustDegraded)
	// The index keeps blocks 14, 15 (still buffered) and 20 under 15.
	q := append(toks(15, 1), toks(20, 3)...)
	body := fmt.Sprintf(`{"model":"m","worker":"pod","tokens":%s,"ttl_ms":600000}`, tokJSON(q))
	if code := h.do("POST", "/v1/routed", body, nil); code != 200 {
		t.Fatal(code)
	}
	matchQ := func() *Match {
		var resp MatchResponse
		h.do("POST", "/v1/match", fmt.Sprintf(`{"model":"m","tokens":%s}`, tokJSON(q)), &resp)
		for i := range resp.Matches {
			if resp.Matches[i].Worker == "pod" {
				return &resp.Matches[i]
			}
		}
		return nil
	}
	h.want(matchQ(), 4, 2, TrustDegraded)
	q = q[:2*trustBS] // what the index covers: its 2 blocks
	h.want(matchQ(), 2, 0, TrustDegraded)
	// The engine resets its cache: live, exact.
	h.publish(pubtest.Event{Type: "AllBlocksCleared"})
	h.publish(stored(15, 1, 400, nil))
	if got := h.workerTrust(); got != TrustExact {
		t.Fatalf("after clear: trust %s (state %v)", got, h.sub.State())
	}
	h.want(matchQ(), 1, 0, TrustExact)
}

// TestTrustMapping pins which problems and subscriber states lower a worker to which
// trust state.
func TestTrustMapping(t *testing.T) {
	for code, want := range map[string]trust{
		subscriber.ProblemNoEvents: trustApproximate, subscriber.ProblemEventsStopped: trustApproximate,
		subscriber.ProblemHashMismatch: trustApproximate, subscriber.ProblemParentMiss: trustDegraded,
		subscriber.ProblemBlockSize: trustDegraded, ProblemUnmatchedQueries: trustExact,
	} {
		if got := problemTrust(code); got != want {
			t.Errorf("%s: %v, want %v", code, got, want)
		}
	}
	if len(subscriber.ProblemCodes()) != 5 {
		t.Errorf("problem codes %v: give the new one a trust state", subscriber.ProblemCodes())
	}
	for _, st := range subscriber.States() {
		want := trustApproximate
		switch st {
		case subscriber.StateLive:
			want = trustExact
		case subscriber.StateStale:
			want = trustDegraded
		}
		if got := stateTrust(st); got != want {
			t.Errorf("%v: %v, want %v", st, got, want)
		}
	}
	if err := (TrustConfig{Interval: Duration(time.Millisecond)}).validate(); err == nil {
		t.Error("trust.interval 1ms accepted")
	}
	if _, err := New(Config{Trust: TrustConfig{Interval: Duration(2 * time.Minute)}, Models: map[string]int{"m": 4}}, Options{}); err == nil {
		t.Error("New accepted trust.interval 2m")
	}
}

// TestTrustConcurrent runs answers (HTTP and gRPC), diagnoses that flip a
// hash-mismatched worker between exact and approximate, predictions and the worker's
// events at once (for -race), and checks each answer is one of the two states' scores.
func TestTrustConcurrent(t *testing.T) {
	h := newTrustHarness(t, pubtest.Options{}, func(_ *Config, e *EngineConfig) {
		e.HashCheck = &HashCheckConfig{Seed: "0"}
	})
	h.publish(mismatched(1, 4))
	var wg sync.WaitGroup
	stop := make(chan struct{})
	errs := make(chan error, 8)
	check := func(api, worker, trust string, score, predicted int) {
		if worker != "pod" {
			return
		}
		ok := (trust == TrustExact && score == 4) || (trust == TrustApproximate && score == predicted && score >= 1 && score <= 4)
		if !ok {
			select {
			case errs <- fmt.Errorf("%s: pod %s score %d predicted %d", api, trust, score, predicted):
			default:
			}
		}
	}
	wg.Add(3)
	go func() { // diagnoses at alternating times: hash_mismatch on and off
		defer wg.Done()
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			at := time.Now()
			if i%2 == 1 {
				at = at.Add(3 * subscriber.DefaultDiagWindow) // the mismatches are history
			}
			h.s.refreshTrust(at)
		}
	}()
	go func() { // the router records predictions
		defer wg.Done()
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			body := fmt.Sprintf(`{"model":"m","worker":"pod","tokens":%s,"ttl_ms":600000}`, tokJSON(toks(1, 1+i%4)))
			rec := httptest.NewRecorder()
			h.s.Handler().ServeHTTP(rec, httptest.NewRequest("POST", "/v1/routed", strings.NewReader(body)))
		}
	}()
	go func() { // gRPC answers
		defer wg.Done()
		g := &grpcService{s: h.s}
		for {
			select {
			case <-stop:
				return
			default:
			}
			resp, err := g.Match(context.Background(), &kvindexv1.MatchRequest{Model: "m", Tokens: toks(1, 4)})
			if err != nil {
				errs <- err
				return
			}
			for _, m := range resp.Matches {
				check("grpc", m.Worker, m.Trust, int(m.Score), int(m.Predicted))
			}
		}
	}()
	for i := range 300 { // HTTP answers, beside events of another chain
		rec := httptest.NewRecorder()
		h.s.Handler().ServeHTTP(rec, httptest.NewRequest("POST", "/v1/match", strings.NewReader(`{"model":"m","tokens":`+tokJSON(toks(1, 4))+`}`)))
		var resp MatchResponse
		if err := json.Unmarshal(rec.Body.Bytes(), &resp); err != nil {
			t.Fatal(err)
		}
		for _, m := range resp.Matches {
			check("http", m.Worker, m.Trust, m.Score, m.Predicted)
		}
		if i%50 == 0 {
			if _, err := h.pub.Publish(0, true, mismatched(100+i, 1)); err != nil {
				t.Fatal(err)
			}
		}
	}
	close(stop)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if !slices.Contains(TrustStates(), h.workerTrust()) {
		t.Fatal("unknown trust state")
	}
}
