package server_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kvindex/kvindex/api/kvindexv1"
	"github.com/kvindex/kvindex/server"
)

func threeApproximate() server.Config {
	return server.Config{
		Listen: "127.0.0.1:0",
		Engines: []server.EngineConfig{
			{Worker: "a", Model: "m", BlockSize: 2}, {Worker: "b", Model: "m", BlockSize: 2}, {Worker: "c", Model: "m", BlockSize: 2},
		},
	}
}

// TestPickSpreadsIdenticalRequests: three identical requests routed with "pick": true
// under the cost policy land on three workers, because each one's load counts against
// the worker it went to; under longest-prefix with "record" they all land on one. The
// finished reports take the load back out.
func TestPickSpreadsIdenticalRequests(t *testing.T) {
	_, c := start(t, threeApproximate())
	body := `{"model":"m","tokens":[1,2,3,4,5,6,7,8],"policy":"%s","pick":true,"record":%v}`
	seen := map[string]bool{}
	var ids []string
	for range 3 {
		var resp server.MatchResponse
		if code := c.do("POST", "/v1/match", fmt.Sprintf(body, "cost", false), &resp); code != 200 || resp.Pick == nil {
			t.Fatalf("match: %d %+v", code, resp)
		}
		if resp.Pick.Policy != "dynamo-cost" || resp.Pick.RequestID == "" || !strings.Contains(resp.Pick.Reason, "least cost") {
			t.Fatalf("pick %+v", resp.Pick)
		}
		seen[resp.Pick.Worker] = true
		ids = append(ids, resp.Pick.RequestID)
	}
	if len(seen) != 3 {
		t.Fatalf("three identical requests went to %v, want three workers", seen)
	}
	for _, id := range ids {
		var fr server.FinishedResponse
		if code := c.do("POST", "/v1/finished", fmt.Sprintf(`{"request_id":%q}`, id), &fr); code != 200 || !fr.Known {
			t.Fatalf("finished %s: %d %+v", id, code, fr)
		}
		if code := c.do("POST", "/v1/finished", fmt.Sprintf(`{"request_id":%q}`, id), &fr); code != 200 || fr.Known {
			t.Fatalf("finished twice %s: %d %+v", id, code, fr)
		}
	}
	// The longest-prefix pick ignores load: recorded, the three land together.
	seen = map[string]bool{}
	for range 3 {
		var resp server.MatchResponse
		c.do("POST", "/v1/match", fmt.Sprintf(body, "longest-prefix", true), &resp)
		seen[resp.Pick.Worker] = true
	}
	if len(seen) != 1 {
		t.Fatalf("longest-prefix with record: %v, want one worker", seen)
	}
}

// TestPickUsesCallerLoad: the scorer reads the load the caller sends; the request id
// is the caller's when given, and a second pick under an id in flight is a 409.
func TestPickUsesCallerLoad(t *testing.T) {
	_, c := start(t, threeApproximate())
	var resp server.MatchResponse
	body := `{"model":"m","tokens":[1,2,3,4],"policy":"scorer","pick":true,"request_id":"r1",
		"load":{"a":{"waiting":9,"kv_util":0.9},"b":{"waiting":0,"kv_util":0.2},"c":{"waiting":4,"kv_util":0.5}}}`
	if code := c.do("POST", "/v1/match", body, &resp); code != 200 || resp.Pick == nil || resp.Pick.Worker != "b" || resp.Pick.RequestID != "r1" {
		t.Fatalf("match: %d %+v", code, resp.Pick)
	}
	var e struct{ Code string }
	if code := c.do("POST", "/v1/match", body, &e); code != http.StatusConflict || e.Code != "duplicate_request_id" {
		t.Fatalf("same id again: %d %+v", code, e)
	}
	// The cost policy reads the caller's active blocks too.
	body = `{"model":"m","tokens":[1,2,3,4],"policy":"cost","load":{"a":{"active_blocks":0},"b":{"active_blocks":50},"c":{"active_blocks":50}}}`
	resp = server.MatchResponse{}
	if code := c.do("POST", "/v1/match", body, &resp); code != 200 || resp.Pick.Worker != "a" || resp.Pick.RequestID != "" {
		t.Fatalf("cost with load: %d %+v", code, resp.Pick)
	}
}

