package server_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"runtime"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/kvindex/kvindex/hash"
	"github.com/kvindex/kvindex/internal/freeport"
	"github.com/kvindex/kvindex/server"
	"github.com/kvindex/kvindex/subscriber/pubtest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestConfigValidation(t *testing.T) {
	good := `{"listen":"127.0.0.1:0","engines":[{"endpoint":"tcp://127.0.0.1:5557"}]}`
	cfg, err := server.ParseConfig(strings.NewReader(good))
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Index.Engine().SpecChain {
		t.Fatal("the keyed prefix chain is the default")
	}
	spec := `{"engines":[{"endpoint":"tcp://127.0.0.1:5557"}],"index":{"spec_chain":true}}`
	if cfg, err = server.ParseConfig(strings.NewReader(spec)); err != nil || !cfg.Index.Engine().SpecChain {
		t.Fatalf("index.spec_chain: %v, %+v", err, cfg.Index)
	}
	for _, tc := range []struct{ json, want string }{
		{`{"engines":[]}`, "at least one engine"},
		{`{"engines":[{"endpoint":""}]}`, "engines[0].endpoint is required"},
		{`{"engines":[{"endpoint":"tcp://*:5557"}]}`, "must name a host"},
		{`{"engines":[{"endpoint":"tcp://h:1"}],"bogus":1}`, "unknown field"},
		{`{"engines":[{"endpoint":"tcp://h:1"}],"policy":"best"}`, "policy"},
		{`{"engines":[{"endpoint":"tcp://h:1"}],"listen":"nope"}`, "listen"},
		{`{"engines":[{"endpoint":"tcp://h:1"}],"grace_period":5}`, "duration"},
		{`{"engines":[{"endpoint":"tcp://h:1","block_size":-3}]}`, "block_size"},
		{`{"engines":[{"endpoint":"tcp://h:1","dp_ranks":-1}]}`, "dp_ranks"},
		{`{"engines":[{"endpoint":"tcp://h:1","model":"a"},{"endpoint":"tcp://h:2","model":"a","block_size":32}]}`, "block size"},
		{`{"engines":[{"endpoint":"tcp://h:1","worker":"x"},{"endpoint":"tcp://h:2","worker":"x"}]}`, "worker id"},
		{`{"engines":[{"endpoint":"tcp://h:1","dp_ranks":2},{"endpoint":"tcp://h:2"}]}`, "endpoint \"tcp://h:2\" also used"},
		{`{"engines":[{"endpoint":"tcp://h:1"}],"index":{"queue_size":3}}`, "QueueSize"},
		{`{"engines":[{"endpoint":"tcp://h:1"}],"index":{"shards":256,"queue_size":16777216}}`, "Shards x QueueSize"},
		{`{"engines":[{"endpoint":"tcp://h:1"}],"index":{"locked":true,"shards":2}}`, "LockedIndex needs Shards = 1"},
		{`{"engines":[{"endpoint":"tcp://h:1"}]} {}`, "trailing"},
		{`{"engines":[{"endpoint":"tcp://h:1"}],"max_concurrent_replays":-1}`, "max_concurrent_replays"},
		{`{"engines":[{"endpoint":"tcp://h:1"}],"max_concurrent_replays":65537}`, "max_concurrent_replays"},
		// Bounds that a typo or a hostile file could push to a spin or an unbounded
		// allocation: accepted before.
		{`{"engines":[{"endpoint":"tcp://h:1"}],"reconnect_min":"1ns"}`, "ReconnectMin"},
		{`{"engines":[{"endpoint":"tcp://h:1"}],"tail_check":"1us"}`, "TailCheck"},
		{`{"engines":[{"endpoint":"tcp://h:1"}],"replay_timeout":"10us"}`, "ReplayTimeout"},
		{`{"engines":[{"endpoint":"tcp://h:1"}],"max_body_bytes":1099511627776}`, "max_body_bytes"},
		{`{"engines":[{"endpoint":"tcp://h:1"}],"listen":"127.0.0.1:1","listen":"0.0.0.0:80"}`, `key "listen" given twice`},
		{`{"engines":[{"endpoint":"tcp://h:1","model":"a","model":"b"}]}`, `key "model" given twice`},
		{`{"engines":[{"endpoint":"tcp://h:1"}],"limits":{"in_flight_bytes":1024}}`, "in_flight_bytes"},
		// Hybrid models: a declaration the index would refuse, or a selection beside it.
		{`{"engines":[{"endpoint":"tcp://h:1","kv_group_specs":[{"kind":"full","block_size":16},{"kind":"attention","block_size":16}]}]}`, "kv_group_specs[1]: engine: invalid event: unknown group kind"},
		{`{"engines":[{"endpoint":"tcp://h:1","kv_group_specs":[{"kind":"sliding_window","block_size":16}]}]}`, "sliding window of 0 tokens"},
		{`{"engines":[{"endpoint":"tcp://h:1","kv_group_specs":[{"kind":"mamba","block_size":24}]}]}`, "not a multiple of the unit"},
		{`{"engines":[{"endpoint":"tcp://h:1","kv_hybrid":true,"kv_groups":[0]}]}`, "Groups.Hybrid indexes every group"},
		{`{"engines":[{"worker":"x","model":"m","kv_hybrid":true}]}`, "kv_hybrid and kv_group_specs need an endpoint"},
		{`{"engines":[{"endpoint":"tcp://h:1"}],"max_matches":-1}`, "max_matches"},
	} {
		_, err := server.ParseConfig(strings.NewReader(tc.json))
		if !errors.Is(err, server.ErrConfig) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: err %v, want ErrConfig mentioning %q", tc.json, err, tc.want)
		}
	}
}

