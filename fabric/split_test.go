package fabric

import (
	"context"
	"errors"
	"log/slog"
	"math"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/kvindex/kvindex/engine"
	"github.com/kvindex/kvindex/internal/namespace"
	"github.com/kvindex/kvindex/internal/oplog"
	"github.com/kvindex/kvindex/internal/refmodel"
)

// TestSplitLargeEvents: events larger than a message may be (here 4 KiB) travel in
// parts: a 3,000-block store (48 KB) and a 5,000-seq removal among a random history;
// replicas apply the parts as the whole events (the reference model's answers), and a
// relay restarted inside a split event sends it again without applying any part twice.
// Before, such an event failed with "maximum payload exceeded" and ended the relay.
func TestSplitLargeEvents(t *testing.T) {
	ctx, ns, nc, h, sc, _ := memoryStream(t, 31, 1200)
	p := newPublisher(t, ctx, nc, PublisherConfig{Stream: sc, MaxMessageBytes: 4 << 10})
	big := oplog.Op{Kind: oplog.Stored, Worker: "w-big"}
	var seqs []uint64
	for i := range uint64(3000) {
		big.Blocks = append(big.Blocks, [2]uint64{i%3 + 1, 1<<40 + i})
		seqs = append(seqs, 1<<40+i)
	}
	removeMost := oplog.Op{Kind: oplog.Removed, Worker: "w-big", Seqs: seqs[1000:]}
	h.ops = append(append(h.ops[:len(h.ops)/2:len(h.ops)/2], big, removeMost), h.ops[len(h.ops)/2:]...)
	h.queries = append(h.queries, []uint64{1, 2, 3, 1, 2, 3}, []uint64{1, 2, 3, 1, 2})
	n, err := PublishOps(ctx, p, testModel, h.ops)
	if err != nil {
		t.Fatal(err)
	}
	st := p.Stats()
	if n != len(h.ops) || st.Split != 2 || st.Refused != 0 || st.Published < uint64(n)+10 {
		t.Fatalf("published %d events: %+v", n, st)
	}
	r := newReplica(t, ctx, ns.connect(t), ReplicaConfig{Stream: sc}, "")
	waitApplied(t, ctx, r, streamLast(t, ctx, nc, DefaultStream))
	checkModel(t, r.Engine(), h, h.model(len(h.ops)))
	rejected := 0
	for m, i := refmodel.New(), 0; i < len(h.ops); i++ {
		if m.Apply(&h.ops[i]) != nil {
			rejected++
		}
	}
	if rs := r.Stats(); rs.Gaps != 0 || rs.Duplicates != 0 || rs.Rejected != uint64(rejected) {
		t.Fatalf("replica %+v (the history's own rejections: %d)", rs, rejected)
	}

	// A relay that stopped after two of a split event's parts: a new one sends the
	// event again (the stream's dedup window drops the parts it holds), and a replica
	// skips parts it applied (their ids were outside the window: sent without ids).
	js, _ := jetstream.New(nc)
	ev := engine.Event{Kind: engine.EventStored, Worker: "w-crash", Namespace: namespace.Of(testModel, "")}
	for i := range uint64(600) {
		ev.Blocks = append(ev.Blocks, engine.Block{Content: i%3 + 1, Seq: 1<<41 + i})
	}
	parts, err := splitMessage(&Message{WorkerSeq: 1, Event: ev}, 4<<10-1024)
	if err != nil || len(parts) < 3 {
		t.Fatalf("split into %d parts: %v", len(parts), err)
	}
	for _, pm := range parts[:2] {
		if _, err := js.Publish(ctx, Subject(DefaultSubjectPrefix, testModel, "w-crash"), AppendMessage(nil, &pm)); err != nil {
			t.Fatal(err)
		}
	}
	p2 := newPublisher(t, ctx, ns.connect(t), PublisherConfig{Stream: sc, MaxMessageBytes: 4 << 10})
	if err := p2.Publish(ctx, testModel, &ev, 1); err != nil {
		t.Fatal(err)
	}
	waitApplied(t, ctx, r, streamLast(t, ctx, nc, DefaultStream))
	if size, ok := r.Engine().WorkerSize("w-crash"); !ok || size != 600 {
		t.Fatalf("re-sent split event: w-crash holds %d blocks, want 600", size)
	}
	if rs := r.Stats(); rs.Duplicates < 1 || rs.Gaps != 0 || rs.Rejected != uint64(rejected) {
		t.Fatalf("replica after the re-sent event: %+v", rs)
	}
}

