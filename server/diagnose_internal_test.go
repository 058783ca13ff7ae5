package server

import (
	"bytes"
	"context"
	"encoding/hex"
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"
	"time"

	kvindexv1 "github.com/kvindex/kvindex/api/kvindexv1"
	"github.com/kvindex/kvindex/engine"
	"github.com/kvindex/kvindex/hash"
	"github.com/kvindex/kvindex/kvevents"
	"github.com/kvindex/kvindex/server/internal/wire"
	"github.com/kvindex/kvindex/subscriber"
)

// In-process tests of the server's diagnostics on a fake clock: the server is built but
// not started (its subscriber never connects), and blocks are stored into its index
// directly under the subscriber's worker id, as the subscriber would. trust.off keeps
// the never-connected worker scored from the index (trust_test.go has the fallback).

type clock struct{ t time.Time }

func (c *clock) now() time.Time { return c.t }

func newDiagServer(t *testing.T, logTo *bytes.Buffer) (*Server, *clock) {
	t.Helper()
	cfg := Config{Engines: []EngineConfig{{Endpoint: "tcp://127.0.0.1:1", Worker: "pod-0", Model: "m", BlockSize: 4}}, Trust: TrustConfig{Off: true}}
	opts := Options{}
	if logTo != nil {
		opts.Logger = slog.New(slog.NewTextHandler(logTo, nil))
	}
	s, err := New(cfg, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Shutdown(context.Background()) })
	clk := &clock{t: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	s.now = clk.now
	return s, clk
}

func store(t *testing.T, s *Server, contents ...uint64) {
	t.Helper()
	storeIn(t, s, "", contents...)
}

func storeIn(t *testing.T, s *Server, ns string, contents ...uint64) {
	t.Helper()
	ev := engine.Event{Kind: engine.EventStored, Worker: "pod-0", Namespace: subscriber.Namespace("m", ns)}
	for i, c := range contents {
		ev.Blocks = append(ev.Blocks, engine.Block{Content: c, Seq: uint64(1000 + i)})
	}
	if err := s.eng.Apply(&ev); err != nil {
		t.Fatal(err)
	}
	if err := s.eng.Barrier(context.Background()); err != nil {
		t.Fatal(err)
	}
}

func post(t *testing.T, s *Server, body string) (int, MatchResponse) {
	t.Helper()
	rec := httptest.NewRecorder()
	s.Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/v1/match", strings.NewReader(body)))
	var resp MatchResponse
	if rec.Code == http.StatusOK {
		if err := json.Unmarshal(rec.Body.Bytes(), &resp); err != nil {
			t.Fatal(err)
		}
	}
	return rec.Code, resp
}

func models(t *testing.T, s *Server) []ModelInfo {
	t.Helper()
	rec := httptest.NewRecorder()
	s.Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/v1/workers", nil))
	var out struct {
		Workers []WorkerInfo `json:"workers"`
		Models  []ModelInfo  `json:"models"`
	}
	if err := json.Unmarshal(rec.Body.Bytes(), &out); err != nil {
		t.Fatal(err)
	}
	if len(out.Workers) != 1 || out.Workers[0].Diagnostics == nil || out.Workers[0].Diagnostics.Problems == nil {
		t.Fatalf("workers %+v: want one with a diagnostics object", out.Workers)
	}
	return out.Models
}

var toksA = `[1,2,3,4,5,6,7,8]`

// TestGRPCMatchFeedsDiagnostics: a gRPC Match counts toward the model's queries and
// unmatched rate exactly as POST /v1/match does.
func TestGRPCMatchFeedsDiagnostics(t *testing.T) {
	s, _ := newDiagServer(t, nil)
	store(t, s, hash.Content([]uint32{1, 2, 3, 4}))
	g := &grpcService{s: s}
	for _, toks := range [][]uint32{{1, 2, 3, 4}, {9, 9, 9, 9}, {9, 9, 9, 9}} {
		if _, err := g.Match(context.Background(), &kvindexv1.MatchRequest{Tokens: toks}); err != nil {
			t.Fatal(err)
		}
	}
	if m := models(t, s); len(m) != 1 || m[0].Queries != 3 || m[0].Unmatched != 2 {
		t.Fatalf("models %+v", m)
	}
}

