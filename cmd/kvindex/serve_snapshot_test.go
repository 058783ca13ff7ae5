package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kvindex/kvindex/server"
	"github.com/kvindex/kvindex/subscriber/pubtest"
)

// TestServeSnapshotZMQResume: serve --snapshot FILE without NATS. An engine publishes
// 10 batches while serve runs, serve stops (final snapshot), the engine publishes 2 more
// while it is down, with a replay buffer of 4 batches. Restarted from the snapshot,
// the worker resumes from its cursor by replay and is live with all 12 blocks; started
// without one (as before --snapshot existed in ZeroMQ mode) it is stale, the buffer no
// longer holding the history.
func TestServeSnapshotZMQResume(t *testing.T) {
	pubtest.Require(t)
	pub, err := pubtest.Start(pubtest.Options{BufferSteps: 4, Bind: true})
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	r := pub.Ranks[0]
	snap := filepath.Join(t.TempDir(), "index.snap")
	var tokens []uint32
	publish := func(i int, send bool) {
		t.Helper()
		ev := pubtest.Event{Type: "BlockStored", BlockHashes: []uint64{uint64(100 + i)}, TokenIDs: []uint32{uint32(i), 3, 5, 7}, BlockSize: 4}
		if i > 0 {
			p := uint64(100 + i - 1)
			ev.Parent = &p
		}
		if _, err := pub.Publish(0, send, ev); err != nil {
			t.Fatal(err)
		}
		tokens = append(tokens, uint32(i), 3, 5, 7)
	}
	run := func(extra ...string) (addr string, stop func()) {
		t.Helper()
		args := append([]string{"--listen", "127.0.0.1:0", "--log-level", "warn", "--grace", "1h",
			"--engine", fmt.Sprintf("endpoint=%s,replay=%s,worker=w,model=m,block_size=4", r.Endpoint, r.ReplayEndpoint)}, extra...)
		var out, errOut syncBuffer
		done, cancel := background(t, func(ctx context.Context) int { return serveMain(ctx, args, &out, &errOut) })
		addr = waitListening(t, &out, &errOut)
		return addr, func() {
			cancel()
			if code := <-done; code != 0 {
				t.Fatalf("serve exit %d: %s", code, errOut.String())
			}
		}
	}
	tr := &http.Transport{}
	defer tr.CloseIdleConnections()
	hc := &http.Client{Transport: tr, Timeout: 5 * time.Second}
	worker := func(addr string) server.WorkerInfo {
		t.Helper()
		resp, err := hc.Get("http://" + addr + "/v1/workers")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var ws struct{ Workers []server.WorkerInfo }
		if err := json.NewDecoder(resp.Body).Decode(&ws); err != nil || len(ws.Workers) != 1 {
			t.Fatalf("workers: %v %+v", err, ws)
		}
		return ws.Workers[0]
	}
	waitWorker := func(addr, state string, seq int64) { // seq -1: none yet
		t.Helper()
		deadline := time.Now().Add(20 * time.Second)
		for {
			w := worker(addr)
			if w.State == state && ((seq < 0 && w.LastSeq == nil) || (w.LastSeq != nil && int64(*w.LastSeq) == seq)) {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("worker %+v, want %s at seq %d", w, state, seq)
			}
			time.Sleep(10 * time.Millisecond) // bounded poll of a condition
		}
	}
	score := func(addr string) int {
		t.Helper()
		b, _ := json.Marshal(map[string]any{"model": "m", "tokens": tokens})
		resp, err := hc.Post("http://"+addr+"/v1/match", "application/json", strings.NewReader(string(b)))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var mr server.MatchResponse
		if err := json.NewDecoder(resp.Body).Decode(&mr); err != nil {
			t.Fatal(err)
		}
		if len(mr.Matches) == 0 {
			return 0
		}
		return mr.Matches[0].Score
	}

	addr, stop := run("--snapshot", snap, "--snapshot-interval", "0")
	waitWorker(addr, "live", -1) // synced on an empty buffer; then live batches:
	for i := range 10 {
		publish(i, true)
	}
	waitWorker(addr, "live", 9)
	stop()
	if _, err := os.Stat(snap); err != nil {
		t.Fatalf("final snapshot: %v", err)
	}
	if ents, _ := os.ReadDir(filepath.Dir(snap)); len(ents) != 1 {
		t.Fatalf("the snapshot is one file; the directory holds %d", len(ents))
	}
	publish(10, false) // while serve is down: buffered, not sent
	publish(11, false)

	addr, stop = run("--snapshot", snap, "--snapshot-interval", "0")
	waitWorker(addr, "live", 11)
	if got := score(addr); got != 12 {
		t.Fatalf("resumed worker scores %d of 12 blocks", got)
	}
	stop()

	addr, stop = run() // no snapshot: only 4 batches are buffered
	waitWorker(addr, "stale", 11)
	if got := score(addr); got != 0 {
		t.Fatalf("fresh worker scores %d (its history is gone: blocks 8-11 lack their parents)", got)
	}
	stop()
}