// TestRoutedTracksLoad: POST /v1/routed with a request_id counts its load, which the
// cost policy then steers around, until /v1/finished.
func TestRoutedTracksLoad(t *testing.T) {
	_, c := start(t, threeApproximate())
	for i, w := range []string{"a", "b"} {
		var rr server.RoutedResponse
		body := fmt.Sprintf(`{"model":"m","worker":%q,"tokens":[%d,1,2,3,4,5,6,7,8,9],"request_id":"x%d"}`, w, 100+i, i)
		if code := c.do("POST", "/v1/routed", body, &rr); code != 200 {
			t.Fatalf("routed: %d", code)
		}
	}
	for range 4 {
		var resp server.MatchResponse
		c.do("POST", "/v1/match", `{"model":"m","tokens":[7,7,7,7],"policy":"cost"}`, &resp)
		if resp.Pick == nil || resp.Pick.Worker != "c" {
			t.Fatalf("with a and b loaded: %+v", resp.Pick)
		}
	}
	var fr server.FinishedResponse
	c.do("POST", "/v1/finished", `{"request_id":"x0","first_token":true}`, &fr)
	if !fr.Known {
		t.Fatal("first_token report: unknown")
	}
}

func TestPickRejects(t *testing.T) {
	_, c := start(t, threeApproximate())
	long := strings.Repeat("x", server.MaxRequestIDBytes+1)
	for _, tc := range []struct{ path, body, code string }{
		{"/v1/match", `{"model":"m","tokens":[1,2],"pick":"yes"}`, "bad_json"},
		{"/v1/match", `{"model":"m","tokens":[1,2],"pick":true,"pick":true}`, "bad_json"},
		{"/v1/match", `{"model":"m","tokens":[1,2],"load":[1]}`, "bad_json"},
		{"/v1/match", `{"model":"m","tokens":[1,2],"load":{"a":{"queue":1}}}`, "bad_load"},
		{"/v1/match", `{"model":"m","tokens":[1,2],"load":{"a":{"waiting":-1}}}`, "bad_load"},
		{"/v1/match", `{"model":"m","tokens":[1,2],"load":{"a":{"kv_util":2}}}`, "bad_load"},
		{"/v1/match", `{"model":"m","tokens":[1,2],"load":{"a":null}}`, "bad_load"},
		{"/v1/match", `{"model":"m","tokens":[1,2],"load":{"a":{"tokens":1e30}}}`, "bad_load"},
		{"/v1/match", `{"model":"m","tokens":[1,2],"pick":true,"request_id":"` + long + `"}`, "bad_request_id"},
		{"/v1/match", `{"model":"m","tokens":[1,2],"policy":"fastest"}`, "bad_policy"},
		{"/v1/routed", `{"model":"m","worker":"a","tokens":[1,2],"request_id":"` + long + `"}`, "bad_request_id"},
		{"/v1/routed", `{"model":"m","worker":"a","tokens":[1,2],"pick":true}`, "bad_json"},
		{"/v1/finished", `{}`, "bad_request_id"},
		{"/v1/finished", `{"request_id":"a","extra":1}`, "bad_json"},
		{"/v1/finished", `{"request_id":"a"} {}`, "bad_json"},
		{"/v1/finished", `{"request_id":"` + long + `"}`, "bad_request_id"},
	} {
		var e struct{ Code string }
		if code := c.do("POST", tc.path, tc.body, &e); code != http.StatusBadRequest || e.Code != tc.code {
			t.Errorf("%s %s: %d %q, want 400 %q", tc.path, tc.body, code, e.Code, tc.code)
		}
	}
}

