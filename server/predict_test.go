package server_test

import (
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/kvindex/kvindex/hash"
	"github.com/kvindex/kvindex/server"
)

// TestApproximateEngines serves two engines that publish no events: the index knows
// them only through predictions, recorded by /v1/routed and by "record" on /v1/match.
func TestApproximateEngines(t *testing.T) {
	cfg := server.Config{
		Listen: "127.0.0.1:0",
		Engines: []server.EngineConfig{
			{Worker: "a", Model: "m", BlockSize: 2},
			{Worker: "b", Model: "m", BlockSize: 2},
		},
	}
	_, c := start(t, cfg)
	var ready map[string]any
	if code := c.do("GET", "/readyz", "", &ready); code != http.StatusOK {
		t.Fatalf("readyz %d %v: engines without events have nothing to wait for", code, ready)
	}
	var resp server.MatchResponse
	// Nothing predicted yet: round-robin over both, recorded.
	if code := c.do("POST", "/v1/match", `{"model":"m","tokens":[1,2,3,4,5,6],"record":true}`, &resp); code != 200 {
		t.Fatalf("match: %d", code)
	}
	if resp.Pick == nil || !resp.Recorded || len(resp.Matches) != 0 {
		t.Fatalf("first match: %+v", resp)
	}
	first := resp.Pick.Worker
	// A sibling request follows the first one: all of its score predicted.
	c.do("POST", "/v1/match", `{"model":"m","tokens":[1,2,3,4,9,9]}`, &resp)
	if resp.Pick == nil || resp.Pick.Worker != first || len(resp.Matches) != 1 ||
		resp.Matches[0] != (server.Match{Worker: first, Score: 2, Tiers: [3]int{2, 2, 2}, Weighted: 2, Predicted: 2, State: "approximate", Trust: "approximate"}) {
		t.Fatalf("sibling: %+v", resp)
	}
	// POST /v1/routed records the caller's own decision, in content hashes too.
	h, _ := hash.Blocks(nil, []uint32{7, 7, 8, 8}, 2)
	var rr server.RoutedResponse
	body := fmt.Sprintf(`{"model":"m","worker":"b","content_hashes":[%d,"%d"],"ttl_ms":60000}`, h[0], h[1])
	if code := c.do("POST", "/v1/routed", body, &rr); code != 200 || rr != (server.RoutedResponse{Model: "m", Namespace: "model=m;", Worker: "b", Blocks: 2, TTLms: 60000}) {
		t.Fatalf("routed: %d %+v", code, rr)
	}
	c.do("POST", "/v1/match", `{"model":"m","tokens":[7,7,8,8,1]}`, &resp)
	if resp.Pick == nil || resp.Pick.Worker != "b" || resp.Pick.Score != 2 {
		t.Fatalf("after routed: %+v", resp)
	}
	if m := c.text("/metrics"); !strings.Contains(m, "kvindex_predictions 2") || !strings.Contains(m, "kvindex_predicted_blocks 5") {
		t.Errorf("metrics: no prediction gauges of 2 predictions, 5 blocks")
	}
	var workers struct{ Workers []server.WorkerInfo }
	c.do("GET", "/v1/workers", "", &workers)
	if len(workers.Workers) != 2 || workers.Workers[0].State != "approximate" || workers.Workers[1].Worker != "b" {
		t.Fatalf("workers: %+v", workers)
	}
}

// TestRoutedRejects feeds /v1/routed the bodies a hostile or confused client sends.
func TestRoutedRejects(t *testing.T) {
	cfg := server.Config{
		Listen:       "127.0.0.1:0",
		MaxBodyBytes: 4096,
		Engines:      []server.EngineConfig{{Worker: "a", Model: "m", BlockSize: 2}, {Worker: "z", Model: "n", BlockSize: 2}},
	}
	_, c := start(t, cfg)
	for _, tc := range []struct{ body, code string }{
		{`{"model":"m","worker":"a","tokens":[1,2],"tokens":[3,4]}`, "bad_json"},          // duplicated key
		{`{"model":"m","worker":"a","worker":"a","tokens":[1,2]}`, "bad_json"},            // duplicated key
		{`{"model":"m","worker":"a","tokens":[1,2],"policy":"random"}`, "bad_json"},       // a match field
		{`{"model":"m","worker":"a","tokens":[1,2],"record":true}`, "bad_json"},           // a match field
		{`{"model":"m","worker":"a","tokens":[1,2],"ttl_ms":-1}`, "bad_json"},             // negative
		{`{"model":"m","worker":"a","tokens":[1,2],"ttl_ms":600001}`, "bad_ttl"},          // too long
		{`{"model":"m","worker":"a","tokens":[1,2],"ttl_ms":"5"}`, "bad_json"},            // a string
		{`{"model":"m","worker":"a","tokens":[1,2]} x`, "bad_json"},                       // trailing data
		{`{"model":"m","tokens":[1,2]}`, "bad_worker"},                                    // no worker
		{`{"model":"m","worker":"z","tokens":[1,2]}`, "unknown_worker"},                   // another model's
		{`{"model":"m","worker":"nobody","tokens":[1,2]}`, "unknown_worker"},              // not configured
		{`{"model":"m","worker":"a"}`, "bad_query"},                                       // no content
		{`{"model":"m","worker":"a","tokens":[1],"content_hashes":[1]}`, "bad_query"},     // both
		{`{"model":"x","worker":"a","tokens":[1,2]}`, "unknown_model"},                    // unknown model
		{`{"model":"m","worker":"a","tokens":[` + strings.Repeat("1,", 3000) + `1]}`, ""}, // over the body limit
	} {
		var e struct{ Code string }
		code := c.do("POST", "/v1/routed", tc.body, &e)
		if tc.code == "" {
			if code != http.StatusRequestEntityTooLarge {
				t.Errorf("%.60s: %d, want 413", tc.body, code)
			}
			continue
		}
		if code != http.StatusBadRequest || e.Code != tc.code {
			t.Errorf("%.60s: %d %q, want 400 %q", tc.body, code, e.Code, tc.code)
		}
	}
	// /v1/match refuses a duplicated key and routed's fields too.
	for _, body := range []string{
		`{"model":"m","tokens":[1,2],"tokens":[1,2]}`,
		`{"model":"m","tokens":[1,2],"worker":"a"}`,
		`{"model":"m","tokens":[1,2],"record":1}`,
	} {
		var e struct{ Code string }
		if code := c.do("POST", "/v1/match", body, &e); code != 400 || e.Code != "bad_json" {
			t.Errorf("match %s: %d %q", body, code, e.Code)
		}
	}
	if code := c.do("GET", "/v1/routed", "", nil); code != http.StatusMethodNotAllowed {
		t.Errorf("GET /v1/routed: %d", code)
	}
}