// TestServeSnapshotResumesFileEngines: an engine of the --engines-file is in the
// snapshot's plan like a configured one: after a restart its worker resumes from its
// cursor by replay (live with every block), where a restart without the snapshot finds
// the engine's buffer too short and the worker stale.
func TestServeSnapshotResumesFileEngines(t *testing.T) {
	pubtest.Require(t)
	pub, err := pubtest.Start(pubtest.Options{BufferSteps: 2, Bind: true})
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	r := pub.Ranks[0]
	dir := t.TempDir()
	snap, file := filepath.Join(dir, "index.snap"), filepath.Join(dir, "engines.json")
	spec, _ := json.Marshal([]server.EngineConfig{{Endpoint: r.Endpoint, ReplayEndpoint: r.ReplayEndpoint, Worker: "w", Model: "m", BlockSize: 4}})
	if err := os.WriteFile(file, spec, 0o600); err != nil {
		t.Fatal(err)
	}
	publish := func(i int, send bool) {
		t.Helper()
		ev := pubtest.Event{Type: "BlockStored", BlockHashes: []uint64{uint64(100 + i)}, TokenIDs: []uint32{uint32(i), 3, 5, 7}, BlockSize: 4}
		if i > 0 {
			p := uint64(100 + i - 1)
			ev.Parent = &p
		}
		if _, err := pub.Publish(0, send, ev); err != nil {
			t.Fatal(err)
		}
	}
	run := func(extra ...string) (addr string, stop func()) {
		t.Helper()
		args := append([]string{"--listen", "127.0.0.1:0", "--log-level", "warn", "--grace", "1h", "--engines-file", file}, extra...)
		var out, errOut syncBuffer
		done, cancel := background(t, func(ctx context.Context) int { return serveMain(ctx, args, &out, &errOut) })
		addr = waitListening(t, &out, &errOut)
		return addr, func() {
			cancel()
			if code := <-done; code != 0 {
				t.Fatalf("serve exit %d: %s", code, errOut.String())
			}
		}
	}
	waitWorker := func(addr, state string, seq int64, size int) { // seq -1: none yet
		t.Helper()
		deadline := time.Now().Add(20 * time.Second)
		for {
			resp, err := http.Get("http://" + addr + "/v1/workers")
			if err != nil {
				t.Fatal(err)
			}
			var ws struct{ Workers []server.WorkerInfo }
			err = json.NewDecoder(resp.Body).Decode(&ws)
			resp.Body.Close()
			if err == nil && len(ws.Workers) == 1 {
				w := ws.Workers[0]
				atSeq := (seq < 0 && w.LastSeq == nil) || (w.LastSeq != nil && int64(*w.LastSeq) == seq)
				if w.State == state && atSeq && w.Size != nil && *w.Size == size {
					return
				}
				if time.Now().After(deadline) {
					t.Fatalf("worker %+v, want %s at seq %d with %d blocks", w, state, seq, size)
				}
			}
			time.Sleep(10 * time.Millisecond) // bounded poll of a condition
		}
	}
	addr, stop := run("--snapshot", snap, "--snapshot-interval", "0")
	waitWorker(addr, "live", -1, 0) // synced on an empty buffer; then live batches:
	for i := range 4 {
		publish(i, true)
	}
	waitWorker(addr, "live", 3, 4)
	stop()
	publish(4, false) // while serve is down: buffered only; the buffer now holds 3 and 4
	addr, stop = run("--snapshot", snap, "--snapshot-interval", "0")
	waitWorker(addr, "live", 4, 5)
	stop()
	addr, stop = run() // no snapshot: the buffer lacks batches 0-2
	waitWorker(addr, "stale", 4, 0)
	stop()
}
