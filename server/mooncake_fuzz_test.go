package server

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/kvindex/kvindex/engine"
	"github.com/kvindex/kvindex/hash"
)

// FuzzMooncake feeds the Mooncake API whatever a client can send: any body to /query,
// /query_by_hash, /register or /unregister. Each must answer 200 with a JSON object or
// a 4xx error body with its code, never panic or fail inside.
func FuzzMooncake(f *testing.F) {
	s, err := New(Config{Models: map[string]int{"m": 4}, MaxQueryBlocks: 64, MaxBodyBytes: 1 << 14,
		Engines: []EngineConfig{{Endpoint: "tcp://127.0.0.1:9", Worker: "pod", Model: "m", BlockSize: 4, DPRanks: 2}}}, Options{})
	if err != nil {
		f.Fatal(err)
	}
	defer s.Shutdown(context.Background()) // never started: registrations run no subscriber
	content, _ := hash.Blocks(nil, []uint32{1, 2, 3, 4, 5, 6, 7, 8}, 4)
	_ = s.eng.Apply(&engine.Event{Kind: engine.EventStored, Worker: "pod#dp1", Namespace: "model=m;",
		Blocks: []engine.Block{{Content: content[0], Seq: 1}, {Content: content[1], Seq: 2}}})
	_ = s.eng.Barrier(context.Background())
	for _, seed := range []struct{ path, body string }{
		{"/query", `{"model": "m", "token_ids": [1, 2, 3, 4, 5, 6, 7, 8], "medium": ["GPU"]}`},
		{"/query", `{"model": "m", "lora_id": -3, "cache_salt": "x;y", "token_ids": [1], "tenant_id": "t"}`},
		{"/query_by_hash", `{"model": "m", "block_hashes": [1, "0x2"], "instance_id": 7}`},
		{"/query_by_hash", `{"model": "m", "seq_hashes": [1]}`},
		{"/register", `{"endpoint": "tcp://127.0.0.1:10", "modelname": "m", "instance_id": "i", "dp_rank": 3, "additionalsalt": "q"}`},
		{"/unregister", `{"instance_id": "i", "dp_rank": 3}`},
	} {
		f.Add(seed.path, []byte(seed.body))
	}
	h := s.Handler()
	f.Fuzz(func(t *testing.T, path string, body []byte) {
		switch path {
		case "/query", "/query_by_hash", "/register", "/unregister":
		default:
			path = "/query"
		}
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, path, bytes.NewReader(body)))
		var v map[string]any
		if err := json.Unmarshal(rec.Body.Bytes(), &v); err != nil {
			t.Fatalf("%s %q: %d, body not a JSON object: %q", path, body, rec.Code, rec.Body.Bytes())
		}
		if rec.Code != 200 && (rec.Code < 400 || rec.Code >= 500 || v["code"] == nil) {
			t.Fatalf("%s %q: %d %v", path, body, rec.Code, v)
		}
	})
}
