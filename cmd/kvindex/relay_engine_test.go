package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/kvindex/kvindex/engine"
	"github.com/kvindex/kvindex/fabric"
	"github.com/kvindex/kvindex/hash"
	"github.com/kvindex/kvindex/internal/oplog"
	"github.com/kvindex/kvindex/internal/refmodel"
	"github.com/kvindex/kvindex/subscriber"
	"github.com/kvindex/kvindex/subscriber/pubtest"
)

func relayTokens(c uint64) []uint32 { return []uint32{uint32(c), 7, 9, uint32(c >> 32)} }

// TestRelayFollowsEngines: `kvindex relay --engine` follows a vLLM-protocol publisher
// over real libzmq into a JetStream stream, is killed and restarted mid-stream (its
// subscriber then replays the engine's buffer from the start), and a replica of the
// stream ends equal to the reference model: every event once, none lost.
func TestRelayFollowsEngines(t *testing.T) {
	pubtest.Require(t)
	pub, err := pubtest.Start(pubtest.Options{Bind: true})
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	url := relayNATS(t)
	const worker, model, bs = "pod-0", "llama", 4
	engineSpec := fmt.Sprintf("endpoint=%s,replay=%s,worker=%s,model=%s,block_size=%d",
		pub.Ranks[0].Endpoint, pub.Ranks[0].ReplayEndpoint, worker, model, bs)
	var relayLog, relayOut *syncBuffer
	startRelay := func() (stop func()) {
		var out, errOut syncBuffer
		relayLog = &errOut
		relayOut = &out
		done, cancel := background(t, func(ctx context.Context) int {
			return relayMain(ctx, []string{"--nats", url, "--memory", "--engine", engineSpec, "--log-level", "warn"}, &out, &errOut)
		})
		return func() {
			cancel()
			select {
			case code := <-done:
				if code != 0 || testing.Verbose() {
					t.Logf("relay exit %d: %s", code, errOut.String())
				}
			case <-time.After(15 * time.Second):
				t.Fatal("relay did not stop")
			}
		}
	}

	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	m := refmodel.New()
	var queries [][]uint64
	events := 0
	r := rand.New(rand.NewPCG(21, 22))
	ops := refmodel.RandomOps(r, 600, refmodel.RandomOptions{Workers: 1, MaxChain: 30})
	publishSome := func(from, to int) {
		for i := from; i < to; i++ {
			op := ops[i]
			if op.Kind == oplog.Query {
				q := make([]uint64, len(op.Content))
				for j, c := range op.Content {
					q[j] = hash.Content(relayTokens(c))
				}
				queries = append(queries, q)
				continue
			}
			ev, blocks := pubtest.FromOp(&op, bs, relayTokens)
			switch op.Kind {
			case oplog.Stored:
				_ = m.Stored(worker, op.Parent, op.HasParent, blocks)
			case oplog.Removed:
				m.Removed(worker, op.Seqs)
			default:
				m.Cleared(worker)
			}
			if _, err := pub.Publish(0, true, ev); err != nil {
				t.Fatal(err)
			}
			events++
		}
	}

	stop := startRelay()
	defer func() {
		if t.Failed() {
			t.Logf("relay stdout:\n%s\nrelay log:\n%s", relayOut.String(), relayLog.String())
		}
	}()
	publishSome(0, len(ops)/2)
	waitStream(t, nc, events)
	stop() // the relay dies; the engine keeps its history buffered
	stop = startRelay()
	publishSome(len(ops)/2, len(ops))
	waitStream(t, nc, events)
	stop()

	// A replica of the whole stream equals the reference model.
	rep := fabric.NewReplica(nc, fabric.ReplicaConfig{Engine: engine.Config{Shards: 2}})
	defer rep.Close()
	ctx := context.Background()
	if err := rep.Start(ctx, ""); err != nil {
		t.Fatal(err)
	}
	js, _ := nc.JetStream()
	info, err := js.StreamInfo(fabric.DefaultStream)
	if err != nil {
		t.Fatal(err)
	}
	if err := rep.WaitFor(ctx, info.State.LastSeq); err != nil {
		t.Fatal(err)
	}
	// Exactly once: one message per engine event, although the restarted relay's
	// subscriber replayed the engine's buffer from its start.
	if info.State.Msgs != uint64(events) {
		t.Fatalf("the stream holds %d messages for %d engine events", info.State.Msgs, events)
	}
	if st := rep.Stats(); st.Duplicates != 0 {
		t.Fatalf("the stream holds events twice: %+v", st)
	}
	e := rep.Engine()
	if err := e.Barrier(ctx); err != nil {
		t.Fatal(err)
	}
	ns := subscriber.Namespace(model, "")
	for _, q := range queries {
		got, err := e.FindMatchesIn(ctx, ns, q, nil)
		if err != nil {
			t.Fatal(err)
		}
		want := m.Query(q)
		if len(got) != len(want) {
			t.Fatalf("query %v: got %v, want %v", q, got, want)
		}
		for i := range want {
			if refmodel.Answer(got[i]) != want[i] {
				t.Fatalf("query %v: got %v, want %v", q, got, want)
			}
		}
	}
	if sz, _ := e.WorkerSize(worker); int64(sz) != int64(m.Blocks()) {
		t.Fatalf("size %d, model %d", sz, m.Blocks())
	}
}

// waitStream waits (bounded) until the stream holds n messages: the relay has
// published every event the engine has sent so far.
func waitStream(t *testing.T, nc *nats.Conn, n int) {
	t.Helper()
	js, err := nc.JetStream()
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		if info, err := js.StreamInfo(fabric.DefaultStream); err == nil && info.State.Msgs >= uint64(n) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the relay never published the engine's %d events", n)
		}
		time.Sleep(10 * time.Millisecond) // bounded poll of a condition
	}
}
