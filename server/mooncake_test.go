package server_test

import (
	"encoding/json"
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/kvindex/kvindex/engine"
	"github.com/kvindex/kvindex/hash"
	"github.com/kvindex/kvindex/internal/freeport"
	"github.com/kvindex/kvindex/server"
	"github.com/kvindex/kvindex/subscriber"
	"github.com/kvindex/kvindex/subscriber/pubtest"
)

// asJSON decodes a JSON text into a generic value, for comparisons with the RFC's
// examples.
func asJSON(t *testing.T, s string) any {
	t.Helper()
	var v any
	if err := json.Unmarshal([]byte(s), &v); err != nil {
		t.Fatalf("%s: %v", s, err)
	}
	return v
}

// post sends a body and returns the status and the decoded answer.
func (c *client) post(path, body string) (int, any) {
	c.t.Helper()
	var v any
	code := c.do("POST", path, body, &v)
	return code, v
}

// TestMooncakeRFCExamples drives the Mooncake indexer API with the RFC's own bodies
// (docs/source/design/conductor/indexer-api-design.md of kvcache-ai/Mooncake, RFC
// #1403): /register twice (ranks 0 and 1 of one instance, each on its own endpoint of
// a real publisher), events that leave rank 0 with one 128-token block on the GPU and
// rank 1 with two blocks on the CPU, one of them on the GPU too: /query answers the
// RFC's example response, its numbers included (GPU 128, CPU 256, DP 0: 128 and 1:
// 256, longest_matched 256), except DISK, which kvindex counts cumulatively (256, not
// the example's 0); /query_by_hash the same from block hashes; /unregister answers
// the RFC's example response verbatim and takes the rank's blocks out.
func TestMooncakeRFCExamples(t *testing.T) {
	pubtest.Require(t)
	pub, err := pubtest.Start(pubtest.Options{Ranks: 2, Bind: true})
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	cfg := server.Config{Listen: "127.0.0.1:0", Models: map[string]int{"deepseek": 128}, ReconnectMin: server.Duration(10 * time.Millisecond)}
	s, c := start(t, cfg)

	register := func(rank int) {
		t.Helper()
		r := pub.Ranks[rank]
		body := fmt.Sprintf(`{
		  "endpoint": %q,
		  "replay_endpoint": %q,
		  "type": "vLLM",
		  "modelname": "deepseek",
		  "lora_name": "sql-adapter",
		  "tenant_id": "default",
		  "instance_id": "vllm-prefill-node1",
		  "block_size": 128,
		  "dp_rank": %d,
		  "additionalsalt": "w8a8"
		}`, r.Endpoint, r.ReplayEndpoint, rank)
		code, got := c.post("/register", body)
		want := asJSON(t, `{"status": "registered successfully", "instance_id": "vllm-prefill-node1"}`)
		if code != 200 || !reflect.DeepEqual(got, want) {
			t.Fatalf("register rank %d: %d %v", rank, code, got)
		}
	}
	register(0)
	register(1)
	register(1) // a retry of the same registration is not an error

	toks := make([]uint32, 300) // two blocks of 128 and a partial one
	for i := range toks {
		toks[i] = uint32(1000 + i)
	}
	gpu := func(seqs ...uint64) pubtest.Event {
		return pubtest.Event{Type: "BlockStored", BlockHashes: seqs, TokenIDs: toks[:128*len(seqs)], BlockSize: 128, LoraName: "sql-adapter"}
	}
	seqs := make([]uint64, 2)
	for _, step := range []struct {
		rank int
		ev   pubtest.Event
	}{
		{0, gpu(1)},
		{1, gpu(11, 12)},
		{1, pubtest.Event{Type: "BlockStored", BlockHashes: []uint64{11, 12}, TokenIDs: []uint32{}, BlockSize: 128, Medium: "CPU", LoraName: "sql-adapter"}},
		{1, pubtest.Event{Type: "BlockRemoved", BlockHashes: []uint64{12}, Medium: "GPU"}},
	} {
		seq, err := pub.Publish(step.rank, true, step.ev)
		if err != nil {
			t.Fatal(err)
		}
		seqs[step.rank] = seq
	}
	ws := waitCaughtUp(t, c, seqs)
	if ws.Workers[0].Worker != "vllm-prefill-node1#dp0" || ws.Workers[1].Worker != "vllm-prefill-node1#dp1" || ws.Workers[1].Model != "deepseek@w8a8" {
		t.Fatalf("workers %+v", ws.Workers)
	}
	if err := s.Engine().Barrier(t.Context()); err != nil {
		t.Fatal(err)
	}

	// The RFC's /query body names block_size 64, which is not this model's.
	rfcQuery := `{
	  "model": "deepseek",
	  "lora_name": "sql-adapter",
	  "token_ids": [101, 15, 100, 55, 89],
	  "tenant_id": "default",
	  "instance_id": "vllm-prefill-node1",
	  "block_size": 64,
	  "cache_salt": "w8a8"
	}`
	var e struct{ Error, Code string }
	if code := c.do("POST", "/query", rfcQuery, &e); code != 400 || !strings.Contains(e.Error, "blocks of 128 tokens") {
		t.Fatalf("RFC query with block_size 64: %d %+v", code, e)
	}
	tokJSON, _ := json.Marshal(toks)
	query := strings.Replace(strings.Replace(rfcQuery, `"block_size": 64`, `"block_size": 128`, 1),
		`[101, 15, 100, 55, 89]`, string(tokJSON), 1)
	// The RFC's example answer, DISK aside (cumulative here: DISK >= CPU >= GPU).
	want := asJSON(t, `{
	  "default": {
	    "vllm-prefill-node1": {
	      "longest_matched": 256,
	      "GPU": 128,
	      "DP": {
	        "0": 128,
	        "1": 256
	      },
	      "CPU": 256,
	      "DISK": 256
	    }
	  }
	}`)
	if code, got := c.post("/query", query); code != 200 || !reflect.DeepEqual(got, want) {
		t.Fatalf("query: %d %v", code, got)
	}
	// /query_by_hash: the RFC's body with per-block hashes; its two rolling seq_hashes are refused.
	content, _ := hash.Blocks(nil, toks, 128)
	byHash := fmt.Sprintf(`{
	  "model": "deepseek",
	  "lora_name": "sql-adapter",
	  "block_hashes": [%d, "%d"],
	  "tenant_id": "default",
	  "instance_id": "vllm-prefill-node1",
	  "block_size": 128,
	  "cache_salt": "w8a8"
	}`, content[0], content[1])
	if code, got := c.post("/query_by_hash", byHash); code != 200 || !reflect.DeepEqual(got, want) {
		t.Fatalf("query_by_hash: %d %v", code, got)
	}
	rfcByHash := `{
	  "model": "deepseek",
	  "lora_name": "sql-adapter",
	  "seq_hashes": [1234567890, 9876543210],
	  "tenant_id": "default",
	  "instance_id": "vllm-prefill-node1",
	  "block_size": 128,
	  "cache_salt": "w8a8"
	}`
	if code := c.do("POST", "/query_by_hash", rfcByHash, &e); code != 400 || !strings.Contains(e.Error, "send block_hashes") {
		t.Fatalf("seq_hashes: %d %+v", code, e)
	}
	// Without the salt the blocks are another model's: nothing matches.
	if code, got := c.post("/query", strings.Replace(query, `"cache_salt": "w8a8"`, `"cache_salt": ""`, 1)); code != 200 ||
		!reflect.DeepEqual(got, asJSON(t, `{"default": {}}`)) {
		t.Fatalf("unsalted query: %d %v", code, got)
	}

	// The RFC's /unregister body and answer, verbatim.
	rfcUnregister := `{
	  "type": "vLLM",
	  "modelname": "deepseek",
	  "lora_name": "sql-adapter",
	  "tenant_id": "default",
	  "instance_id": "vllm-prefill-node1",
	  "block_size": 128,
	  "dp_rank": 0
	}`
	if code, got := c.post("/unregister", rfcUnregister); code != 200 || !reflect.DeepEqual(got,
		asJSON(t, `{"status": "unregistered successfully", "removed_instances": ["vllm-prefill-node1|default|0"]}`)) {
		t.Fatalf("unregister: %d %v", code, got)
	}
	if _, ok := s.Engine().WorkerSize("vllm-prefill-node1#dp0"); ok {
		t.Fatal("rank 0 unregistered but still in the index")
	}
	rank1 := asJSON(t, `{"default": {"vllm-prefill-node1": {"longest_matched": 256, "GPU": 128, "CPU": 256, "DISK": 256, "DP": {"1": 256}}}}`)
	if code, got := c.post("/query", query); code != 200 || !reflect.DeepEqual(got, rank1) {
		t.Fatalf("query after unregistering rank 0: %d %v", code, got)
	}
	if code := c.do("POST", "/unregister", rfcUnregister, &e); code != 404 || e.Code != "unknown_engine" {
		t.Fatalf("unregister again: %d %+v", code, e)
	}
	// Without dp_rank: every rank left.
	if code, got := c.post("/unregister", `{"instance_id": "vllm-prefill-node1"}`); code != 200 || !reflect.DeepEqual(got,
		asJSON(t, `{"status": "unregistered successfully", "removed_instances": ["vllm-prefill-node1|default|1"]}`)) {
		t.Fatalf("unregister the rest: %d %v", code, got)
	}
	if n := runningSubscribers(); n != 0 {
		t.Fatalf("%d subscribers still running", n)
	}
}

