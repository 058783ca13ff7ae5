package main

import (
	"context"
	"encoding/json"
	"io"
	"math/rand/v2"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/kvindex/kvindex/engine"
	"github.com/kvindex/kvindex/fabric"
	"github.com/kvindex/kvindex/internal/oplog"
	"github.com/kvindex/kvindex/internal/refmodel"
	"github.com/kvindex/kvindex/internal/replay"
	"github.com/kvindex/kvindex/subscriber"
)

// TestDoctorCompareResync: two `kvindex serve --nats` replicas of one stream, one of them
// started from a snapshot that holds a block the stream never carried (a replica fed
// differently). `kvindex doctor --compare` names exactly that worker between the two
// replicas and between the clean replica and the snapshot, finds none between the
// other replica and its snapshot, and with --resync has the differing replica rebuild
// the worker from the stream, after which the replicas agree.
func TestDoctorCompareResync(t *testing.T) {
	ctx, url, snap, victim, ns := strayStream(t)
	hc := &http.Client{Timeout: 5 * time.Second}
	clean := startReplicaServe(t, hc, url)
	fed := startReplicaServe(t, hc, url, "--snapshot", snap)

	doctor := func(args ...string) (int, string) {
		var out, errOut syncBuffer
		code := doctorMain(ctx, args, &out, &errOut)
		return code, out.String() + errOut.String()
	}
	code, out := doctor("--compare", clean, fed)
	if code != 1 || !strings.Contains(out, "1 differ") || !strings.Contains(out, "  "+victim+":") {
		t.Fatalf("compare of the replicas: exit %d, want 1 naming %q:\n%s", code, victim, out)
	}
	if code, out := doctor("--compare", fed, snap); code != 0 || !strings.Contains(out, ": 0 differ") {
		t.Fatalf("compare of a replica and its snapshot: exit %d, want 0:\n%s", code, out)
	}
	code, out = doctor("--compare", "--json", clean, snap)
	var report compareReport
	if err := json.Unmarshal([]byte(out), &report); code != 1 || err != nil || len(report.Differ) != 1 || report.Differ[0].Worker != victim ||
		len(report.Differ[0].Namespaces) != 1 || report.Differ[0].Namespaces[0] != ns || report.Differ[0].B.Blocks != report.Differ[0].A.Blocks+1 {
		t.Fatalf("compare of a replica and the snapshot: exit %d (%v), want 1 with %q's namespace %q one block apart:\n%s", code, err, victim, ns, out)
	}
	code, out = doctor("--compare", "--resync", fed, clean)
	if code != 0 || !strings.Contains(out, "resynced "+victim) || !strings.Contains(out, "after the resync: 0 differ") {
		t.Fatalf("resync: exit %d, want 0:\n%s", code, out)
	}
	if code, out := doctor("--compare", clean, fed); code != 0 {
		t.Fatalf("after the resync: exit %d, want 0:\n%s", code, out)
	}
	if code, out := doctor("--compare", "--resync", snap, clean); code != 2 {
		t.Fatalf("--resync of a snapshot: exit %d, want 2:\n%s", code, out)
	}
	if code, out := doctor("--compare", clean); code != 2 {
		t.Fatalf("one source: exit %d, want 2:\n%s", code, out)
	}
}

