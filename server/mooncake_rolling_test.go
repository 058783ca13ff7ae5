package server_test

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/kvindex/kvindex/hash"
	"github.com/kvindex/kvindex/internal/fakevllm"
	"github.com/kvindex/kvindex/server"
)

// docQueryByHash is the Conductor document's /query_by_hash example, block size 64.
const docQueryByHash = `{
  "model": "deepseek",
  "lora_name": "sql-adapter",
  "seq_hashes": [1234567890, 9876543210],
  "tenant_id": "default",
  "instance_id": "vllm-prefill-node1",
  "block_size": 64,
  "cache_salt": "w8a8"
}`

// TestMooncakeRollingHashes follows the Conductor document as it reads today: its
// /query_by_hash sends rolling sequence hashes (seq_hashes, or block_hash, its alias),
// and its requests may name the model model_name and carry a routing_group.
func TestMooncakeRollingHashes(t *testing.T) {
	const bs = 64
	cfg := server.Config{
		Listen:  "127.0.0.1:0",
		Engines: []server.EngineConfig{{Worker: "vllm-prefill-node1", Model: "deepseek", BlockSize: bs}, {Worker: "other", Model: "m2", BlockSize: 16}},
	}
	_, c := start(t, cfg)
	toks := make([]uint32, 3*bs)
	for i := range toks {
		toks[i] = uint32(1000 + i)
	}
	if code := c.do("POST", "/v1/routed", `{"model":"deepseek","worker":"vllm-prefill-node1","tokens":`+idsJSON(toks)+`}`, nil); code != 200 {
		t.Fatalf("routed: %d", code)
	}
	content, _ := hash.Blocks(nil, toks, bs)
	rolling := hash.Prefixes(nil, content)
	if rolling[0] != content[0] {
		t.Fatalf("a first block's rolling hash is its content hash: %d != %d", rolling[0], content[0])
	}
	oneBlock := asJSON(t, `{"default": {"vllm-prefill-node1": {"longest_matched": 64, "GPU": 64, "CPU": 64, "DISK": 64, "DP": {"0": 64}}}}`)
	for _, body := range []string{
		fmt.Sprintf(`{"model": "deepseek", "seq_hashes": [%d], "tenant_id": "default", "block_size": 64}`, rolling[0]),
		fmt.Sprintf(`{"model_name": "deepseek", "routing_group": "prefill", "block_hash": ["%d"], "block_size": 64}`, rolling[0]),
		fmt.Sprintf(`{"model": "deepseek", "model_name": "deepseek", "seq_hashes": [%d]}`, rolling[0]),
	} {
		if code, got := c.post("/query_by_hash", body); code != 200 || !reflect.DeepEqual(got, oneBlock) {
			t.Errorf("%s: %d %v", body, code, got)
		}
	}
	// The local hashes still answer every block; /query and model_name too.
	all := asJSON(t, `{"default": {"vllm-prefill-node1": {"longest_matched": 192, "GPU": 192, "CPU": 192, "DISK": 192, "DP": {"0": 192}}}}`)
	if code, got := c.post("/query_by_hash", fmt.Sprintf(`{"model": "deepseek", "block_hashes": [%d, %d, %d]}`, content[0], content[1], content[2])); code != 200 || !reflect.DeepEqual(got, all) {
		t.Errorf("block_hashes: %d %v", code, got)
	}
	if code, got := c.post("/query", `{"model_name": "deepseek", "routing_group": "g", "token_ids": `+idsJSON(toks)+`}`); code != 200 || !reflect.DeepEqual(got, all) {
		t.Errorf("query with model_name: %d %v", code, got)
	}
	// The document's own /query_by_hash example: two rolling hashes, which the index
	// cannot turn back into block contents: refused, saying why and what to send.
	for _, tc := range []struct{ body, code, says string }{
		{docQueryByHash, "bad_query", "rolling sequence hashes"},
		{strings.Replace(docQueryByHash, "seq_hashes", "block_hash", 1), "bad_query", "block_hash: 2 rolling"},
		{fmt.Sprintf(`{"model": "deepseek", "seq_hashes": [%d, %d]}`, rolling[0], rolling[1]), "bad_query", "send block_hashes"},
		{`{"model": "deepseek", "seq_hashes": []}`, "bad_query", "empty"},
		{`{"model": "deepseek", "seq_hashes": [1], "block_hash": [1]}`, "bad_query", "give one of"},
		{`{"model": "deepseek", "seq_hashes": [1], "block_hashes": [1]}`, "bad_query", "give one of"},
		{`{"model": "deepseek", "model_name": "m2", "seq_hashes": [1]}`, "bad_query", "differ"},
		{`{"model_name": "nope", "seq_hashes": [1]}`, "unknown_model", "nope"},
	} {
		var e struct{ Error, Code string }
		if code := c.do("POST", "/query_by_hash", tc.body, &e); code != 400 || e.Code != tc.code || !strings.Contains(e.Error, tc.says) {
			t.Errorf("%.90s: %d %+v, want 400 %s saying %q", tc.body, code, e, tc.code, tc.says)
		}
	}
}

