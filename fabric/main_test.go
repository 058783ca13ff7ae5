package fabric

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/goleak"

	"github.com/kvindex/kvindex/engine"
	"github.com/kvindex/kvindex/internal/namespace"
	"github.com/kvindex/kvindex/internal/natstest"
	"github.com/kvindex/kvindex/internal/oplog"
	"github.com/kvindex/kvindex/internal/refmodel"
	"github.com/kvindex/kvindex/internal/testsize"
)

// TestMain checks for leaked goroutines as goleak.VerifyTestMain does, but gives them
// up to 10 s to end instead of goleak's half second: a closed NATS connection's
// goroutines can take longer than that to exit on a loaded 2-core machine (make test
// runs packages in parallel).
//
// One goroutine of nats.go is not ours to end: the first async publish of a JetStream
// context starts resetPendingAcksOnReconnect, which reads the context's status channel
// when it gets to run; if the context's cleanup has set that channel to nil first, the
// goroutine waits on a nil channel forever (nats.go v1.55.0, jetstream/publish.go and
// cleanupReplySub in jetstream/jetstream.go). It holds no connection: a leaked
// connection still shows as its own goroutines.
func TestMain(m *testing.M) {
	code := m.Run()
	if code == 0 {
		ignore := goleak.IgnoreTopFunction("github.com/nats-io/nats.go/jetstream.(*jetStream).resetPendingAcksOnReconnect")
		err := goleak.Find(ignore)
		for deadline := time.Now().Add(10 * time.Second); err != nil && time.Now().Before(deadline); {
			time.Sleep(50 * time.Millisecond) // bounded poll of a condition
			err = goleak.Find(ignore)
		}
		if err != nil {
			fmt.Fprintf(os.Stderr, "goleak: %v\n", err)
			code = 1
		}
	}
	os.Exit(code)
}

// natsServer is a NATS server with JetStream on 127.0.0.1 (a nats-server process,
// internal/natstest), stopped at cleanup; start after stop restarts it on the same
// port and store.
type natsServer struct{ *natstest.Server }

func startNATS(t testing.TB) *natsServer {
	t.Helper()
	return &natsServer{natstest.Start(t, natstest.Options{JetStream: true})}
}

func (ns *natsServer) start()      { ns.Restart() }
func (ns *natsServer) stop()       { ns.Stop() }
func (ns *natsServer) url() string { return ns.URL() }

// connect dials the server with unlimited fast reconnects; the connection is closed at
// cleanup.
func (ns *natsServer) connect(t testing.TB) *nats.Conn {
	t.Helper()
	nc, err := nats.Connect(ns.url(), nats.MaxReconnects(-1), nats.ReconnectWait(20*time.Millisecond),
		nats.ReconnectJitter(0, 0), nats.NoCallbacksAfterClientClose())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return nc
}

func testCtx(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 45*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// history returns a random event history (queries stripped), the reference model
// after it, and the distinct queries RandomOps drew for it.
type history struct {
	ops     []oplog.Op // events only
	queries [][]uint64
}

func randomHistory(seed uint64, n int) history {
	r := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	all := refmodel.RandomOps(r, n, refmodel.RandomOptions{Workers: 6})
	var h history
	for _, op := range all {
		if op.Kind == oplog.Query {
			h.queries = append(h.queries, op.Content)
		} else {
			h.ops = append(h.ops, op)
		}
	}
	return h
}

// model applies the first n events of h to a reference model.
func (h history) model(n int) *refmodel.Model {
	m := refmodel.New()
	for i := range h.ops[:n] {
		_ = m.Apply(&h.ops[i]) // rejections are part of the history
	}
	return m
}

// checkModel asks e every query of h in testModel's namespace (where PublishOps
// publishes) and compares with the model.
func checkModel(t testing.TB, e *engine.Engine, h history, m *refmodel.Model) {
	t.Helper()
	ctx := context.Background()
	if err := e.Barrier(ctx); err != nil {
		t.Fatal(err)
	}
	bad := 0
	for _, q := range h.queries {
		got, err := e.FindMatchesIn(ctx, namespace.Of(testModel, ""), q, nil)
		if err != nil {
			t.Fatal(err)
		}
		want := m.Query(q)
		ok := len(got) == len(want)
		for i := 0; ok && i < len(got); i++ {
			ok = got[i].Worker == want[i].Worker && got[i].Score == want[i].Score && got[i].Size == want[i].Size
		}
		if !ok {
			if bad++; bad <= 3 {
				t.Errorf("query %v:\n got  %+v\n want %+v", q, got, want)
			}
		}
	}
	if bad > 0 {
		t.Fatalf("%d of %d queries differ from the reference model", bad, len(h.queries))
	}
}

// streamLast returns the stream's last sequence.
func streamLast(t testing.TB, ctx context.Context, nc *nats.Conn, name string) uint64 {
	t.Helper()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	s, err := js.Stream(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return info.State.LastSeq
}

func engineBytes(t testing.TB, e *engine.Engine) []byte {
	t.Helper()
	if err := e.Barrier(context.Background()); err != nil {
		t.Fatal(err)
	}
	var b bytesBuffer
	if err := e.WriteSnapshot(&b); err != nil {
		t.Fatal(err)
	}
	return b.b
}

type bytesBuffer struct{ b []byte }

func (w *bytesBuffer) Write(p []byte) (int, error) { w.b = append(w.b, p...); return len(p), nil }

func newReplica(t testing.TB, ctx context.Context, nc *nats.Conn, cfg ReplicaConfig, snap string) *Replica {
	t.Helper()
	r := NewReplica(nc, specChain(cfg))
	t.Cleanup(func() { r.Close() })
	if err := r.Start(ctx, snap); err != nil {
		t.Fatal(err)
	}
	return r
}

// specChain makes a replica's engine use SPEC's prefix chain. The tests compare replicas
// by their snapshots' bytes, which two engines share only if they name prefixes alike:
// each engine's keyed chain has its own key (package engine's tests restore keyed
// snapshots; TestReplicasMatchModel checks a keyed replica's answers).
func specChain(cfg ReplicaConfig) ReplicaConfig {
	cfg.Engine.SpecChain = true
	return cfg
}

func newPublisher(t testing.TB, ctx context.Context, nc *nats.Conn, cfg PublisherConfig) *Publisher {
	t.Helper()
	p, err := NewPublisher(ctx, nc, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// waitApplied waits until r has applied stream sequence seq, failing the test on error.
func waitApplied(t testing.TB, ctx context.Context, r *Replica, seq uint64) {
	t.Helper()
	if err := r.WaitFor(ctx, seq); err != nil {
		t.Fatal(err)
	}
}

// memoryStream starts a NATS server, a memory stream and a publisher on it, and draws
// the random history a test will publish.
func memoryStream(t testing.TB, seed uint64, n int) (context.Context, *natsServer, *nats.Conn, history, StreamConfig, *Publisher) {
	ctx := testCtx(t)
	ns := startNATS(t)
	nc := ns.connect(t)
	sc := StreamConfig{Memory: true}
	// Under the race detector (make test) a history of more than 1,000 events is half
	// as long: the goroutines that meet in these tests (publisher, consumer, snapshot)
	// meet as often in the first half; make test-long runs the full ones (testsize).
	if n > 1000 {
		n = testsize.Pick(n, n/2)
	}
	return ctx, ns, nc, randomHistory(seed, n), sc, newPublisher(t, ctx, nc, PublisherConfig{Stream: sc})
}
