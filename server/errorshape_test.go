package server_test

import (
	"regexp"
	"slices"
	"testing"

	"github.com/kvindex/kvindex/internal/freeport"
	"github.com/kvindex/kvindex/server"
)

// TestErrorShape: every JSON endpoint answers empty and invalid input with 400 and one
// shape, {"error": MESSAGE, "code": CODE}; an empty query is an error everywhere (not
// a pick from nothing); the same mistake has the same code on /v1/match and Mooncake's
// /query; and no message names a Go type or package.
func TestErrorShape(t *testing.T) {
	cfg := server.Config{Listen: "127.0.0.1:0", Engines: []server.EngineConfig{
		{Endpoint: freeport.Endpoint(t), Worker: "a", Model: "m", BlockSize: 4},
	}}
	_, c := start(t, cfg)
	goName := regexp.MustCompile(`Go (struct|value)|\bserver\.|\bstruct\b|\bmain\.|\*?\b(u?int(8|16|32|64)?|float64|\[\][a-z0-9]+)\b`)
	for _, tc := range []struct {
		path, body, code string
	}{
		// Empty bodies.
		{"/v1/match", ``, "bad_json"},
		{"/v1/routed", ``, "bad_json"},
		{"/v1/finished", ``, "bad_json"},
		{"/v1/engines", ``, "bad_json"},
		{"/register", ``, "bad_json"},
		{"/unregister", ``, "bad_json"},
		{"/query", ``, "bad_json"},
		{"/query_by_hash", ``, "bad_json"},
		// Empty queries.
		{"/v1/match", `{"model": "m", "tokens": []}`, "bad_query"},
		{"/v1/match", `{"model": "m", "content_hashes": []}`, "bad_query"},
		{"/v1/match", `{"model": "m"}`, "bad_query"},
		{"/v1/routed", `{"model": "m", "worker": "a", "tokens": []}`, "bad_query"},
		{"/query", `{"model": "m", "token_ids": []}`, "bad_query"},
		{"/query", `{"model": "m"}`, "bad_query"},
		{"/query_by_hash", `{"model": "m", "block_hashes": []}`, "bad_query"},
		// The same mistake, the same code.
		{"/v1/match", `{"model": "zz", "tokens": [1]}`, "unknown_model"},
		{"/query", `{"model": "zz", "token_ids": [1]}`, "unknown_model"},
		{"/query_by_hash", `{"model": "zz", "block_hashes": [1]}`, "unknown_model"},
		// A load entry for a worker the model does not have.
		{"/v1/match", `{"model": "m", "tokens": [1], "policy": "cost", "load": {"a": {}, "zz": {"waiting": 1}}}`, "unknown_worker"},
		// Values of the wrong JSON type.
		{"/v1/match", `{"model": "m", "tokens": ["x"]}`, "bad_json"},
		{"/query", `{"model": "m", "token_ids": ["x"]}`, "bad_json"},
		{"/query", `{"model": 7, "token_ids": [1]}`, "bad_json"},
		{"/query", `{"model": "m", "token_ids": [-1]}`, "bad_json"},
		{"/register", `{"endpoint": "tcp://127.0.0.1:1", "modelname": "m", "instance_id": "i", "dp_rank": "0"}`, "bad_json"},
		{"/register", `{"endpoint": 5}`, "bad_json"},
		{"/unregister", `{"instance_id": "i", "dp_rank": [1]}`, "bad_json"},
		{"/v1/engines", `{"endpoint": 5}`, "bad_json"},
		{"/v1/finished", `{"request_id": 5}`, "bad_json"},
	} {
		var body map[string]any
		status := c.do("POST", tc.path, tc.body, &body)
		keys := make([]string, 0, len(body))
		for k := range body {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		msg, _ := body["error"].(string)
		switch {
		case status != 400 || !slices.Equal(keys, []string{"code", "error"}) || body["code"] != tc.code || msg == "":
			t.Errorf("%s %s: %d %v, want 400 {error, code: %s}", tc.path, tc.body, status, body, tc.code)
		case goName.MatchString(msg):
			t.Errorf("%s %s: message %q names a Go type", tc.path, tc.body, msg)
		}
	}
	if status := c.do("POST", "/v1/match", `{"model": "m", "tokens": [1], "policy": "cost", "load": {"a": {"waiting": 1}}}`, nil); status != 200 {
		t.Errorf("load for the model's worker: %d, want 200", status)
	}
}
