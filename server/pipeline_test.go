package server_test

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kvindex/kvindex/api/kvindexv1"
	"github.com/kvindex/kvindex/server"
)

// serverConfigForPipeline serves models m (4-token blocks) and other, with a worker
// without events in each (a in m, z in other), and queries of at most 8 blocks.
func serverConfigForPipeline() server.Config {
	return server.Config{MaxQueryBlocks: 8, Engines: []server.EngineConfig{
		{Worker: "a", Model: "m", BlockSize: 4}, {Worker: "z", Model: "other", BlockSize: 8}}}
}

// pipeReq is one request, written once and sent over both transports: as a /v1/match
// (or /v1/routed, with worker set) JSON body and as a gRPC MatchRequest (RoutedRequest).
type pipeReq struct {
	routed                                bool
	model, namespace, loraName, cacheSalt string
	tokens                                []uint32
	hashes                                []uint64
	policy                                string
	weights                               []float64
	topK                                  uint32
	requestID                             string
	pick                                  bool
	kvUtil                                *float64 // load of worker "a"
	waiting                               *int32   // load of worker "a"
	worker                                string
	ttlMs                                 uint32
}

func (r pipeReq) body() string {
	b := map[string]any{}
	set := func(k string, v any, ok bool) {
		if ok {
			b[k] = v
		}
	}
	set("model", r.model, r.model != "")
	set("namespace", r.namespace, r.namespace != "")
	set("lora_name", r.loraName, r.loraName != "")
	set("cache_salt", r.cacheSalt, r.cacheSalt != "")
	set("tokens", r.tokens, r.tokens != nil)
	set("content_hashes", r.hashes, r.hashes != nil)
	set("request_id", r.requestID, r.requestID != "")
	if r.routed {
		set("worker", r.worker, r.worker != "")
		set("ttl_ms", r.ttlMs, r.ttlMs != 0)
	} else {
		set("policy", r.policy, r.policy != "")
		set("tier_weights", r.weights, r.weights != nil)
		set("top_k", r.topK, r.topK != 0)
		set("pick", r.pick, r.pick)
		load := map[string]any{}
		if r.kvUtil != nil {
			load["kv_util"] = *r.kvUtil
		}
		if r.waiting != nil {
			load["waiting"] = *r.waiting
		}
		set("load", map[string]any{"a": load}, len(load) > 0)
	}
	out, err := json.Marshal(b)
	if err != nil {
		panic(err)
	}
	return string(out)
}

func (r pipeReq) send(ctx context.Context, c kvindexv1.IndexClient) error {
	if r.routed {
		_, err := c.Routed(ctx, &kvindexv1.RoutedRequest{Model: r.model, Namespace: r.namespace, LoraName: r.loraName, CacheSalt: r.cacheSalt,
			Worker: r.worker, Tokens: r.tokens, ContentHashes: r.hashes, TtlMs: r.ttlMs, RequestId: r.requestID})
		return err
	}
	req := &kvindexv1.MatchRequest{Model: r.model, Namespace: r.namespace, LoraName: r.loraName, CacheSalt: r.cacheSalt,
		Tokens: r.tokens, ContentHashes: r.hashes, Policy: r.policy, TierWeights: r.weights, TopK: r.topK,
		RequestId: r.requestID, Pick: r.pick}
	if r.kvUtil != nil || r.waiting != nil {
		req.Load = map[string]*kvindexv1.WorkerLoad{"a": {KvUtil: r.kvUtil, Waiting: r.waiting}}
	}
	_, err := c.Match(ctx, req)
	return err
}

// grpcCodeOf is the gRPC code the pipeline gives with an HTTP refusal.
func grpcCodeOf(httpStatus int, code string) codes.Code {
	switch {
	case httpStatus == http.StatusBadRequest:
		return codes.InvalidArgument
	case httpStatus == http.StatusConflict:
		return codes.AlreadyExists
	case code == "namespaces_full" || code == "too_many_in_flight":
		return codes.ResourceExhausted
	case httpStatus == http.StatusServiceUnavailable:
		return codes.Unavailable
	}
	return codes.Internal
}

