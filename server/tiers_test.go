package server_test

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/kvindex/kvindex/hash"
	"github.com/kvindex/kvindex/internal/refmodel"
	"github.com/kvindex/kvindex/server"
	"github.com/kvindex/kvindex/subscriber/pubtest"
)

func TestTierConfigValidation(t *testing.T) {
	long := strings.Repeat("M", 65)
	for _, tc := range []struct{ json, want string }{
		{`{"engines":[{"endpoint":"tcp://h:1"}],"tiers":{"CPU":"ram"}}`, `tiers["CPU"]: unknown tier "ram"`},
		{`{"engines":[{"endpoint":"tcp://h:1"}],"tiers":{"` + long + `":"host"}}`, "longer than 64 bytes"},
		{`{"engines":[{"endpoint":"tcp://h:1"}],"tiers":{"*":"host"}}`, `"*" in Tiers is not a medium`},
		{`{"engines":[{"endpoint":"tcp://h:1"}],"tier_weights":[1,0.5]}`, "tier_weights has 2 numbers"},
		{`{"engines":[{"endpoint":"tcp://h:1"}],"tier_weights":[1,0.5,-0.1]}`, "tier_weights[2] (disk) is -0.1"},
		{`{"engines":[{"endpoint":"tcp://h:1"}],"tier_weights":[2,0.5,0]}`, "tier_weights[0] (device) is 2"},
		{`{"engines":[{"endpoint":"tcp://h:1"}],"tier_weights":"1,1,1"}`, "cannot unmarshal"},
		{`{"engines":[{"endpoint":"tcp://h:1","media":["GPU","TAPE"]}]}`, `medium "TAPE" in Media has no tier`},
		{`{"models":{"m":16},"tier_weights":[1,1,1,1]}`, "tier_weights has 4 numbers"},
	} {
		_, err := server.ParseConfig(strings.NewReader(tc.json))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%.80s: err %v, want one mentioning %q", tc.json, err, tc.want)
		}
	}
	many := map[string]string{}
	for i := range 65 {
		many[fmt.Sprint("M", i)] = "host"
	}
	b, _ := json.Marshal(map[string]any{"models": map[string]int{"m": 16}, "tiers": many})
	if _, err := server.ParseConfig(strings.NewReader(string(b))); err == nil || !strings.Contains(err.Error(), "65 entries") {
		t.Errorf("65 tiers: %v", err)
	}
	ok := `{"engines":[{"endpoint":"tcp://h:1","media":["GPU","NVME"]}],"tiers":{"NVME":"disk"},"tier_weights":[1,0.4,0.2]}`
	if _, err := server.ParseConfig(strings.NewReader(ok)); err != nil {
		t.Fatal(err)
	}
}