func TestUnmatchedQueries(t *testing.T) {
	// Healthy: the router's tokens are the engine's.
	s, _ := newDiagServer(t, nil)
	store(t, s, hash.Content([]uint32{1, 2, 3, 4}), hash.Content([]uint32{5, 6, 7, 8}))
	for range DefaultMinQueries {
		if code, resp := post(t, s, `{"tokens":`+toksA+`}`); code != 200 || len(resp.Matches) != 1 {
			t.Fatalf("%d %+v", code, resp)
		}
	}
	if m := models(t, s); len(m) != 1 || m[0].Queries != DefaultMinQueries || m[0].Unmatched != 0 || len(m[0].Problems) != 0 {
		t.Fatalf("models %+v", m)
	}

	// Other tokens (another tokenizer or chat template) while the worker holds blocks.
	s, clk := newDiagServer(t, nil)
	store(t, s, hash.Content([]uint32{1, 2, 3, 4}))
	for i := range DefaultMinQueries {
		if i == DefaultMinQueries-1 {
			if m := models(t, s); len(m[0].Problems) != 0 {
				t.Fatalf("reported before MinSamples queries: %+v", m)
			}
		}
		post(t, s, `{"tokens":[9,9,9,9]}`)
	}
	m := models(t, s)
	if m[0].Unmatched != DefaultMinQueries || len(m[0].Problems) != 1 || m[0].Problems[0].Code != ProblemUnmatchedQueries {
		t.Fatalf("models %+v", m)
	}
	metrics := scrape(t, s)
	for _, want := range []string{`kvindex_model_problem{model="m",problem="unmatched_queries"} 1`,
		`kvindex_model_queries_unmatched_total{model="m"} 20`,
		`kvindex_worker_problem{model="m",problem="no_events",worker="pod-0"} 0`} {
		if !strings.Contains(metrics, want) {
			t.Fatalf("metrics lack %s", want)
		}
	}
	clk.t = clk.t.Add(2 * subscriber.DefaultDiagWindow) // over once the misses stop
	if m := models(t, s); len(m[0].Problems) != 0 {
		t.Fatalf("models %+v", m)
	}

	// An empty index: misses are expected, nothing is counted.
	s, _ = newDiagServer(t, nil)
	for range 2 * DefaultMinQueries {
		post(t, s, `{"tokens":[9,9,9,9]}`)
	}
	if m := models(t, s); m[0].Unmatched != 0 || len(m[0].Problems) != 0 {
		t.Fatalf("models %+v", m)
	}
}

func scrape(t *testing.T, s *Server) string {
	t.Helper()
	rec := httptest.NewRecorder()
	s.Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	return rec.Body.String()
}

// The log line: once when a problem appears, again only after LogInterval, and a
// "resolved" line when it is over.
func TestProblemLogRateLimited(t *testing.T) {
	var buf bytes.Buffer
	s, clk := newDiagServer(t, &buf)
	store(t, s, hash.Content([]uint32{1, 2, 3, 4}))
	s.logProblems(clk.t)
	if buf.Len() != 0 {
		t.Fatalf("healthy server logged %q", buf.String())
	}
	for range DefaultMinQueries {
		post(t, s, `{"tokens":[9,9,9,9]}`)
	}
	count := func() int { return strings.Count(buf.String(), "problem=unmatched_queries") }
	s.logProblems(clk.t)
	clk.t = clk.t.Add(10 * time.Second)
	s.logProblems(clk.t)
	if count() != 1 {
		t.Fatalf("logged %d times, want 1:\n%s", count(), buf.String())
	}
	clk.t = clk.t.Add(DefaultLogInterval) // still going a LogInterval later
	for range DefaultMinQueries {
		post(t, s, `{"tokens":[9,9,9,9]}`)
	}
	s.logProblems(clk.t)
	if count() != 2 || !strings.Contains(buf.String(), "hint=") {
		t.Fatalf("logged %d times, want 2:\n%s", count(), buf.String())
	}
	clk.t = clk.t.Add(3 * subscriber.DefaultDiagWindow)
	s.logProblems(clk.t)
	if !strings.Contains(buf.String(), `msg="problem resolved" model=m`) || !strings.Contains(buf.String(), "problem="+ProblemUnmatchedQueries) {
		t.Fatalf("no resolved line:\n%s", buf.String())
	}
}