// client is a tiny JSON HTTP client for the tests.
type client struct {
	t    *testing.T
	base string
	hc   *http.Client
}

func newClient(t *testing.T, addr string) *client {
	tr := &http.Transport{}
	t.Cleanup(tr.CloseIdleConnections)
	return &client{t: t, base: "http://" + addr, hc: &http.Client{Transport: tr, Timeout: 10 * time.Second}}
}

func (c *client) do(method, path, body string, out any) int {
	c.t.Helper()
	req, err := http.NewRequest(method, c.base+path, strings.NewReader(body))
	if err != nil {
		c.t.Fatal(err)
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		c.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if out != nil {
		if err := json.Unmarshal(b, out); err != nil {
			c.t.Fatalf("%s %s: %d %q: %v", method, path, resp.StatusCode, b, err)
		}
	}
	return resp.StatusCode
}

func (c *client) text(path string) string {
	c.t.Helper()
	resp, err := c.hc.Get(c.base + path)
	if err != nil {
		c.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}

// waitReady polls /readyz (for up to 15 s) until the server says it is ready.
func (c *client) waitReady(t *testing.T) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for c.do("GET", "/readyz", "", nil) != 200 {
		if time.Now().After(deadline) {
			t.Fatal("never ready")
		}
		time.Sleep(5 * time.Millisecond) // bounded poll of a condition
	}
}

func start(t *testing.T, cfg server.Config) (*server.Server, *client) {
	t.Helper()
	return startWith(t, cfg, server.Options{})
}

// startWith is start with options (a logger, an index of the test's own).
func startWith(t *testing.T, cfg server.Config, opts server.Options) (*server.Server, *client) {
	t.Helper()
	s, err := server.New(cfg, opts)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := s.Shutdown(ctx); err != nil {
			t.Error(err)
		}
	})
	return s, newClient(t, s.Addr())
}