// TestTiersEndToEnd: two vLLM ranks with offloading behind publisher.py. Rank 0
// offloads to CPU (the connector's hash-only stores) and evicts from the GPU; rank 1
// copies to a medium the config names ("NVME": disk) and sends a medium nothing maps.
// /v1/match answers the reference model's per-tier lengths, weighs them with the
// server's or the request's weights, orders by them, and /metrics counts each tier.
func TestTiersEndToEnd(t *testing.T) {
	pubtest.Require(t)
	pub, err := pubtest.Start(pubtest.Options{Ranks: 2, ConsecutivePorts: true, Bind: true})
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	cfgJSON := fmt.Sprintf(`{
		"listen": "127.0.0.1:0", "reconnect_min": "10ms", "reconnect_max": "100ms",
		"tiers": {"NVME": "disk"}, "tier_weights": [1, 0.5, 0.1],
		"engines": [{"endpoint": %q, "replay_endpoint": %q, "worker": "pod", "model": "llama", "block_size": 4, "dp_ranks": 2}]
	}`, pub.Ranks[0].Endpoint, pub.Ranks[0].ReplayEndpoint)
	cfg, err := server.ParseConfig(strings.NewReader(cfgJSON))
	cfg.Policy = server.PolicyLongestPrefix // its pick is the highest weighted score
	if err != nil {
		t.Fatal(err)
	}
	_, c := start(t, cfg)
	c.waitReady(t)
	toks := []uint32{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}
	content, _ := hash.Blocks(nil, toks, 4)
	m := refmodel.New()
	workers := []string{"pod#dp0", "pod#dp1"}
	gpu := func(seqs ...uint64) pubtest.Event {
		return pubtest.Event{Type: "BlockStored", BlockHashes: seqs, TokenIDs: toks[:4*len(seqs)], BlockSize: 4}
	}
	copied := func(medium string, seqs ...uint64) pubtest.Event {
		return pubtest.Event{Type: "BlockStored", BlockHashes: seqs, TokenIDs: []uint32{}, BlockSize: 4, Medium: medium}
	}
	removed := func(medium string, seqs ...uint64) pubtest.Event {
		return pubtest.Event{Type: "BlockRemoved", BlockHashes: seqs, Medium: medium}
	}
	blocks := func(seqs ...uint64) [][2]uint64 {
		out := make([][2]uint64, len(seqs))
		for i, s := range seqs {
			out[i] = [2]uint64{content[i], s}
		}
		return out
	}
	seqs := []uint64{0, 0}
	for _, step := range []struct {
		rank  int
		ev    pubtest.Event
		model func(w string)
	}{
		{0, gpu(11, 12, 13), func(w string) { m.Stored(w, 0, false, blocks(11, 12, 13)) }},
		{0, copied("CPU", 11, 12, 13, 99), func(w string) { m.Copied(w, 1, []uint64{11, 12, 13, 99}) }}, // 99: held nowhere
		{0, removed("GPU", 12, 13), func(w string) { m.Removed(w, []uint64{12, 13}) }},
		{0, removed("CPU", 13), func(w string) { m.RemovedOn(w, 1, []uint64{13}) }},
		{1, gpu(21, 22), func(w string) { m.Stored(w, 0, false, blocks(21, 22)) }},
		{1, copied("NVME", 21, 22), func(w string) { m.Copied(w, 2, []uint64{21, 22}) }},
		{1, removed("GPU", 22), func(w string) { m.Removed(w, []uint64{22}) }},
		{1, copied("TAPE", 21), func(string) {}}, // no tier: dropped
		{1, copied("GPU", 21), func(string) {}},  // hash-only on the device: dropped
	} {
		seq, err := pub.Publish(step.rank, true, step.ev)
		if err != nil {
			t.Fatal(err)
		}
		seqs[step.rank] = seq
		step.model(workers[step.rank])
	}
	ws := waitCaughtUp(t, c, seqs)
	if r := ws.Workers[1].Rejected; r["medium"] != 1 || r["hash_only"] != 1 {
		t.Fatalf("rank 1 rejections %v", r)
	}
	if e := ws.Workers[0].Events; e.Stored != 1 || e.Copied != 1 || e.Removed != 2 {
		t.Fatalf("rank 0 events %+v", e)
	}
	match := func(weights string) server.MatchResponse {
		t.Helper()
		body := `{"model":"llama","tokens":[1,2,3,4,5,6,7,8,9,10,11,12]` + weights + `}`
		var mr server.MatchResponse
		if code := c.do("POST", "/v1/match", body, &mr); code != 200 {
			t.Fatalf("match %s: %d", body, code)
		}
		return mr
	}
	// dp0: device {11}, host {11, 12}: tiers [1 2 2]; dp1: device {21}, disk {21, 22}: [1 1 2].
	want := map[string]refmodel.Answer{}
	for _, a := range m.Query(content) {
		want[a.Worker] = a
	}
	if want["pod#dp0"].Tiers != [3]int{1, 2, 2} || want["pod#dp1"].Tiers != [3]int{1, 1, 2} {
		t.Fatalf("model answers %+v", want)
	}
	for _, tc := range []struct {
		weights string
		first   string
		w0, w1  float64 // dp0's and dp1's weighted scores
	}{
		{"", "pod#dp0", 1.5, 1.1},                     // the server's [1, 0.5, 0.1]
		{`,"tier_weights":[1,0,1]`, "pod#dp1", 1, 2},  // disk counts fully
		{`,"tier_weights":[0,0,0]`, "pod#dp0", 0, 0},  // a tie: listed by score, then worker id; picked by the prompt's hash
		{`,"tier_weights":null`, "pod#dp0", 1.5, 1.1}, // null: the server's
		{`,"tier_weights":[1,0.75,0.25]`, "pod#dp0", 1.75, 1.25},
	} {
		mr := match(tc.weights)
		if len(mr.Matches) != 2 || mr.Matches[0].Worker != tc.first || mr.Pick == nil {
			t.Fatalf("%s: %+v", tc.weights, mr)
		}
		switch tie := tc.w0 == tc.w1; {
		case !tie && mr.Pick.Worker != tc.first:
			t.Fatalf("%s: picked %s, want %s", tc.weights, mr.Pick.Worker, tc.first)
		case tie && (want[mr.Pick.Worker].Worker == "" || match(tc.weights).Pick.Worker != mr.Pick.Worker):
			t.Fatalf("%s: tie picked %s, then not the same again", tc.weights, mr.Pick.Worker)
		}
		for _, got := range mr.Matches {
			a := want[got.Worker]
			if got.Tiers != a.Tiers || got.Score != a.Score || got.Size != a.Size {
				t.Fatalf("%s: %s %+v, model %+v", tc.weights, got.Worker, got, a)
			}
			w := map[string]float64{"pod#dp0": tc.w0, "pod#dp1": tc.w1}[got.Worker]
			if got.Weighted != w {
				t.Fatalf("%s: %s weighted %v, want %v", tc.weights, got.Worker, got.Weighted, w)
			}
		}
	}
	// Bad weights are the request's mistake.
	for _, w := range []string{`[1,2,0]`, `[1,0.5]`, `[1,0.5,0,0]`, `[1,"0.5",0]`, `"1,1,1"`, `[1,0.5,1e400]`,
		`[1,0.5,NaN]`, `[1,0.5,-1]`, `[01,0,0]`, `[1,,0]`, `[1,0,0`, `{}`, `[]`} {
		var e struct{ Code string }
		body := `{"model":"llama","tokens":[1,2,3,4],"tier_weights":` + w + `}`
		if code := c.do("POST", "/v1/match", body, &e); code != 400 || (e.Code != "bad_tier_weights" && e.Code != "bad_json") {
			t.Errorf("tier_weights %s: %d %+v, want 400", w, code, e)
		}
	}
	// /v1/routed takes no weights (and keeps working).
	var e struct{ Code string }
	if code := c.do("POST", "/v1/routed", `{"model":"llama","worker":"pod#dp0","tokens":[1,2,3,4],"tier_weights":[1,1,1]}`, &e); code != 400 {
		t.Errorf("routed with tier_weights: %d", code)
	}
	var rr server.RoutedResponse
	if code := c.do("POST", "/v1/routed", `{"model":"llama","worker":"pod#dp1","tokens":[1,2,3,4,5,6,7,8,9,10,11,12]}`, &rr); code != 200 || rr.Blocks != 3 {
		t.Fatalf("routed: %d %+v", code, rr)
	}
	// dp1's prediction of all three blocks counts as device blocks.
	if mr := match(""); mr.Matches[0].Worker != "pod#dp1" || mr.Matches[0].Tiers != [3]int{3, 3, 3} || mr.Matches[0].Predicted != 1 {
		t.Fatalf("after routed: %+v", mr)
	}
	metrics := c.text("/metrics")
	for _, want := range []string{
		`kvindex_tier_blocks{tier="device"} 2`,
		`kvindex_tier_blocks{tier="host"} 2`,
		`kvindex_tier_blocks{tier="disk"} 2`,
		`kvindex_blocks 6`,
		`kvindex_index_skipped_copies_total 1`,
		`kvindex_events_applied_total{kind="copied",worker="pod#dp0"} 1`,
		`kvindex_events_applied_total{kind="copied",worker="pod#dp1"} 1`,
		`kvindex_events_rejected_total{reason="medium",worker="pod#dp1"} 1`,
		`kvindex_events_rejected_total{reason="hash_only",worker="pod#dp1"} 1`,
	} {
		if !strings.Contains(metrics, want) {
			t.Errorf("metrics lack %q", want)
		}
	}
}