type vectors struct {
	Chains []struct {
		Name       string   `json:"name"`
		BlockSize  int      `json:"block_size"`
		Tokens     []uint32 `json:"tokens"`
		LoraName   *string  `json:"lora_name"`
		ExtraKeys  []any    `json:"extra_keys"`
		Contents   []string `json:"contents"`
		PayloadInt string   `json:"payload_int"`
	} `json:"chains"`
}

func loadVectors(t *testing.T) vectors {
	t.Helper()
	b, err := os.ReadFile("../testdata/vllmhash/vectors.json")
	if err != nil {
		t.Fatal(err)
	}
	var v vectors
	if err := json.Unmarshal(b, &v); err != nil {
		t.Fatal(err)
	}
	return v
}

// requestKeys turns a vector's extra keys (vLLM's, with the LoRA name first) into a
// request's extra_keys (without it), in the documented JSON shape.
func requestKeys(t *testing.T, keys []any, lora *string) string {
	t.Helper()
	out := make([]any, len(keys))
	for i, k := range keys {
		list, _ := k.([]any)
		if lora != nil && len(list) > 0 && list[0] == *lora {
			list = list[1:]
		}
		for j, e := range list {
			if m, ok := e.(map[string]any); ok {
				list[j] = map[string]any{"bytes_hex": m["bytes"]}
			}
		}
		out[i] = list
	}
	b, err := json.Marshal(out)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// The content hashes a request's extra keys give are the vectors' (computed in Python
// from the definition), for every shape of key; so they equal what the decoder computes
// from the engine's events.
func TestExtraKeysVectors(t *testing.T) {
	for _, c := range loadVectors(t).Chains {
		if c.ExtraKeys == nil {
			continue
		}
		keys, err := wire.ParseExtraKeys([]byte(requestKeys(t, c.ExtraKeys, c.LoraName)), len(c.Contents))
		if err != nil {
			t.Fatalf("%s: %v", c.Name, err)
		}
		got := wire.ContentsWithKeys(nil, c.Tokens, c.BlockSize, keys)
		for i, want := range c.Contents {
			if s := strconvU(got[i]); s != want {
				t.Errorf("%s: block %d content %s, want %s", c.Name, i, s, want)
			}
		}
	}
}

func strconvU(v uint64) string { b, _ := json.Marshal(v); return string(b) }

// A multimodal prompt stored from the engine's event matches the same prompt with the
// same image, and not the same placeholder tokens with another image or with none.
func TestMultimodalMatch(t *testing.T) {
	var img vectors
	for _, c := range loadVectors(t).Chains {
		if c.Name == "image-a" || c.Name == "image-b" {
			img.Chains = append(img.Chains, c)
		}
	}
	a := img.Chains[0]
	payload, err := hex.DecodeString(a.PayloadInt)
	if err != nil {
		t.Fatal(err)
	}
	var b kvevents.Batch
	d, _ := kvevents.New(kvevents.Config{BlockSize: 4})
	if err := d.Decode(payload, &b); err != nil || len(b.Events) != 1 {
		t.Fatalf("decode: %v %v", err, b.Rejected)
	}
	s, _ := newDiagServer(t, nil)
	store(t, s, b.Events[0].Contents...)

	tokens, _ := json.Marshal(a.Tokens)
	for _, tc := range []struct {
		name, extra string
		score       int
	}{
		{"same image", requestKeys(t, a.ExtraKeys, nil), 3},
		{"other image", requestKeys(t, img.Chains[1].ExtraKeys, nil), 0},
		{"no keys", "null", 0},
		{"first block only", `[["` + a.ExtraKeys[0].([]any)[0].(string) + `"]]`, 1},
	} {
		code, resp := post(t, s, `{"tokens":`+string(tokens)+`,"extra_keys":`+tc.extra+`}`)
		score := 0
		if len(resp.Matches) > 0 {
			score = resp.Matches[0].Score
		}
		if code != 200 || score != tc.score {
			t.Errorf("%s: %d score %d, want %d (%+v)", tc.name, code, score, tc.score, resp)
		}
	}
	for _, bad := range []string{`{"tokens":[1,2,3,4],"extra_keys":[["a"],["b"]]}`, `{"tokens":[1,2,3,4],"extra_keys":[1.5]}`,
		`{"tokens":[1,2,3,4],"extra_keys":[[1.5]]}`, `{"tokens":[1,2,3,4],"extra_keys":[[{"x":1}]]}`,
		`{"content_hashes":[1],"extra_keys":[["a"]]}`, `{"tokens":[1,2,3,4],"extra_keys":[[[[[[[[[[["a"]]]]]]]]]]]}`,
		`{"tokens":[1,2,3,4],"extra_keys":[["a"]`} {
		if code, _ := post(t, s, bad); code != http.StatusBadRequest {
			t.Errorf("%s: %d, want 400", bad, code)
		}
	}
}

func TestDiagnoseConfig(t *testing.T) {
	good := `{"engines":[{"endpoint":"tcp://h:1","kv_groups":[0],"hash_check":{"seed":"0","sample_every":4}}],
		"diagnose":{"no_events_after":"30s","idle_after":"1m","window":"10s","parent_miss_rate":0.1,"unmatched_rate":0.5,"min_samples":3,"log_interval":"1m"}}`
	c, err := ParseConfig(strings.NewReader(good))
	if err != nil {
		t.Fatal(err)
	}
	subs, err := c.SubscriberConfigs()
	if err != nil {
		t.Fatal(err)
	}
	sc := subs[0]
	if !sc.HashCheck.Enabled || sc.HashCheck.Seed != "0" || sc.HashCheck.SampleEvery != 4 || len(sc.Groups.Groups) != 1 ||
		sc.Diagnose.Window != 10*time.Second || sc.Diagnose.MinSamples != 3 {
		t.Fatalf("subscriber config %+v", sc)
	}
	for _, bad := range []string{
		`{"engines":[{"endpoint":"tcp://h:1","hash_check":{"seed":"0","sample_every":-1}}]}`,
		`{"engines":[{"endpoint":"tcp://h:1","kv_groups":[-1]}]}`,
		`{"engines":[{"endpoint":"tcp://h:1"}],"diagnose":{"window":"1ms"}}`,
		`{"engines":[{"endpoint":"tcp://h:1"}],"diagnose":{"unmatched_rate":2}}`,
		`{"engines":[{"endpoint":"tcp://h:1"}],"diagnose":{"bogus":1}}`,
	} {
		if _, err := ParseConfig(strings.NewReader(bad)); err == nil {
			t.Errorf("%s accepted", bad)
		}
	}
}

// LoRA names keep their namespace with extra keys: vLLM puts the adapter name first in
// every block's extra keys; the decoder leaves it out of the content and in the
// namespace, and a request names it with lora_name.
func TestMultimodalLoRANamespace(t *testing.T) {
	var c *struct {
		Name       string   `json:"name"`
		BlockSize  int      `json:"block_size"`
		Tokens     []uint32 `json:"tokens"`
		LoraName   *string  `json:"lora_name"`
		ExtraKeys  []any    `json:"extra_keys"`
		Contents   []string `json:"contents"`
		PayloadInt string   `json:"payload_int"`
	}
	v := loadVectors(t)
	for i := range v.Chains {
		if v.Chains[i].Name == "lora-image-salt" {
			c = &v.Chains[i]
		}
	}
	payload, err := hex.DecodeString(c.PayloadInt)
	if err != nil {
		t.Fatal(err)
	}
	var b kvevents.Batch
	d, _ := kvevents.New(kvevents.Config{BlockSize: 4})
	if err := d.Decode(payload, &b); err != nil || len(b.Events) != 1 {
		t.Fatalf("decode: %v %v", err, b.Rejected)
	}
	ev := b.Events[0]
	if ev.Namespace != "lora=sql-lora" {
		t.Fatalf("namespace %q", ev.Namespace)
	}
	s, _ := newDiagServer(t, nil)
	storeIn(t, s, ev.Namespace, ev.Contents...)
	tokens, _ := json.Marshal(c.Tokens)
	keys := requestKeys(t, c.ExtraKeys, c.LoraName)
	for _, tc := range []struct {
		name, extra string
		score       int
	}{
		{`"lora_name":"sql-lora"`, keys, 3},
		{`"lora_name":"other"`, keys, 0},
		{`"namespace":""`, keys, 0},
	} {
		_, resp := post(t, s, `{"tokens":`+string(tokens)+`,`+tc.name+`,"extra_keys":`+tc.extra+`}`)
		score := 0
		if len(resp.Matches) > 0 {
			score = resp.Matches[0].Score
		}
		if score != tc.score {
			t.Errorf("%s: score %d, want %d", tc.name, score, tc.score)
		}
	}
}