// TestPublishRefusesOversized: an event that cannot fit even split (its worker name
// alone is larger than a message may be) is refused with ErrTooLarge and counted, and
// PublishOps goes on with the next events.
func TestPublishRefusesOversized(t *testing.T) {
	ctx, _, nc, _, sc, _ := memoryStream(t, 32, 10)
	p := newPublisher(t, ctx, nc, PublisherConfig{Stream: sc, MaxMessageBytes: 4 << 10})
	long := strings.Repeat("w", 3<<10)
	ops := []oplog.Op{
		{Kind: oplog.Stored, Worker: long, Blocks: [][2]uint64{{1, 1}}},
		{Kind: oplog.Stored, Worker: "ok", Blocks: [][2]uint64{{1, 1}}},
	}
	ev := engine.Event{Kind: engine.EventStored, Worker: long, Namespace: namespace.Of(testModel, ""), Blocks: []engine.Block{{Content: 1, Seq: 1}}}
	if err := p.Publish(ctx, testModel, &ev, 1); !errors.Is(err, ErrTooLarge) || !Refusal(err) {
		t.Fatalf("err %v, want ErrTooLarge", err)
	}
	if _, err := PublishOps(ctx, p, testModel, ops); err != nil {
		t.Fatal(err)
	}
	// Through the adapter a ZeroMQ subscriber feeds, the refusal is a rejection of the
	// event: the subscriber counts it and goes on (before, it ended the relay).
	if err := p.Index(ctx, testModel).Apply(&ev); !engine.IsRejection(err) {
		t.Fatalf("adapter: err %v, want a rejection", err)
	}
	if st := p.Stats(); st.Refused != 3 || st.Published != 1 {
		t.Fatalf("stats %+v", st)
	}
}

// TestReplicaBoundsWorkerSeq: a message claiming a worker sequence far past the
// worker's last (2^64-1 silenced the worker on every replica for good: every later
// event was a duplicate) is skipped and counted, and so is a worker's first message
// claiming more than its stream sequence; the worker's next events apply.
func TestReplicaBoundsWorkerSeq(t *testing.T) {
	ctx, _, nc, _, sc, p := memoryStream(t, 33, 10)
	js, _ := jetstream.New(nc)
	raw := func(worker string, ws, content uint64) {
		t.Helper()
		m := Message{WorkerSeq: ws, Event: engine.Event{Kind: engine.EventStored, Worker: worker,
			Namespace: namespace.Of(testModel, ""), Blocks: []engine.Block{{Content: content, Seq: content}}}}
		if _, err := js.Publish(ctx, Subject(DefaultSubjectPrefix, testModel, worker), AppendMessage(nil, &m)); err != nil {
			t.Fatal(err)
		}
	}
	raw("w", 1, 1)
	raw("w", math.MaxUint64, 2) // poison
	raw("v", 1000, 3)           // a first message past its stream sequence (3)
	raw("w", 2, 4)
	raw("v", 1, 5)
	r := newReplica(t, ctx, nc, ReplicaConfig{Stream: sc, MaxSeqGap: 100}, "")
	waitApplied(t, ctx, r, streamLast(t, ctx, nc, DefaultStream))
	if st := r.Stats(); st.SeqRefused != 2 || st.Applied != 3 || st.Duplicates != 0 {
		t.Fatalf("stats %+v", st)
	}
	// The publisher's own numbering goes on from the stream's last message of the
	// worker, the poisoned one, which the replicas skipped: it is a gap, not silence.
	ev := engine.Event{Kind: engine.EventStored, Worker: "x", Namespace: namespace.Of(testModel, ""), Blocks: []engine.Block{{Content: 9, Seq: 9}}}
	if err := p.Publish(ctx, testModel, &ev, 1); err != nil {
		t.Fatal(err)
	}
	waitApplied(t, ctx, r, streamLast(t, ctx, nc, DefaultStream))
	if est := r.Engine().Stats(); est.Workers != 3 || est.Blocks != 4 {
		t.Fatalf("engine %+v", est)
	}
}

// TestReplicaMaxWorkers: a replica follows at most MaxWorkers workers; a removed
// worker's place goes to a new one.
func TestReplicaMaxWorkers(t *testing.T) {
	ctx, _, nc, _, sc, p := memoryStream(t, 34, 10)
	pub := func(kind engine.EventKind, w string, seq uint64) {
		t.Helper()
		ev := engine.Event{Kind: kind, Worker: w}
		if kind == engine.EventStored {
			ev.Namespace, ev.Blocks = namespace.Of(testModel, ""), []engine.Block{{Content: 1, Seq: 1}}
		}
		if err := p.Publish(ctx, testModel, &ev, seq); err != nil {
			t.Fatal(err)
		}
	}
	for _, w := range []string{"a", "b", "c", "d"} {
		pub(engine.EventStored, w, 1)
	}
	pub(engine.EventRemoveWorker, "a", 2)
	pub(engine.EventStored, "e", 1)
	r := newReplica(t, ctx, nc, ReplicaConfig{Stream: sc, MaxWorkers: 3}, "")
	waitApplied(t, ctx, r, streamLast(t, ctx, nc, DefaultStream))
	if st := r.Stats(); st.TooManyWorkers != 1 {
		t.Fatalf("stats %+v", st)
	}
	if est := r.Engine().Stats(); est.Workers != 3 {
		t.Fatalf("%d workers, want b, c, e", est.Workers)
	}
}

