package server_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/kvindex/kvindex/server"
	"github.com/kvindex/kvindex/subscriber/pubtest"
	"github.com/kvindex/kvindex/vllmhash"
)

// End to end, against the Python test publisher: an engine whose block hashes do not
// follow from its tokens (another PYTHONHASHSEED) and that stores blocks with another
// block size shows both problems in /v1/workers and /metrics, while the hash check of a
// well-configured engine counts matches and reports nothing.
func TestDiagnosticsEndToEnd(t *testing.T) {
	pubtest.Require(t)
	good, err := pubtest.Start(pubtest.Options{Bind: true})
	if err != nil {
		t.Fatal(err)
	}
	defer good.Close()
	bad, err := pubtest.Start(pubtest.Options{Bind: true})
	if err != nil {
		t.Fatal(err)
	}
	defer bad.Close()
	cfgJSON := fmt.Sprintf(`{
		"listen": "127.0.0.1:0", "reconnect_min": "5ms", "reconnect_max": "100ms",
		"engines": [
			{"endpoint": %q, "replay_endpoint": %q, "worker": "good", "model": "llama", "block_size": 4, "hash_check": {"seed": "0"}},
			{"endpoint": %q, "replay_endpoint": %q, "worker": "bad", "model": "llama", "block_size": 4, "hash_check": {"seed": "0"}}
		]}`, good.Ranks[0].Endpoint, good.Ranks[0].ReplayEndpoint, bad.Ranks[0].Endpoint, bad.Ranks[0].ReplayEndpoint)
	cfg, err := server.ParseConfig(strings.NewReader(cfgJSON))
	if err != nil {
		t.Fatal(err)
	}
	_, c := start(t, cfg)

	toks := []uint32{1, 2, 3, 4, 5, 6, 7, 8}
	var h vllmhash.Hasher
	root := vllmhash.RootPickle("0") // vLLM's default algorithm, "sha256"
	d0, _ := h.BlockPickle(&root, toks[:4], nil)
	d1, _ := h.BlockPickle(&d0, toks[4:], nil)
	if _, err := good.Publish(0, true, pubtest.Event{Type: "BlockStored", BlockHashes: []uint64{d0.Low64(), d1.Low64()}, TokenIDs: toks, BlockSize: 4}); err != nil {
		t.Fatal(err)
	}
	other := vllmhash.RootPickle("1")
	e0, _ := h.BlockPickle(&other, toks[:4], nil)
	for _, ev := range []pubtest.Event{
		{Type: "BlockStored", BlockHashes: []uint64{e0.Low64()}, TokenIDs: toks[:4], BlockSize: 4},
		{Type: "BlockStored", BlockHashes: []uint64{99}, TokenIDs: toks, BlockSize: 8},
	} {
		if _, err := bad.Publish(0, true, ev); err != nil {
			t.Fatal(err)
		}
	}

	byWorker := map[string]server.WorkerInfo{}
	deadline := time.Now().Add(15 * time.Second)
	for {
		var out struct{ Workers []server.WorkerInfo }
		c.do("GET", "/v1/workers", "", &out)
		for _, w := range out.Workers {
			byWorker[w.Worker] = w
		}
		g, b := byWorker["good"].Diagnostics, byWorker["bad"].Diagnostics
		if g != nil && b != nil && g.HashCheck != nil && g.HashCheck.Matched == 2 && len(b.Problems) >= 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("diagnostics never showed: good %+v bad %+v", g, b)
		}
		time.Sleep(5 * time.Millisecond) // bounded poll of a condition
	}
	g, b := byWorker["good"].Diagnostics, byWorker["bad"].Diagnostics
	if len(g.Problems) != 0 || g.HashCheck.Mismatched != 0 {
		t.Fatalf("healthy engine: %+v", g)
	}
	codes := map[string]bool{}
	for _, p := range b.Problems {
		codes[p.Code] = true
	}
	if !codes["hash_mismatch"] || !codes["block_size_mismatch"] || b.ForeignBlockSize != 8 || b.HashCheck.Mismatched != 1 {
		t.Fatalf("misconfigured engine: %+v", b)
	}
	m := c.text("/metrics")
	for _, want := range []string{
		`kvindex_worker_problem{model="llama",problem="hash_mismatch",worker="bad"} 1`,
		`kvindex_worker_problem{model="llama",problem="block_size_mismatch",worker="bad"} 1`,
		`kvindex_worker_problem{model="llama",problem="hash_mismatch",worker="good"} 0`,
		`kvindex_hash_check_blocks_total{result="matched",worker="good"} 2`,
		`kvindex_hash_check_blocks_total{result="mismatched",worker="bad"} 1`,
	} {
		if !strings.Contains(m, want) {
			t.Errorf("metrics lack %s", want)
		}
	}
}