// TestGRPCPick: the same over gRPC: Match with pick returns a request id, load steers,
// Finished knows it once.
func TestGRPCPick(t *testing.T) {
	f := startGRPC(t, threeApproximate())
	ctx := context.Background()
	seen := map[string]bool{}
	var ids []string
	for range 3 {
		resp, err := f.raw.Match(ctx, &kvindexv1.MatchRequest{Model: "m", Tokens: []uint32{1, 2, 3, 4}, Policy: "cost", Pick: true})
		if err != nil {
			t.Fatal(err)
		}
		seen[resp.GetPick().GetWorker()] = true
		ids = append(ids, resp.GetPick().GetRequestId())
	}
	if len(seen) != 3 || ids[0] == "" {
		t.Fatalf("picks %v, ids %v", seen, ids)
	}
	for _, id := range ids {
		fr, err := f.raw.Finished(ctx, &kvindexv1.FinishedRequest{RequestId: id})
		if err != nil || !fr.GetKnown() {
			t.Fatalf("finished %s: %v %v", id, fr, err)
		}
	}
	waiting := int32(5)
	none := int32(0)
	resp, err := f.raw.Match(ctx, &kvindexv1.MatchRequest{Model: "m", Tokens: []uint32{1, 2, 3, 4}, Policy: "scorer",
		Load: map[string]*kvindexv1.WorkerLoad{"a": {Waiting: &waiting}, "b": {Waiting: &waiting}, "c": {Waiting: &none}}})
	if err != nil || resp.GetPick().GetWorker() != "c" {
		t.Fatalf("scorer with load: %v %v", resp.GetPick(), err)
	}
	bad := 2.0
	_, err = f.raw.Match(ctx, &kvindexv1.MatchRequest{Model: "m", Tokens: []uint32{1, 2}, Load: map[string]*kvindexv1.WorkerLoad{"a": {KvUtil: &bad}}})
	if status.Code(err) != codes.InvalidArgument {
		t.Fatalf("kv_util 2: %v", err)
	}
	_, err = f.raw.Finished(ctx, &kvindexv1.FinishedRequest{})
	if status.Code(err) != codes.InvalidArgument {
		t.Fatalf("no request id: %v", err)
	}
	if _, err := f.raw.Match(ctx, &kvindexv1.MatchRequest{Model: "m", Tokens: []uint32{1, 2}, Pick: true, RequestId: "dup"}); err != nil {
		t.Fatal(err)
	}
	_, err = f.raw.Match(ctx, &kvindexv1.MatchRequest{Model: "m", Tokens: []uint32{1, 2}, Pick: true, RequestId: "dup"})
	if status.Code(err) != codes.AlreadyExists {
		t.Fatalf("duplicate request id: %v", err)
	}
	_, err = f.raw.Routed(ctx, &kvindexv1.RoutedRequest{Model: "m", Worker: "a", Tokens: []uint32{1, 2}, RequestId: "dup"})
	if status.Code(err) != codes.AlreadyExists {
		t.Fatalf("routed under an id in flight: %v", err)
	}
}

func TestRoutingConfigRejects(t *testing.T) {
	for _, r := range []server.RoutingConfig{{OverlapWeight: -1}, {PrefixWeight: 2e6}, {MaxInFlight: -5}, {InFlightTTL: -1}} {
		cfg := threeApproximate()
		cfg.Routing = r
		if err := cfg.Validate(); !errors.Is(err, server.ErrConfig) {
			t.Errorf("%+v: %v, want ErrConfig", r, err)
		}
	}
	cfg := threeApproximate()
	cfg.Policy = server.PolicyCost
	if err := cfg.Validate(); err != nil {
		t.Fatalf("policy cost: %v", err)
	}
}

// TestLongestPrefixIsRoutes: serve's longest-prefix is route.LongestPrefix, uncapped:
// the worker holding the longest prefix wins whatever its load; a prompt nobody holds
// goes to the fewest requests in flight (three fresh prompts picked with "pick": true
// land on three workers); equal prompts get equal picks.
func TestLongestPrefixIsRoutes(t *testing.T) {
	_, c := start(t, threeApproximate())
	match := func(body string) *server.Pick {
		t.Helper()
		var resp server.MatchResponse
		if code := c.do("POST", "/v1/match", body, &resp); code != 200 || resp.Pick == nil {
			t.Fatalf("match %s: %d %+v", body, code, resp)
		}
		return resp.Pick
	}
	seen := map[string]bool{}
	for i := range 3 {
		p := match(fmt.Sprintf(`{"model":"m","tokens":[%d,1,2,3],"policy":"longest-prefix","pick":true}`, 10+i))
		if p.Reason != "no cached prefix: fewest requests in flight" {
			t.Fatalf("fresh prompt %d: %+v", i, p)
		}
		seen[p.Worker] = true
	}
	if len(seen) != 3 {
		t.Fatalf("three fresh prompts went to %v, want three workers (the fewest in flight)", seen)
	}
	// b holds [7 7 7 7 7 7]: it wins though it carries a request in flight, as it
	// would carrying more than the others.
	var rr server.RoutedResponse
	if code := c.do("POST", "/v1/routed", `{"model":"m","worker":"b","tokens":[7,7,7,7,7,7]}`, &rr); code != 200 {
		t.Fatalf("routed: %d", code)
	}
	for range 3 {
		p := match(`{"model":"m","tokens":[7,7,7,7,7,7,7,7],"policy":"longest-prefix","pick":true}`)
		if p.Worker != "b" || p.Score != 3 || p.Reason != "longest cached prefix" {
			t.Fatalf("pick %+v, want b with 3 blocks", p)
		}
	}
	// Untracked, the same fresh prompt is picked alike every time.
	first := match(`{"model":"m","tokens":[9,9,9,9],"policy":"longest-prefix"}`).Worker
	for range 4 {
		if w := match(`{"model":"m","tokens":[9,9,9,9],"policy":"longest-prefix"}`).Worker; w != first {
			t.Fatalf("the same prompt went to %s, then %s", first, w)
		}
	}
}