// TestPipelineSameOverHTTPAndGRPC: a bad request gets the same refusal over HTTP and
// gRPC, one row per check of the match and routed pipeline (match.go) in its order:
// the same message, the HTTP code the row names and the gRPC code that goes with it; a
// request bad in several ways is refused for the same first reason over both. The
// good answers are compared field by field in TestGRPCMatchEqualsHTTP.
func TestPipelineSameOverHTTPAndGRPC(t *testing.T) {
	f := startGRPC(t, serverConfigForPipeline())
	ctx := context.Background()
	f64 := func(v float64) *float64 { return &v }
	i32 := func(v int32) *int32 { return &v }
	tok := []uint32{1, 2, 3, 4, 5, 6, 7, 8}
	same := func(t *testing.T, req pipeReq, st int, code, msg string) {
		t.Helper()
		gs := status.Convert(req.send(ctx, f.raw))
		if gs.Code() != grpcCodeOf(st, code) || gs.Message() != msg {
			t.Fatalf("gRPC %v %q; HTTP %d %s %q", gs.Code(), gs.Message(), st, code, msg)
		}
	}
	for _, tc := range []struct {
		name string
		req  pipeReq
		code string // the HTTP body's code
	}{
		{"model required", pipeReq{tokens: tok}, "unknown_model"},
		{"unknown model", pipeReq{model: "nope", tokens: tok}, "unknown_model"},
		{"namespace and lora_name", pipeReq{model: "m", namespace: "lora=a", loraName: "a", tokens: tok}, "bad_namespace"},
		{"namespace malformed", pipeReq{model: "m", namespace: "x=1", tokens: tok}, "bad_namespace"},
		{"namespace too long", pipeReq{model: "m", cacheSalt: strings.Repeat("s", 2000), tokens: tok}, "bad_namespace"},
		{"no query", pipeReq{model: "m"}, "bad_query"},
		{"tokens and hashes", pipeReq{model: "m", tokens: tok, hashes: []uint64{1}}, "bad_query"},
		{"tokens too long", pipeReq{model: "m", tokens: make([]uint32, 4*9)}, "query_too_long"},
		{"hashes too long", pipeReq{model: "m", hashes: make([]uint64, 9)}, "query_too_long"},
		{"unknown policy", pipeReq{model: "m", tokens: tok, policy: "best"}, "bad_policy"},
		{"two weights", pipeReq{model: "m", tokens: tok, weights: []float64{1, 0.5}}, "bad_tier_weights"},
		{"four weights", pipeReq{model: "m", tokens: tok, weights: []float64{1, 0.5, 0, 0}}, "bad_tier_weights"},
		{"weight out of range", pipeReq{model: "m", tokens: tok, weights: []float64{1, 1.5, 0}}, "bad_tier_weights"},
		{"top_k too large", pipeReq{model: "m", tokens: tok, topK: 1<<20 + 1}, "bad_top_k"},
		{"request_id too long", pipeReq{model: "m", tokens: tok, requestID: strings.Repeat("r", 257)}, "bad_request_id"},
		{"load kv_util", pipeReq{model: "m", tokens: tok, kvUtil: f64(2)}, "bad_load"},
		{"load waiting", pipeReq{model: "m", tokens: tok, waiting: i32(-1)}, "bad_load"},
		{"load and request_id", pipeReq{model: "m", tokens: tok, kvUtil: f64(2), requestID: strings.Repeat("r", 257)}, "bad_request_id"},
		{"bad in three ways", pipeReq{model: "m", tokens: tok, policy: "best", weights: []float64{2, 0, 0}, requestID: strings.Repeat("r", 257)}, "bad_policy"},
		{"routed: unknown model", pipeReq{routed: true, model: "nope", worker: "a", tokens: tok}, "unknown_model"},
		{"routed: no query", pipeReq{routed: true, model: "m", worker: "a"}, "bad_query"},
		{"routed: no worker", pipeReq{routed: true, model: "m", tokens: tok}, "bad_worker"},
		{"routed: another model's worker", pipeReq{routed: true, model: "m", worker: "z", tokens: tok}, "unknown_worker"},
		{"routed: ttl too long", pipeReq{routed: true, model: "m", worker: "a", tokens: tok, ttlMs: 600001}, "bad_ttl"},
		{"routed: request_id too long", pipeReq{routed: true, model: "m", worker: "a", tokens: tok, requestID: strings.Repeat("r", 257)}, "bad_request_id"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := "/v1/match"
			if tc.req.routed {
				path = "/v1/routed"
			}
			var e struct{ Error, Code string }
			st := f.http.do("POST", path, tc.req.body(), &e)
			if e.Code != tc.code {
				t.Fatalf("HTTP %d %+v, want code %s", st, e, tc.code)
			}
			same(t, tc.req, st, e.Code, e.Error)
		})
	}
	// A request id counted twice: the second pick is refused alike.
	for _, tr := range []string{"http", "grpc"} {
		req := pipeReq{model: "m", tokens: tok, pick: true, requestID: "dup-" + tr}
		var e struct{ Error, Code string }
		if tr == "http" {
			for i, want := range []int{http.StatusOK, http.StatusConflict} {
				if st := f.http.do("POST", "/v1/match", req.body(), &e); st != want {
					t.Fatalf("HTTP pick %d: %d %+v, want %d", i, st, e, want)
				}
			}
			if e.Code != "duplicate_request_id" || e.Error != "request_id is already in flight" {
				t.Fatalf("HTTP duplicate: %+v", e)
			}
			continue
		}
		if err := req.send(ctx, f.raw); err != nil {
			t.Fatal(err)
		}
		gs := status.Convert(req.send(ctx, f.raw))
		if gs.Code() != codes.AlreadyExists || gs.Message() != "request_id is already in flight" {
			t.Fatalf("gRPC duplicate: %v", gs)
		}
	}
	// A finished report's request id, checked alike.
	for _, id := range []string{"", strings.Repeat("r", 257)} {
		var e struct{ Error, Code string }
		body, _ := json.Marshal(map[string]string{"request_id": id})
		st := f.http.do("POST", "/v1/finished", string(body), &e)
		gs := status.Convert(func() error { _, err := f.raw.Finished(ctx, &kvindexv1.FinishedRequest{RequestId: id}); return err }())
		if st != http.StatusBadRequest || e.Code != "bad_request_id" || gs.Code() != codes.InvalidArgument || gs.Message() != e.Error {
			t.Fatalf("finished %q: HTTP %d %+v, gRPC %v", id, st, e, gs)
		}
	}
	// The engine closed under the server: the engine step's refusal, alike.
	if err := f.index.Close(); err != nil {
		t.Fatal(err)
	}
	for _, req := range []pipeReq{{model: "m", tokens: tok}, {routed: true, model: "m", worker: "a", tokens: tok}} {
		path := map[bool]string{false: "/v1/match", true: "/v1/routed"}[req.routed]
		var e struct{ Error, Code string }
		if st := f.http.do("POST", path, req.body(), &e); st != http.StatusServiceUnavailable || e.Code != "unavailable" {
			t.Fatalf("%s on a closed index: %d %+v", path, st, e)
		} else {
			same(t, req, st, e.Code, e.Error)
		}
	}
}