// TestReplicaRefusesSeqHops (issue 33, row 10): NATS messages stepping a worker's
// sequence by 2^20 each, each within MaxSeqGap, were accepted hop by hop and silenced
// the worker for good (its relay's next events were duplicates). A worker's sequence
// now moves at most as far as the stream's own did since its last message: the hops
// are refused and counted, and the worker's next event applies.
func TestReplicaRefusesSeqHops(t *testing.T) {
	ctx, _, nc, _, sc, _ := memoryStream(t, 35, 10)
	js, _ := jetstream.New(nc)
	raw := func(ws, content uint64, worker ...string) {
		t.Helper()
		w := "w"
		if len(worker) > 0 {
			w = worker[0]
		}
		m := Message{WorkerSeq: ws, Event: engine.Event{Kind: engine.EventStored, Worker: w,
			Namespace: namespace.Of(testModel, ""), Blocks: []engine.Block{{Content: content, Seq: content}}}}
		if _, err := js.Publish(ctx, Subject(DefaultSubjectPrefix, testModel, w), AppendMessage(nil, &m)); err != nil {
			t.Fatal(err)
		}
	}
	raw(1, 1)
	for i := uint64(1); i <= 21; i++ {
		raw(1+i<<20, 100+i) // each hop within the default MaxSeqGap
	}
	raw(2, 2)
	raw(1, 50, "v") // another worker's message
	raw(4, 3)       // one event lost between: the stream moved two messages since the last
	raw(9, 4)       // five past in one message: refused
	r := newReplica(t, ctx, nc, ReplicaConfig{Stream: sc}, "")
	waitApplied(t, ctx, r, streamLast(t, ctx, nc, DefaultStream))
	if st := r.Stats(); st.SeqRefused != 22 || st.Applied != 4 || st.Duplicates != 0 || st.Gaps != 1 {
		t.Fatalf("stats %+v", st)
	}
	if est := r.Engine().Stats(); est.Blocks != 4 {
		t.Fatalf("engine %+v, want w's 3 blocks and v's", est)
	}
}

// waitingLog signals when a replica logs that it waits for its stream.
type waitingLog struct {
	slog.Handler
	waiting chan struct{}
	once    *sync.Once
}

func (waitingLog) Enabled(context.Context, slog.Level) bool { return true }

func (h waitingLog) Handle(_ context.Context, r slog.Record) error {
	if strings.HasPrefix(r.Message, "waiting for the stream") {
		h.once.Do(func() { close(h.waiting) })
	}
	return nil
}

// TestReplicaWaitsForStream (issue 33, low items): a replica started before its
// stream existed failed its start (serve --nats exited 1). It now waits until the
// stream exists, then follows it from its start; a context that ends first is the
// error.
func TestReplicaWaitsForStream(t *testing.T) {
	ctx := testCtx(t)
	ns := startNATS(t)
	nc := ns.connect(t)
	log := waitingLog{Handler: slog.DiscardHandler, waiting: make(chan struct{}), once: &sync.Once{}}
	sc := StreamConfig{Memory: true}
	r := NewReplica(nc, specChain(ReplicaConfig{Stream: sc, Logger: slog.New(log)}))
	t.Cleanup(func() { r.Close() })
	started := make(chan error, 1)
	go func() { started <- r.Start(ctx, "") }()
	select {
	case <-log.waiting:
	case err := <-started:
		t.Fatalf("started before the stream existed: %v", err)
	}
	p := newPublisher(t, ctx, nc, PublisherConfig{Stream: sc}) // creates the stream
	ev := engine.Event{Kind: engine.EventStored, Worker: "w", Namespace: namespace.Of(testModel, ""), Blocks: []engine.Block{{Content: 1, Seq: 1}}}
	if err := p.Publish(ctx, testModel, &ev, 1); err != nil {
		t.Fatal(err)
	}
	if err := <-started; err != nil {
		t.Fatal(err)
	}
	waitApplied(t, ctx, r, streamLast(t, ctx, nc, DefaultStream))
	if st := r.Engine().Stats(); st.Blocks != 1 {
		t.Fatalf("engine %+v", st)
	}
	short, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancel()
	other := NewReplica(nc, ReplicaConfig{Stream: StreamConfig{Name: "NONE", Memory: true}})
	defer other.Close()
	if err := other.Start(short, ""); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("a stream that never comes: %v", err)
	}
}
