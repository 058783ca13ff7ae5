package main

import (
	"context"
	"encoding/json"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kvindex/kvindex/internal/natstest"
	"github.com/kvindex/kvindex/internal/oplog"
	"github.com/kvindex/kvindex/internal/refmodel"
	"github.com/kvindex/kvindex/server"
)

// TestRelayOpsServeMatch runs the command pair a user runs: `kvindex relay --ops LOG
// --model m` into a JetStream stream, then `kvindex serve --nats --models m=16` answering
// POST /v1/match {"model":"m"} with the answers the op log expects. The relay must
// publish into the namespace a replica serving m queries (subscriber.Namespace("m", ""));
// in the op log's own empty namespace no query for m ever matched.
func TestRelayOpsServeMatch(t *testing.T) {
	url := relayNATS(t)
	ops := refmodel.RandomOps(rand.New(rand.NewPCG(26, 1)), 1500, refmodel.RandomOptions{Workers: 5, MaxChain: 40})
	// The log: its events, then each query it drew with the reference model's answer
	// after every event (the state the replica holds once it has caught up).
	m := refmodel.New()
	var log []byte
	var queries []oplog.Op
	for i := range ops {
		if ops[i].Kind == oplog.Query {
			if len(ops[i].Content) > 0 {
				queries = append(queries, ops[i])
			}
			continue
		}
		_ = m.Apply(&ops[i])
		log = oplog.Append(log, ops[i])
	}
	matched := 0
	for i := range queries {
		m.Expect(&queries[i])
		log = oplog.Append(log, queries[i])
		if len(queries[i].Expect) > 0 {
			matched++
		}
	}
	if matched < len(queries)/4 {
		t.Fatalf("only %d of %d queries match anything: the test would prove little", matched, len(queries))
	}
	path := filepath.Join(t.TempDir(), "ops.jsonl")
	if err := os.WriteFile(path, log, 0o644); err != nil {
		t.Fatal(err)
	}
	if code, stdout, stderr := runCLI(t, "relay", "--nats", url, "--ops", path, "--model", "m"); code != 0 {
		t.Fatalf("relay: exit %d\n%s%s", code, stdout, stderr)
	}

	var out, errOut syncBuffer
	done, stop := background(t, func(ctx context.Context) int {
		return serveMain(ctx, []string{"--nats", url, "--models", "m=16", "--listen", "127.0.0.1:0", "--log-level", "warn"}, &out, &errOut)
	})
	addr := waitListening(t, &out, &errOut)
	tr := &http.Transport{}
	defer tr.CloseIdleConnections()
	hc := &http.Client{Transport: tr, Timeout: 5 * time.Second}
	waitReady(t, hc, addr, &errOut)

	// The queries as the log holds them: read back, as a user's log would be.
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	back, err := oplog.ReadAll(f)
	f.Close()
	if err != nil {
		t.Fatal(err)
	}
	checked := 0
	for _, op := range back {
		if op.Kind != oplog.Query || !op.HasExpect {
			continue
		}
		got := postMatch(t, hc, addr, "m", op.Content)
		if len(got.Matches) != len(op.Expect) {
			t.Fatalf("line %d: %d matches %+v, the log expects %v", op.Line, len(got.Matches), got.Matches, op.Expect)
		}
		for _, g := range got.Matches {
			if score, ok := op.Expect[g.Worker]; !ok || g.Score != score || g.Size != op.Sizes[g.Worker] {
				t.Fatalf("line %d: %+v, the log expects %v (sizes %v)", op.Line, g, op.Expect, op.Sizes)
			}
		}
		checked++
	}
	if checked != len(queries) {
		t.Fatalf("checked %d queries, the log has %d", checked, len(queries))
	}
	tr.CloseIdleConnections()
	stop()
	if code := <-done; code != 0 {
		t.Fatalf("serve: exit %d, stderr %q", code, errOut.String())
	}
}

// waitReady polls serve's /readyz until it answers 200.
func waitReady(t *testing.T, hc *http.Client, addr string, errOut *syncBuffer) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for {
		resp, err := hc.Get("http://" + addr + "/readyz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("never ready; stderr %q", errOut.String())
		}
		time.Sleep(5 * time.Millisecond) // bounded poll of a condition
	}
}

// postMatch asks serve's POST /v1/match for model's matches of content hashes q.
func postMatch(t *testing.T, hc *http.Client, addr, model string, q []uint64) server.MatchResponse {
	t.Helper()
	body, _ := json.Marshal(map[string]any{"model": model, "content_hashes": q})
	resp, err := hc.Post("http://"+addr+"/v1/match", "application/json", strings.NewReader(string(body)))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var got server.MatchResponse
	if err := json.NewDecoder(resp.Body).Decode(&got); err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("match: %v (status %d)", err, resp.StatusCode)
	}
	return got
}