func TestAPIErrorsAndProbes(t *testing.T) {
	cfg := server.Config{
		Listen:       "127.0.0.1:0",
		MaxBodyBytes: 256,
		Engines: []server.EngineConfig{
			{Endpoint: freeport.Endpoint(t), Model: "a", BlockSize: 4},
			{Endpoint: freeport.Endpoint(t), Model: "b", BlockSize: 4},
		},
		ReconnectMin: server.Duration(5 * time.Millisecond),
	}
	_, c := start(t, cfg)
	var e struct{ Error, Code string }
	for _, tc := range []struct {
		method, path, body string
		status             int
		code               string
	}{
		{"POST", "/v1/match", `{`, 400, "bad_json"},
		{"POST", "/v1/match", ``, 400, "bad_json"},
		{"POST", "/v1/match", `{"model":"a","tokens":[1],"x":1}`, 400, "bad_json"},
		{"POST", "/v1/match", `{"model":"a","tokens":[-1]}`, 400, "bad_json"},
		{"POST", "/v1/match", `{"model":"a","tokens":[1]} x`, 400, "bad_json"},
		{"POST", "/v1/match", `{"model":"a","tokens":[` + strings.Repeat("1,", 200) + `1]}`, 413, "body_too_large"},
		{"POST", "/v1/match", `{"tokens":[1,2,3,4]}`, 400, "unknown_model"},
		{"POST", "/v1/match", `{"model":"zzz","tokens":[1,2,3,4]}`, 400, "unknown_model"},
		{"POST", "/v1/match", `{"model":"a"}`, 400, "bad_query"},
		{"POST", "/v1/match", `{"model":"a","tokens":[1],"content_hashes":[1]}`, 400, "bad_query"},
		{"POST", "/v1/match", `{"model":"a","tokens":[1],"policy":"best"}`, 400, "bad_policy"},
		// The request's own fields are checked before its tokens are hashed: with bad
		// extra keys too, the policy or the weights are what is refused.
		{"POST", "/v1/match", `{"model":"a","tokens":[1,2,3,4],"extra_keys":[["a"],["b"]]}`, 400, "bad_extra_keys"},
		{"POST", "/v1/match", `{"model":"a","tokens":[1,2,3,4],"extra_keys":[["a"],["b"]],"policy":"best"}`, 400, "bad_policy"},
		{"POST", "/v1/match", `{"model":"a","tokens":[1,2,3,4],"extra_keys":[["a"],["b"]],"tier_weights":[1,2,0]}`, 400, "bad_tier_weights"},
		{"POST", "/v1/routed", `{"model":"a","tokens":[1,2,3,4],"extra_keys":[["a"],["b"]]}`, 400, "bad_worker"},
		{"POST", "/v1/match", `{"model":"a","tokens":[1],"namespace":"x","lora_name":"y"}`, 400, "bad_namespace"},
		{"POST", "/v1/match", `{"model":"a","content_hashes":["zz"]}`, 400, "bad_json"},
		{"POST", "/v1/match", `{"model":"a","model":"b","tokens":[1]}`, 400, "bad_json"},
		{"POST", "/v1/match", `{"model":"a","tokens":[1],"tokens":[2]}`, 400, "bad_json"},
		{"POST", "/v1/match", `{"model":"a","tokens":[1],"mod\u0065l":"a"}`, 400, "bad_json"},
		{"POST", "/v1/match", `{"model":"a","tokens":[1],"namespace":"bogus"}`, 400, "bad_namespace"},
		{"POST", "/v1/match", `{"model":"a","tokens":[1],"namespace":"lora="}`, 400, "bad_namespace"},
		{"POST", "/v1/match", `{"model":"a","tokens":[1],"namespace":"lora=x;pepper=y"}`, 400, "bad_namespace"},
		{"POST", "/v1/match", `{"model":"a","tokens":[1],"namespace":"salt=a%2"}`, 400, "bad_namespace"},
		{"POST", "/v1/match", `{"model":"a","tokens":[1],"namespace":"lora_id=x"}`, 400, "bad_namespace"},
		{"GET", "/v1/match", ``, 405, "method_not_allowed"},
		{"POST", "/v1/workers", ``, 405, "method_not_allowed"},
		{"GET", "/nope", ``, 404, "not_found"},
	} {
		e.Error, e.Code = "", ""
		if got := c.do(tc.method, tc.path, tc.body, &e); got != tc.status || e.Code != tc.code || e.Error == "" {
			t.Errorf("%s %s %.40q: %d %+v, want %d %s", tc.method, tc.path, tc.body, got, e, tc.status, tc.code)
		}
	}
	// A valid query against an empty index: no matches, no eligible worker to pick.
	var mr server.MatchResponse
	if got := c.do("POST", "/v1/match", `{"model":"a","content_hashes":[1,"2","0x3"]}`, &mr); got != 200 || mr.Blocks != 3 || len(mr.Matches) != 0 || mr.Pick != nil {
		t.Fatalf("match: %d %+v", got, mr)
	}
	if mr.Namespace != "model=a;" {
		t.Fatalf("namespace %q", mr.Namespace)
	}
	var health map[string]any
	if got := c.do("GET", "/healthz", "", &health); got != 200 || health["status"] != "ok" {
		t.Fatalf("healthz: %d %v", got, health)
	}
	var ready struct {
		Ready   bool
		Waiting []string
	}
	if got := c.do("GET", "/readyz", "", &ready); got != 503 || ready.Ready || len(ready.Waiting) != 2 {
		t.Fatalf("readyz: %d %+v", got, ready)
	}
	var workers struct{ Workers []server.WorkerInfo }
	if got := c.do("GET", "/v1/workers", "", &workers); got != 200 || len(workers.Workers) != 2 {
		t.Fatalf("workers: %d %+v", got, workers)
	}
	for _, w := range workers.Workers {
		if w.Synced || w.LastSeq != nil || (w.State != "connecting" && w.State != "disconnected") {
			t.Fatalf("worker %+v", w)
		}
	}
	m := c.text("/metrics")
	for _, want := range []string{
		"kvindex_find_matches_duration_seconds_count 1",
		`kvindex_http_requests_total{code="413",handler="match"} 1`,
		"kvindex_shard_queue_len{shard=\"0\"}",
		"kvindex_producer_waits_total",
		"kvindex_memberships 0",
		"kvindex_workers 0",
		`kvindex_worker_state{state="live",worker="`,
		`kvindex_events_rejected_total{reason="token_count_mismatch",worker="`,
		`kvindex_gaps_detected_total{worker="`,
		`kvindex_build_info{goversion="` + runtime.Version() + `",revision="`,
		`kvindex_replays_in_progress{state="running"} 0`,
		`kvindex_replays_in_progress{state="waiting"} 0`,
		"kvindex_replays_waited_total 0",
	} {
		if !strings.Contains(m, want) {
			t.Errorf("metrics lack %q", want)
		}
	}
}