// TestMooncakeRegisterDocumentKeys: /register and /unregister accept the document's
// model_name and routing_group.
func TestMooncakeRegisterDocumentKeys(t *testing.T) {
	pub, err := fakevllm.ListenPub("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	cfg := server.Config{Listen: "127.0.0.1:0", Models: map[string]int{"deepseek": 16}}
	_, c := start(t, cfg)
	body := `{"endpoint": "tcp://` + pub.Addr() + `", "type": "vLLM", "model_name": "deepseek", "routing_group": "prefill", "instance_id": "n1", "block_size": 16, "dp_rank": 0}`
	var ok map[string]any
	if code := c.do("POST", "/register", body, &ok); code != 200 || ok["instance_id"] != "n1" {
		t.Fatalf("register: %d %v", code, ok)
	}
	var e struct{ Error, Code string }
	if code := c.do("POST", "/register", strings.Replace(body, `"instance_id": "n1"`, `"instance_id": "n2", "modelname": "x"`, 1), &e); code != 400 || !strings.Contains(e.Error, "differ") {
		t.Fatalf("register with two model names: %d %+v", code, e)
	}
	if code := c.do("POST", "/unregister", `{"model_name": "deepseek", "routing_group": "prefill", "instance_id": "n1"}`, &ok); code != 200 {
		t.Fatalf("unregister: %d %v", code, ok)
	}
}

// TestMooncakeRollingHashesSpecChain: on an index that runs SPEC's chain
// (index.spec_chain), the rolling hashes the Conductor document sends are the index's
// own prefix hashes and are answered at every length, as the block hashes they were
// made from; the document's own example (hashes nothing holds) answers 0.
func TestMooncakeRollingHashesSpecChain(t *testing.T) {
	const bs = 64
	cfg := server.Config{
		Listen:         "127.0.0.1:0",
		Engines:        []server.EngineConfig{{Worker: "vllm-prefill-node1", Model: "deepseek", BlockSize: bs}, {Worker: "node2", Model: "deepseek", BlockSize: bs}},
		Index:          server.IndexConfig{SpecChain: true},
		MaxQueryBlocks: 64,
	}
	_, c := start(t, cfg)
	r := rand.New(rand.NewPCG(7, 32))
	// Two workers share a prefix whose length varies; each holds a few chains.
	var prompts [][]uint64
	for p := 0; p < 6; p++ {
		toks := make([]uint32, (1+r.IntN(8))*bs)
		for i := range toks {
			toks[i] = uint32(r.IntN(4)) // a small alphabet: prompts share prefixes
		}
		worker := []string{"vllm-prefill-node1", "node2"}[p%2]
		if code := c.do("POST", "/v1/routed", `{"model":"deepseek","worker":"`+worker+`","tokens":`+idsJSON(toks)+`}`, nil); code != 200 {
			t.Fatalf("routed: %d", code)
		}
		content, _ := hash.Blocks(nil, toks, bs)
		prompts = append(prompts, content)
	}
	// Every prefix of every prompt, and of variants that leave it at a random block:
	// the rolling hashes answer what their block hashes answer.
	hits := 0
	for _, content := range prompts {
		for n := 1; n <= len(content); n++ {
			q := slices.Clone(content[:n])
			if r.IntN(2) == 0 {
				q[r.IntN(n)] ^= 1
			}
			rolling := hash.Prefixes(nil, q)
			_, want := c.post("/query_by_hash", `{"model": "deepseek", "block_hashes": `+u64JSON(q)+`}`)
			for _, field := range []string{"seq_hashes", "block_hash"} {
				code, got := c.post("/query_by_hash", `{"model_name": "deepseek", "routing_group": "g", "`+field+`": `+u64JSON(rolling)+`}`)
				if code != 200 || !reflect.DeepEqual(got, want) {
					t.Fatalf("%s %v: %d %v, want %v", field, rolling, code, got, want)
				}
			}
			hits += matched(want)
		}
	}
	if hits == 0 {
		t.Fatal("no query matched anything: the comparison proved nothing")
	}
	// The document's example: its hashes name nothing held (and its LoRA namespace
	// nothing stored): the instance answers 0.
	zero := asJSON(t, `{"default": {"vllm-prefill-node1": {"longest_matched": 0, "GPU": 0, "CPU": 0, "DISK": 0, "DP": {"0": 0}}}}`)
	if code, got := c.post("/query_by_hash", docQueryByHash); code != 200 || !reflect.DeepEqual(got, zero) {
		t.Errorf("document example: %d %v", code, got)
	}
}

// TestMooncakeRollingHashesHostile: a list of rolling hashes longer than
// max_query_blocks is refused before the index sees it, and a body past
// max_body_bytes before it is decoded, each with /v1/match's error shape.
func TestMooncakeRollingHashesHostile(t *testing.T) {
	cfg := server.Config{
		Listen:         "127.0.0.1:0",
		Engines:        []server.EngineConfig{{Worker: "w", Model: "m", BlockSize: 16}},
		Index:          server.IndexConfig{SpecChain: true},
		MaxQueryBlocks: 100,
		MaxBodyBytes:   1 << 16,
	}
	_, c := start(t, cfg)
	long := make([]uint64, 101)
	huge := make([]uint64, 20000) // about 400 KB of JSON: past max_body_bytes
	for i := range huge {
		huge[i] = uint64(i) * 0x9e3779b97f4a7c15
	}
	for _, tc := range []struct {
		body   string
		status int
		code   string
	}{
		{`{"model": "m", "seq_hashes": ` + u64JSON(long) + `}`, 400, "query_too_long"},
		{`{"model": "m", "block_hash": ` + u64JSON(long) + `}`, 400, "query_too_long"},
		{`{"model": "m", "seq_hashes": ` + u64JSON(huge) + `}`, 413, ""},
	} {
		var e struct{ Error, Code string }
		if code := c.do("POST", "/query_by_hash", tc.body, &e); code != tc.status || (tc.code != "" && e.Code != tc.code) || e.Error == "" {
			t.Errorf("%.60s (%d bytes): %d %+v, want %d %s", tc.body, len(tc.body), code, e, tc.status, tc.code)
		}
	}
}

func u64JSON(hs []uint64) string {
	b, _ := json.Marshal(hs)
	return string(b)
}

// matched counts the instances of a Mooncake answer that matched a block or more.
func matched(answer any) int {
	n := 0
	for _, insts := range answer.(map[string]any) {
		for _, h := range insts.(map[string]any) {
			if h.(map[string]any)["longest_matched"].(float64) > 0 {
				n++
			}
		}
	}
	return n
}
