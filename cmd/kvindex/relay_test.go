package main

import (
	"context"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/kvindex/kvindex/fabric"
	"github.com/kvindex/kvindex/internal/natstest"
	"github.com/kvindex/kvindex/internal/oplog"
	"github.com/kvindex/kvindex/internal/refmodel"
	"github.com/kvindex/kvindex/subscriber"
)

// relayNATS starts a NATS server with JetStream on 127.0.0.1 (a nats-server process,
// stopped at cleanup) and returns its URL.
func relayNATS(t *testing.T) string {
	t.Helper()
	return natstest.Start(t, natstest.Options{JetStream: true}).URL()
}

func TestRelayBadFlags(t *testing.T) {
	for _, args := range [][]string{
		{"relay"},
		{"relay", "--ops", "x.jsonl"},
		{"relay", "--nats", "nats://127.0.0.1:1"},
		{"relay", "--nats", "nats://127.0.0.1:1", "--ops", "x", "--engine", "endpoint=tcp://127.0.0.1:5557"},
		{"relay", "--nats", "nats://127.0.0.1:1", "extra"},
		{"relay", "--nats", "nats://127.0.0.1:1", "--engine", "endpoint=bogus"},
		{"relay", "--nats", "nats://127.0.0.1:1", "--engine", "endpoint=tcp://127.0.0.1:5557", "--tiers", "CPU=ram"},
		{"relay", "--nats", "nats://127.0.0.1:1", "--engine", "endpoint=tcp://127.0.0.1:5557", "--tiers", "CPU"},
	} {
		if code, _, stderr := runCLI(t, args...); code != 2 {
			t.Errorf("%q: exit %d, want 2 (stderr %q)", args, code, stderr)
		}
	}
}

// TestRelayOps: kvindex relay --ops publishes a random history; a replica answers
// every query as the reference model; running the relay again adds nothing.
func TestRelayOps(t *testing.T) {
	url := relayNATS(t)
	r := rand.New(rand.NewPCG(7, 8))
	all := refmodel.RandomOps(r, 1500, refmodel.RandomOptions{})
	var buf []byte
	model := refmodel.New()
	var queries [][]uint64
	events := 0
	for i := range all {
		if all[i].Kind == oplog.Query {
			queries = append(queries, all[i].Content)
			continue
		}
		events++
		_ = model.Apply(&all[i])
		buf = oplog.Append(buf, all[i])
	}
	path := filepath.Join(t.TempDir(), "ops.jsonl")
	if err := os.WriteFile(path, buf, 0o644); err != nil {
		t.Fatal(err)
	}
	args := []string{"relay", "--nats", url, "--ops", path, "--model", "m", "--memory", "--stream", "T"}
	code, stdout, stderr := runCLI(t, args...)
	if code != 0 || !strings.Contains(stdout, "published") {
		t.Fatalf("relay: exit %d\n%s%s", code, stdout, stderr)
	}
	code, stdout, stderr = runCLI(t, args...) // a restarted relay
	if code != 0 || !strings.Contains(stdout, " 0 published") {
		t.Fatalf("second relay: exit %d\n%s%s", code, stdout, stderr)
	}

	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	rep := fabric.NewReplica(nc, fabric.ReplicaConfig{Stream: fabric.StreamConfig{Name: "T"}})
	defer rep.Close()
	if err := rep.Start(ctx, ""); err != nil {
		t.Fatal(err)
	}
	if err := rep.WaitFor(ctx, uint64(events)); err != nil {
		t.Fatal(err)
	}
	if st := rep.Stats(); st.Applied != uint64(events) || st.LastApplied != uint64(events) {
		t.Fatalf("replica %+v, want %d events", st, events)
	}
	e := rep.Engine()
	if err := e.Barrier(ctx); err != nil {
		t.Fatal(err)
	}
	for _, q := range queries {
		got, err := e.FindMatchesIn(ctx, subscriber.Namespace("m", ""), q, nil) // --model m's namespace
		if err != nil {
			t.Fatal(err)
		}
		want := model.Query(q)
		ok := len(got) == len(want)
		for i := 0; ok && i < len(got); i++ {
			ok = got[i].Worker == want[i].Worker && got[i].Score == want[i].Score && got[i].Size == want[i].Size
		}
		if !ok {
			t.Fatalf("query %v: got %+v, want %+v", q, got, want)
		}
	}
}