// TestMooncakeFoldsRanks: an engine's data-parallel ranks (dp_ranks) answer as one
// instance with per-rank counts, beside a single-rank engine and one served from
// predictions; tenants, the instance filter, the medium filter and lora_id select
// what they name. The index is fed directly, as a subscriber would; the subscribers
// never connect, so trust.off keeps their scores on the index (trust_test.go has the
// fallback).
func TestMooncakeFoldsRanks(t *testing.T) {
	cfg := server.Config{Listen: "127.0.0.1:0", Trust: server.TrustConfig{Off: true}, Engines: []server.EngineConfig{
		{Endpoint: freeport.Endpoint(t), Worker: "pod", Model: "m", BlockSize: 4, DPRanks: 3},
		{Endpoint: freeport.Endpoint(t), Worker: "solo", Model: "m", BlockSize: 4},
		{Worker: "approx", Model: "m", BlockSize: 4},
	}}
	s, c := start(t, cfg)
	toks := []uint32{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}
	content, _ := hash.Blocks(nil, toks, 4)
	store := func(worker, ns string, n int, tier engine.Tier) {
		t.Helper()
		ev := engine.Event{Kind: engine.EventStored, Worker: worker, Namespace: subscriber.Namespace("m", ns), Tier: tier}
		for i := range n {
			ev.Blocks = append(ev.Blocks, engine.Block{Content: content[i], Seq: uint64(100*len(worker) + i + 1)})
		}
		if err := s.Engine().Apply(&ev); err != nil {
			t.Fatal(err)
		}
	}
	store("pod#dp0", "", 1, engine.TierDevice)
	store("pod#dp2", "", 3, engine.TierDevice)
	store("solo", "", 2, engine.TierHost)
	store("solo", "lora_id=7", 3, engine.TierDevice)
	if err := s.Engine().Barrier(t.Context()); err != nil {
		t.Fatal(err)
	}
	tokJSON, _ := json.Marshal(toks)
	for _, tc := range []struct{ body, want string }{
		{`{"model": "m", "token_ids": ` + string(tokJSON) + `}`, `{"default": {
			"pod": {"longest_matched": 12, "GPU": 12, "CPU": 12, "DISK": 12, "DP": {"0": 4, "1": 0, "2": 12}},
			"solo": {"longest_matched": 8, "GPU": 0, "CPU": 8, "DISK": 8, "DP": {"0": 8}},
			"approx": {"longest_matched": 0, "GPU": 0, "CPU": 0, "DISK": 0, "DP": {"0": 0}}}}`},
		{`{"model": "m", "token_ids": ` + string(tokJSON) + `, "instance_id": "solo", "medium": ["L1", "GPU", "DISK"]}`,
			`{"default": {"solo": {"longest_matched": 8, "GPU": 0, "DISK": 8, "DP": {"0": 8}}}}`},
		{`{"model": "m", "token_ids": ` + string(tokJSON) + `, "lora_id": 7, "instance_id": "solo"}`,
			`{"default": {"solo": {"longest_matched": 12, "GPU": 12, "CPU": 12, "DISK": 12, "DP": {"0": 12}}}}`},
		{`{"model": "m", "token_ids": ` + string(tokJSON) + `, "tenant_id": "acme"}`, `{"acme": {}}`},
		{`{"model": "m", "token_ids": [1, 2, 3]}`, `{"default": {
			"pod": {"longest_matched": 0, "GPU": 0, "CPU": 0, "DISK": 0, "DP": {"0": 0, "1": 0, "2": 0}},
			"solo": {"longest_matched": 0, "GPU": 0, "CPU": 0, "DISK": 0, "DP": {"0": 0}},
			"approx": {"longest_matched": 0, "GPU": 0, "CPU": 0, "DISK": 0, "DP": {"0": 0}}}}`},
	} {
		if code, got := c.post("/query", tc.body); code != 200 || !reflect.DeepEqual(got, asJSON(t, tc.want)) {
			t.Errorf("%s: %d %v", tc.body, code, got)
		}
	}
	// A tenant's registration is its tenant's only; a config instance cannot be
	// unregistered.
	body := `{"endpoint": "tcp://` + freeport.Addr(t) + `", "modelname": "m", "instance_id": 42, "tenant_id": "acme", "block_size": 4}`
	if code, _ := c.post("/register", body); code != 200 {
		t.Fatalf("register: %d", code)
	}
	if code, got := c.post("/query", `{"model": "m", "token_ids": [1, 2, 3, 4], "tenant_id": "acme"}`); code != 200 ||
		!reflect.DeepEqual(got, asJSON(t, `{"acme": {"42": {"longest_matched": 0, "GPU": 0, "CPU": 0, "DISK": 0, "DP": {"0": 0}}}}`)) {
		t.Fatalf("acme query: %d %v", code, got)
	}
	var e struct{ Error, Code string }
	if code := c.do("POST", "/unregister", `{"instance_id": "pod"}`, &e); code != 409 || e.Code != "engine_source" {
		t.Fatalf("unregister a config engine: %d %+v", code, e)
	}
}

