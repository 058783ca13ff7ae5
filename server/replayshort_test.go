package server_test

import (
	"context"
	"testing"
	"time"

	"github.com/kvindex/kvindex/internal/fakevllm"
	"github.com/kvindex/kvindex/server"
)

// TestReplayCutShort (issue 33, row 11): an engine's ROUTER past its high-water mark
// drops the rest of a replay reply, end marker included. The worker stayed live and
// exact, /readyz 200, holding a third of the engine's blocks until the engine's next
// event. Now a replay that breaks off leaves the worker stale (replay_short in
// /v1/workers, /readyz 503 naming it) and the catch-up is retried from where it
// stopped until one completes: then the worker is live, holding every batch.
func TestReplayCutShort(t *testing.T) {
	fl, err := fakevllm.NewFleet(fakevllm.FleetConfig{Engines: 1, Drivers: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer fl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	fl.Drive(ctx, 2000, 200*time.Millisecond, false) // before serve: kept in the replay buffer only
	batches := fl.Counts()[0].Batches
	if batches < 30 {
		t.Fatalf("the engine published %d batches, want 30 or more", batches)
	}
	fl.SetReplayCut(int(batches / 3))
	pub, rep := fl.Endpoints(0)
	worker := fakevllm.WorkerName(0)
	_, c := start(t, server.Config{Listen: "127.0.0.1:0",
		Engines:       []server.EngineConfig{{Endpoint: pub, ReplayEndpoint: rep, Worker: worker, Model: fakevllm.Model, BlockSize: 16}},
		ReplayTimeout: server.Duration(200 * time.Millisecond),
		ReconnectMin:  server.Duration(50 * time.Millisecond), ReconnectMax: server.Duration(100 * time.Millisecond)})
	info := func() server.WorkerInfo {
		var ws struct{ Workers []server.WorkerInfo }
		c.do("GET", "/v1/workers", "", &ws)
		if len(ws.Workers) != 1 {
			t.Fatalf("workers: %+v", ws.Workers)
		}
		return ws.Workers[0]
	}
	waitFor(t, "the short replay", func() bool { w := info(); return w.Synced && w.ReplayShort })
	fl.SetReplayCut(1) // the retries make no progress while the test looks
	if w := info(); w.State != "stale" || w.LastSeq == nil || *w.LastSeq+1 >= batches {
		t.Fatalf("after a replay cut short: state %s, last seq %v of %d batches", w.State, w.LastSeq, batches)
	}
	var ready struct {
		Ready   bool
		Waiting []string
	}
	if code := c.do("GET", "/readyz", "", &ready); code != 503 || len(ready.Waiting) != 1 {
		t.Fatalf("readyz with the replay cut short: %d %+v", code, ready)
	}
	// The retries resume where the last one stopped: the worker catches up even with
	// every reply still cut short, and is live, holding every batch.
	fl.SetReplayCut(int(batches / 3))
	waitFor(t, "the catch-up", func() bool { w := info(); return w.State == "live" && !w.ReplayShort })
	if w := info(); w.LastSeq == nil || *w.LastSeq+1 != batches {
		t.Fatalf("after the retries: last seq %v, want %d", w.LastSeq, batches-1)
	}
	c.waitReady(t)
}