// strayStream publishes a random history of model "llama" to a new JetStream stream and
// writes the snapshot of a replica of it that applied one block more than the stream
// holds, for worker victim in namespace ns.
func strayStream(t *testing.T) (ctx context.Context, url, snap, victim, ns string) {
	t.Helper()
	url = relayNATS(t)
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	pub, err := fabric.NewPublisher(ctx, nc, fabric.PublisherConfig{})
	if err != nil {
		t.Fatal(err)
	}
	ns = subscriber.Namespace("llama", "")
	seqs := map[string]uint64{}
	n := 0
	for _, op := range refmodel.RandomOps(rand.New(rand.NewPCG(3, 4)), 600, refmodel.RandomOptions{Workers: 3, MaxChain: 40}) {
		if op.Kind == oplog.Query {
			continue
		}
		ev := replay.Event(&op)
		if ev.Kind == 0 {
			continue
		}
		ev.Namespace = ns
		seqs[ev.Worker]++
		if err := pub.Publish(ctx, "llama", &ev, seqs[ev.Worker]); err != nil {
			t.Fatal(err)
		}
		n++
	}

	// The snapshot of a replica that applied one block more than the stream holds.
	snap = filepath.Join(t.TempDir(), "replica.snap")
	rep := fabric.NewReplica(nc, fabric.ReplicaConfig{Models: []string{"llama"}})
	if err := rep.Start(ctx, ""); err != nil {
		t.Fatal(err)
	}
	if err := rep.WaitFor(ctx, uint64(n)); err != nil {
		t.Fatal(err)
	}
	victim = rep.Workers()[0].Worker
	stray := engine.Event{Kind: engine.EventStored, Worker: victim, Namespace: ns, Blocks: []engine.Block{{Content: 4242, Seq: 1 << 62}}}
	if err := rep.Engine().Apply(&stray); err != nil {
		t.Fatal(err)
	}
	if err := rep.Snapshot(snap); err != nil {
		t.Fatal(err)
	}
	if err := rep.Close(); err != nil {
		t.Fatal(err)
	}

	return ctx, url, snap, victim, ns
}

// startReplicaServe starts `kvindex serve --nats url --models llama=4` with extra flags
// and returns its base URL once it is ready.
func startReplicaServe(t *testing.T, hc *http.Client, url string, extra ...string) string {
	t.Helper()
	var out, errOut syncBuffer
	background(t, func(ctx context.Context) int {
		return serveMain(ctx, append([]string{"--nats", url, "--models", "llama=4", "--listen", "127.0.0.1:0", "--log-level", "warn"}, extra...), &out, &errOut)
	})
	addr := waitListening(t, &out, &errOut)
	waitReady(t, hc, addr, &errOut)
	return "http://" + addr
}

// TestServePeerResync: a `serve --nats` replica started from a snapshot holding a block
// the stream never carried, with --peer naming a clean replica and --peer-resync, finds
// the worker differing at equal sequences, rebuilds it from the stream, and then agrees
// with its peer (kvindex doctor --compare); its /metrics count one mismatch and one
// resync.
func TestServePeerResync(t *testing.T) {
	ctx, url, snap, victim, _ := strayStream(t)
	hc := &http.Client{Timeout: 5 * time.Second}
	clean := startReplicaServe(t, hc, url)
	fed := startReplicaServe(t, hc, url, "--snapshot", snap, "--peer", clean, "--peer-interval", "10ms", "--peer-resync")
	metric := func(name string) string {
		resp, err := hc.Get(fed + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		for _, l := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(l, name+" "); ok {
				return v
			}
		}
		return ""
	}
	deadline := time.Now().Add(20 * time.Second)
	for metric(`kvindex_replica_resyncs_total{result="ok"}`) != "1" {
		if time.Now().After(deadline) {
			t.Fatalf("no resync; mismatches %q", metric("kvindex_replica_peer_mismatches_total"))
		}
		time.Sleep(5 * time.Millisecond) // bounded poll of a condition
	}
	if got := metric("kvindex_replica_peer_mismatches_total"); got != "1" {
		t.Fatalf("mismatches %q, want 1", got)
	}
	var out, errOut syncBuffer
	if code := doctorMain(ctx, []string{"--compare", clean, fed}, &out, &errOut); code != 0 {
		t.Fatalf("after the peer resync of %s: exit %d\n%s%s", victim, code, out.String(), errOut.String())
	}
	if code := serveMain(ctx, []string{"--peer", clean, "--listen", "127.0.0.1:0"}, &out, &errOut); code != 2 {
		t.Fatalf("--peer without --nats: exit %d, want 2", code)
	}
}