// TestRelaySplitsPastMaxPayload: a store of 66,000 blocks (a ~1.05M-token prefill at
// block size 16, inside MaxEventBlocks and the frame cap) is over NATS's default 1 MiB
// max_payload. `kvindex relay --ops` publishes it in parts and exits 0 (it exited 1 with
// "nats: maximum payload exceeded", and so did every restart), and a `serve --nats`
// replica matches all of it.
func TestRelaySplitsPastMaxPayload(t *testing.T) {
	url := relayNATS(t)
	const n = 66000
	op := oplog.Op{Kind: oplog.Stored, Worker: "prefill"}
	q := make([]uint64, n)
	for i := range n {
		op.Blocks = append(op.Blocks, [2]uint64{uint64(i%97 + 1), uint64(i + 1)})
		q[i] = uint64(i%97 + 1)
	}
	path := filepath.Join(t.TempDir(), "big.jsonl")
	if err := os.WriteFile(path, oplog.Append(nil, op), 0o644); err != nil {
		t.Fatal(err)
	}
	code, stdout, stderr := runCLI(t, "relay", "--nats", url, "--ops", path, "--model", "m")
	if code != 0 || !strings.Contains(stdout, "1 split to fit max_payload, 0 refused") {
		t.Fatalf("relay: exit %d\n%s%s", code, stdout, stderr)
	}
	var out, errOut syncBuffer
	done, stop := background(t, func(ctx context.Context) int {
		return serveMain(ctx, []string{"--nats", url, "--models", "m=16", "--listen", "127.0.0.1:0", "--log-level", "warn"}, &out, &errOut)
	})
	addr := waitListening(t, &out, &errOut)
	tr := &http.Transport{}
	defer tr.CloseIdleConnections()
	hc := &http.Client{Transport: tr, Timeout: 10 * time.Second}
	waitReady(t, hc, addr, &errOut)
	got := postMatch(t, hc, addr, "m", q[:60000]) // under max_query_blocks (65,536)
	if len(got.Matches) != 1 || got.Matches[0].Score != 60000 || got.Matches[0].Size != n {
		t.Fatalf("matches %+v, want prefill scoring 60000, holding %d blocks", got.Matches, n)
	}
	tr.CloseIdleConnections()
	stop()
	if code := <-done; code != 0 {
		t.Fatalf("serve: exit %d, stderr %q", code, errOut.String())
	}
}

// TestRelayServeNATSCredentials: against a NATS server that requires a user and a
// password, relay --ops and serve --nats connect with --nats-user and
// --nats-password-file and serve matches the log; without them relay exits 1 (before,
// neither had a way to give credentials).
func TestRelayServeNATSCredentials(t *testing.T) {
	url := natstest.Start(t, natstest.Options{JetStream: true, User: "kvindex", Password: "not-on-the-command-line"}).URL()
	dir := t.TempDir()
	pw := filepath.Join(dir, "pw")
	log := filepath.Join(dir, "ops.jsonl")
	op := oplog.Op{Kind: oplog.Stored, Worker: "w", Blocks: [][2]uint64{{7, 1}, {8, 2}}}
	if err := os.WriteFile(pw, []byte("not-on-the-command-line\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(log, oplog.Append(nil, op), 0o600); err != nil {
		t.Fatal(err)
	}
	if code, _, stderr := runCLI(t, "relay", "--nats", url, "--ops", log, "--model", "m", "--connect-timeout", "300ms"); code != 1 {
		t.Fatalf("relay without credentials: exit %d (%s)", code, stderr)
	}
	creds := []string{"--nats-user", "kvindex", "--nats-password-file", pw}
	if code, stdout, stderr := runCLI(t, append([]string{"relay", "--nats", url, "--ops", log, "--model", "m"}, creds...)...); code != 0 {
		t.Fatalf("relay: exit %d\n%s%s", code, stdout, stderr)
	}
	var out, errOut syncBuffer
	done, stop := background(t, func(ctx context.Context) int {
		return serveMain(ctx, append([]string{"--nats", url, "--models", "m=16", "--listen", "127.0.0.1:0", "--log-level", "warn"}, creds...), &out, &errOut)
	})
	addr := waitListening(t, &out, &errOut)
	tr := &http.Transport{}
	defer tr.CloseIdleConnections()
	hc := &http.Client{Transport: tr, Timeout: 5 * time.Second}
	waitReady(t, hc, addr, &errOut)
	if got := postMatch(t, hc, addr, "m", []uint64{7, 8}); len(got.Matches) != 1 || got.Matches[0].Score != 2 {
		t.Fatalf("matches %+v", got.Matches)
	}
	tr.CloseIdleConnections()
	stop()
	if code := <-done; code != 0 {
		t.Fatalf("serve: exit %d, stderr %q", code, errOut.String())
	}
}