// Every HTTP request is timed in its handler, by handler, refused ones included; the
// bucket bounds reach 10 s.
func TestHTTPRequestDurations(t *testing.T) {
	cfg := server.Config{
		Listen:       "127.0.0.1:0",
		Engines:      []server.EngineConfig{{Endpoint: freeport.Endpoint(t), Model: "a", BlockSize: 4}},
		ReconnectMin: server.Duration(5 * time.Millisecond),
	}
	_, c := start(t, cfg)
	var mr server.MatchResponse
	for range 2 {
		if got := c.do("POST", "/v1/match", `{"model":"a","tokens":[1,2,3,4]}`, &mr); got != 200 {
			t.Fatalf("match: %d", got)
		}
	}
	var e struct{ Error, Code string }
	if got := c.do("POST", "/v1/match", `{"model":"zz","tokens":[1]}`, &e); got != 400 {
		t.Fatalf("unknown model: %d %+v", got, e)
	}
	var workers struct{ Workers []server.WorkerInfo }
	if got := c.do("GET", "/v1/workers", "", &workers); got != 200 {
		t.Fatalf("workers: %d", got)
	}
	m := c.text("/metrics")
	for _, want := range []string{
		`kvindex_http_request_duration_seconds_count{handler="match"} 3`,
		`kvindex_http_request_duration_seconds_count{handler="workers"} 1`,
		`kvindex_http_request_duration_seconds_bucket{handler="match",le="10"} 3`,
		`kvindex_http_request_duration_seconds_bucket{handler="match",le="+Inf"} 3`,
	} {
		if !strings.Contains(m, want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
}

// TestEndToEnd runs serve's whole path against a publisher, on the sharded index and on
// the locked one (index.locked).
func TestEndToEnd(t *testing.T) {
	for _, index := range []string{`{"shards": 2}`, `{"locked": true}`} {
		t.Run(index, func(t *testing.T) { testEndToEnd(t, index) })
	}
}

func testEndToEnd(t *testing.T, index string) {
	pubtest.Require(t)
	pub, err := pubtest.Start(pubtest.Options{Ranks: 2, ConsecutivePorts: true, Bind: true})
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	cfgJSON := fmt.Sprintf(`{
		"listen": "127.0.0.1:0",
		"reconnect_min": "10ms",
		"reconnect_max": "100ms",
		"index": %s,
		"engines": [{"endpoint": %q, "replay_endpoint": %q, "worker": "pod-0", "model": "llama", "block_size": 4, "dp_ranks": 2}]
	}`, index, pub.Ranks[0].Endpoint, pub.Ranks[0].ReplayEndpoint)
	cfg, err := server.ParseConfig(strings.NewReader(cfgJSON))
	if err != nil {
		t.Fatal(err)
	}
	_, c := start(t, cfg)
	c.waitReady(t)
	toks := []uint32{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}
	p := func(v uint64) *uint64 { return &v }
	// Rank 0 holds 3 blocks of the prompt, rank 1 holds 1; rank 1 also holds the
	// prompt's first block under a LoRA adapter.
	seqs := []uint64{0, 0}
	for _, b := range []struct {
		rank int
		ev   pubtest.Event
	}{
		{0, pubtest.Event{Type: "BlockStored", BlockHashes: []uint64{11, 12}, TokenIDs: toks[:8], BlockSize: 4}},
		{0, pubtest.Event{Type: "BlockStored", BlockHashes: []uint64{13}, Parent: p(12), TokenIDs: toks[8:12], BlockSize: 4, Encoding: "map"}},
		{1, pubtest.Event{Type: "BlockStored", BlockHashes: []uint64{21}, TokenIDs: toks[:4], BlockSize: 4}},
		{1, pubtest.Event{Type: "BlockStored", BlockHashes: []uint64{22}, TokenIDs: toks[:4], BlockSize: 4, LoraName: "sql;v2"}},
		{1, pubtest.Event{Type: "BlockStored", BlockHashes: []uint64{23}, TokenIDs: toks[:3], BlockSize: 4}}, // token count mismatch
	} {
		seq, err := pub.Publish(b.rank, true, b.ev)
		if err != nil {
			t.Fatal(err)
		}
		seqs[b.rank] = seq
	}
	workers := waitCaughtUp(t, c, seqs)
	w0, w1 := workers.Workers[0], workers.Workers[1]
	if w0.Worker != "pod-0#dp0" || w1.Worker != "pod-0#dp1" || w0.State != "live" || w1.Model != "llama" {
		t.Fatalf("workers %+v", workers)
	}
	if w1.Rejected["token_count_mismatch"] != 1 || w0.Events.Stored != 2 {
		t.Fatalf("counters %+v %+v", w0, w1)
	}
	// The engine reports sizes (server.WorkerSizer).
	if w0.Size == nil || w1.Size == nil || *w0.Size != 3 || *w1.Size != 2 {
		t.Fatalf("sizes %v %v, want 3 and 2", w0.Size, w1.Size)
	}
	var mr server.MatchResponse
	body, _ := json.Marshal(map[string]any{"model": "llama", "tokens": append(toks, 99, 98)})
	if got := c.do("POST", "/v1/match", string(body), &mr); got != 200 {
		t.Fatalf("match: %d", got)
	}
	if mr.Blocks != 3 || len(mr.Matches) != 2 || mr.Matches[0].Worker != "pod-0#dp0" || mr.Matches[0].Score != 3 ||
		mr.Matches[0].Size != 3 || mr.Matches[1].Score != 1 || mr.Matches[1].Size != 2 || mr.Pick == nil || mr.Pick.Worker != "pod-0#dp0" {
		t.Fatalf("match: %+v", mr)
	}
	// The same by content hashes (as decimal strings), under the LoRA namespace.
	hs, _ := hash.Blocks(nil, toks, 4)
	body, _ = json.Marshal(map[string]any{"model": "llama", "lora_name": "sql;v2", "content_hashes": []string{fmt.Sprint(hs[0]), fmt.Sprint(hs[1])}})
	if got := c.do("POST", "/v1/match", string(body), &mr); got != 200 || len(mr.Matches) != 1 || mr.Matches[0].Worker != "pod-0#dp1" || mr.Matches[0].Score != 1 {
		t.Fatalf("lora match: %d %+v", got, mr)
	}
	// Round-robin ignores the cache.
	body, _ = json.Marshal(map[string]any{"model": "llama", "tokens": toks, "policy": "round-robin"})
	picks := map[string]bool{}
	for range 2 {
		c.do("POST", "/v1/match", string(body), &mr)
		picks[mr.Pick.Worker] = true
	}
	if len(picks) != 2 {
		t.Fatalf("round-robin picked %v", picks)
	}
	m := c.text("/metrics")
	for _, want := range []string{
		`kvindex_events_applied_total{kind="stored",worker="pod-0#dp0"} 2`,
		`kvindex_events_rejected_total{reason="token_count_mismatch",worker="pod-0#dp1"} 1`,
		`kvindex_worker_state{state="live",worker="pod-0#dp1"} 1`,
		"kvindex_workers 2",
		"kvindex_memberships ",
	} {
		if !strings.Contains(m, want) {
			t.Errorf("metrics lack %q", want)
		}
	}
}

func TestShutdownDrains(t *testing.T) {
	cfg := server.Config{Listen: "127.0.0.1:0", Engines: []server.EngineConfig{{Endpoint: freeport.Endpoint(t)}}}
	s, c := start(t, cfg)
	// A request whose body is still being sent when shutdown starts completes.
	pr, pw := io.Pipe()
	done := make(chan int, 1)
	go func() {
		resp, err := c.hc.Post(c.base+"/v1/match", "application/json", pr)
		if err != nil {
			done <- -1
			return
		}
		resp.Body.Close()
		done <- resp.StatusCode
	}()
	if _, err := pw.Write([]byte(`{"content_hashes":[1,`)); err != nil {
		t.Fatal(err)
	}
	// Wait until the server has the request in flight (the scrape counts itself).
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(c.text("/metrics"), "kvindex_http_in_flight_requests 2") {
		if time.Now().After(deadline) {
			t.Fatal("request never in flight")
		}
		time.Sleep(5 * time.Millisecond) // bounded poll of a condition
	}
	shut := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		shut <- s.Shutdown(ctx)
	}()
	// Finish the body only once shutdown is under way: it closes the listener first.
	for {
		conn, err := net.DialTimeout("tcp", s.Addr(), time.Second)
		if err != nil {
			break
		}
		conn.Close()
		if time.Now().After(deadline) {
			t.Fatal("shutdown never closed the listener")
		}
		time.Sleep(time.Millisecond) // bounded poll of a condition
	}
	if _, err := io.Copy(pw, bytes.NewReader([]byte(`2]}`))); err != nil {
		t.Fatal(err)
	}
	pw.Close()
	if code := <-done; code != 200 {
		t.Fatalf("in-flight request: %d", code)
	}
	if err := <-shut; err != nil {
		t.Fatal(err)
	}
	if _, err := c.hc.Get(c.base + "/healthz"); err == nil {
		t.Fatal("still serving after shutdown")
	}
}

// waitCaughtUp polls /v1/workers until worker i has applied sequence number seqs[i]
// (the listing has exactly len(seqs) workers), and returns that listing.
func waitCaughtUp(t *testing.T, c *client, seqs []uint64) (ws struct{ Workers []server.WorkerInfo }) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for {
		c.do("GET", "/v1/workers", "", &ws)
		done := len(ws.Workers) == len(seqs)
		for i, w := range ws.Workers {
			done = done && w.LastSeq != nil && *w.LastSeq == seqs[i]
		}
		if done {
			return ws
		}
		if time.Now().After(deadline) {
			t.Fatalf("workers never caught up to %v: %+v", seqs, ws)
		}
		time.Sleep(5 * time.Millisecond) // bounded poll of a condition
	}
}
