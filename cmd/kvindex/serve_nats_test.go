package main

import (
	"context"
	"encoding/json"
	"math/rand/v2"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/kvindex/kvindex/fabric"
	"github.com/kvindex/kvindex/internal/oplog"
	"github.com/kvindex/kvindex/internal/refmodel"
	"github.com/kvindex/kvindex/internal/replay"
	"github.com/kvindex/kvindex/server"
	"github.com/kvindex/kvindex/subscriber"
)

// TestServeNATS: a relay-side publisher writes a random history to a JetStream stream;
// two `kvindex serve --nats` replicas (one restarted from its snapshot) answer every
// query over HTTP as the reference model does.
func TestServeNATS(t *testing.T) {
	url := relayNATS(t)
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	pub, err := fabric.NewPublisher(ctx, nc, fabric.PublisherConfig{})
	if err != nil {
		t.Fatal(err)
	}
	ops := refmodel.RandomOps(rand.New(rand.NewPCG(11, 12)), 1200, refmodel.RandomOptions{Workers: 4, MaxChain: 60})
	m := refmodel.New()
	seqs := map[string]uint64{}
	var queries [][]uint64
	ns := subscriber.Namespace("llama", "")
	for i := range ops {
		op := &ops[i]
		if op.Kind == oplog.Query {
			if len(op.Content) > 0 {
				queries = append(queries, op.Content)
			}
			continue
		}
		_ = m.Apply(op)
		ev := replay.Event(op)
		if ev.Kind == 0 {
			continue
		}
		ev.Namespace = ns
		seqs[ev.Worker]++
		if err := pub.Publish(ctx, "llama", &ev, seqs[ev.Worker]); err != nil {
			t.Fatal(err)
		}
	}
	snap := filepath.Join(t.TempDir(), "replica.snap")
	for round := 0; round < 2; round++ { // the second round restores the first's snapshot
		var out, errOut syncBuffer
		done, stop := background(t, func(ctx context.Context) int {
			return serveMain(ctx, []string{"--nats", url, "--models", "llama=4", "--listen", "127.0.0.1:0",
				"--snapshot", snap, "--log-level", "warn"}, &out, &errOut)
		})
		addr := waitListening(t, &out, &errOut)
		tr := &http.Transport{}
		hc := &http.Client{Transport: tr, Timeout: 5 * time.Second}
		deadline := time.Now().Add(15 * time.Second)
		for {
			resp, err := hc.Get("http://" + addr + "/readyz")
			if err == nil {
				resp.Body.Close()
				if resp.StatusCode == 200 {
					break
				}
			}
			if time.Now().After(deadline) {
				t.Fatalf("round %d: never ready; stderr %q", round, errOut.String())
			}
			time.Sleep(5 * time.Millisecond) // bounded poll of a condition
		}
		for _, q := range queries {
			body, _ := json.Marshal(map[string]any{"model": "llama", "content_hashes": q})
			resp, err := hc.Post("http://"+addr+"/v1/match", "application/json", strings.NewReader(string(body)))
			if err != nil {
				t.Fatal(err)
			}
			var got server.MatchResponse
			err = json.NewDecoder(resp.Body).Decode(&got)
			resp.Body.Close()
			if err != nil || resp.StatusCode != 200 {
				t.Fatalf("match: %v (status %d)", err, resp.StatusCode)
			}
			want := m.Query(q)
			if len(want) != len(got.Matches) {
				t.Fatalf("round %d, query %v: want %v, got %+v", round, q, want, got.Matches)
			}
			for j, a := range want {
				g := got.Matches[j]
				if g.Worker != a.Worker || g.Score != a.Score || g.Size != a.Size {
					t.Fatalf("round %d, query %v: want %v, got %+v", round, q, want, got.Matches)
				}
			}
		}
		tr.CloseIdleConnections()
		stop()
		select {
		case code := <-done:
			if code != 0 {
				t.Fatalf("round %d: exit %d, stderr %q", round, code, errOut.String())
			}
		case <-time.After(15 * time.Second):
			t.Fatal("serve did not stop")
		}
	}
	if code, _, stderr := runCLI(t, "serve", "--models", "llama=4"); code != 2 {
		t.Fatalf("--models without --nats: exit %d (%s)", code, stderr)
	}
}