// TestMooncakeErrors: every malformed or unanswerable request is a 400 (or 404, 409)
// that says why, and changes nothing.
func TestMooncakeErrors(t *testing.T) {
	ep := freeport.Endpoint(t)
	cfg := server.Config{Listen: "127.0.0.1:0", MaxQueryBlocks: 4, Engines: []server.EngineConfig{
		{Endpoint: freeport.Endpoint(t), Worker: "a", Model: "m", BlockSize: 4},
		{Endpoint: freeport.Endpoint(t), Worker: "b", Model: "n", BlockSize: 8},
	}}
	s, c := start(t, cfg)
	reg := func(extra string) string {
		return `{"endpoint": "` + ep + `", "modelname": "m", "instance_id": "i"` + extra + `}`
	}
	for _, tc := range []struct {
		path, body string
		status     int
		code       string
	}{
		{"/register", `{`, 400, "bad_json"},
		{"/register", reg(`, "bogus": 1`), 400, "bad_json"},
		{"/register", reg(`, "instance_id": "j"`), 400, "bad_json"},
		{"/register", reg(`, "dp_rank": "0"`), 400, "bad_json"},
		{"/register", `{"endpoint": "` + ep + `", "modelname": "m", "instance_id": 1.5}`, 400, "bad_json"},
		{"/register", `{"endpoint": "` + ep + `", "modelname": "m"}`, 400, "bad_engine"},
		{"/register", `{"endpoint": "` + ep + `", "modelname": "m", "instance_id": "x#y"}`, 400, "bad_engine"},
		{"/register", `{"endpoint": "` + ep + `", "modelname": "m", "instance_id": "` + strings.Repeat("i", 300) + `"}`, 400, "bad_engine"},
		{"/register", `{"modelname": "m", "instance_id": "i"}`, 400, "bad_engine"},
		{"/register", `{"endpoint": "` + ep + `", "instance_id": "i"}`, 400, "bad_engine"}, // two models: modelname required
		{"/register", reg(`, "type": "Mooncake"`), 400, "bad_engine"},
		{"/register", reg(`, "block_size": 16`), 400, "bad_engine"},
		{"/register", reg(`, "dp_rank": -1`), 400, "bad_engine"},
		{"/register", reg(`, "tenant_id": "a|b"`), 400, "bad_engine"},
		{"/register", `{"endpoint": "tcp://*:1", "modelname": "m", "instance_id": "i"}`, 400, "bad_engine"},
		{"/register", `{"endpoint": "` + ep + `", "modelname": "m", "instance_id": "a", "dp_rank": 0}`, 409, "engine_exists"}, // the config's instance
		{"/unregister", `{}`, 400, "bad_engine"},
		{"/unregister", `{"instance_id": "nope"}`, 404, "unknown_engine"},
		{"/query", `{"model": "zz", "token_ids": [1]}`, 400, "unknown_model"}, // as /v1/match
		{"/query", `{"token_ids": [1]}`, 400, "unknown_model"},
		{"/query", `{"model": "m", "token_ids": [1], "block_size": 8}`, 400, "bad_query"},
		{"/query", `{"model": "m", "token_ids": [-1]}`, 400, "bad_json"},
		{"/query", `{"model": "m", "token_ids": [1], "medium": ["TAPE"]}`, 400, "bad_query"},
		{"/query", `{"model": "m", "token_ids": [1], "lora_id": 1, "lora_name": "x"}`, 400, "bad_query"},
		{"/query", `{"model": "m", "token_ids": [` + strings.Repeat("1,", 20) + `1]}`, 400, "query_too_long"},
		{"/query", `{"model": "m", "block_hashes": [1]}`, 400, "bad_query"},
		{"/query_by_hash", `{"model": "m", "token_ids": [1]}`, 400, "bad_query"},
		{"/query_by_hash", `{"model": "m", "seq_hashes": [1, 2]}`, 400, "bad_query"},
		{"/query_by_hash", `{"model": "m", "block_hashes": [1], "block_hash": [1]}`, 400, "bad_query"},
		{"/query_by_hash", `{"model": "m", "block_hashes": [1, 2, 3, 4, 5]}`, 400, "query_too_long"},
		{"/query_by_hash", `{"model": "m", "block_hashes": ["zz"]}`, 400, "bad_json"},
		{"/query", ``, 400, "bad_json"},
	} {
		var e struct{ Error, Code string }
		if got := c.do("POST", tc.path, tc.body, &e); got != tc.status || e.Code != tc.code || e.Error == "" {
			t.Errorf("%s %.70s: %d %+v, want %d %s", tc.path, tc.body, got, e, tc.status, tc.code)
		}
	}
	for _, en := range s.Engines() {
		if en.Source != server.SourceConfig {
			t.Errorf("an engine was added: %+v", en)
		}
	}
	if got := c.do("GET", "/query", "", nil); got != 405 {
		t.Errorf("GET /query: %d", got)
	}
}
