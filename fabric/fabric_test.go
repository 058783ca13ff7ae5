package fabric

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/kvindex/kvindex/engine"
	"github.com/kvindex/kvindex/internal/namespace"
	"github.com/kvindex/kvindex/internal/replay"
	"github.com/kvindex/kvindex/internal/testsize"
	"github.com/nats-io/nats.go/jetstream"
)

const testModel = "org/model 7B"

// TestReplicasMatchModel: a relay publishes a random history, two replicas (one of
// them restricted to the model's subjects) consume it and answer every query as the
// reference model does, with byte-identical snapshots; a third, whose engine keeps its
// own keyed prefix chain, answers alike.
func TestReplicasMatchModel(t *testing.T) {
	ctx, ns, nc, h, sc, p := memoryStream(t, 1, 3000)
	a := newReplica(t, ctx, ns.connect(t), ReplicaConfig{Stream: sc}, "")
	b := newReplica(t, ctx, ns.connect(t), ReplicaConfig{Stream: sc, Models: []string{testModel}}, "")
	keyed := NewReplica(ns.connect(t), ReplicaConfig{Stream: sc})
	t.Cleanup(func() { keyed.Close() })
	if err := keyed.Start(ctx, ""); err != nil {
		t.Fatal(err)
	}
	n, err := PublishOps(ctx, p, testModel, h.ops)
	if err != nil {
		t.Fatal(err)
	}
	last := streamLast(t, ctx, nc, DefaultStream)
	if last != uint64(n) {
		t.Fatalf("stream holds %d messages, published %d", last, n)
	}
	m := h.model(len(h.ops))
	for _, r := range []*Replica{a, b, keyed} {
		waitApplied(t, ctx, r, last)
		checkModel(t, r.Engine(), h, m)
		if st := r.Stats(); st.Applied != uint64(n) || st.Duplicates != 0 || st.Malformed != 0 || st.Gaps != 0 {
			t.Fatalf("stats %+v, want %d applied", st, n)
		}
	}
	if !bytes.Equal(engineBytes(t, a.Engine()), engineBytes(t, b.Engine())) {
		t.Fatal("replicas' snapshots differ")
	}
	// A replica of another model applies that model's events and none of the rest.
	c := newReplica(t, ctx, ns.connect(t), ReplicaConfig{Stream: sc, Models: []string{"other"}}, "")
	other := engine.Event{Kind: engine.EventStored, Worker: "elsewhere", Namespace: namespace.Of("other", ""), Blocks: []engine.Block{{Content: 1, Seq: 1}}}
	if err := p.Publish(ctx, "other", &other, 1); err != nil {
		t.Fatal(err)
	}
	waitApplied(t, ctx, c, streamLast(t, ctx, nc, DefaultStream))
	if st, est := c.Stats(), c.Engine().Stats(); st.Applied != 1 || est.Workers != 1 || est.Blocks != 1 {
		t.Fatalf("replica of another model: applied %d, %d workers, %d blocks; want 1, 1, 1", st.Applied, est.Workers, est.Blocks)
	}
}

// TestRestartFromSnapshot: a replica stopped mid-stream and restarted from its
// snapshot equals a replica that never stopped, and re-applies nothing.
func TestRestartFromSnapshot(t *testing.T) {
	t.Run("file", func(t *testing.T) { restartFromSnapshot(t, filepath.Join(t.TempDir(), "replica.snap")) })
	t.Run("object-store", func(t *testing.T) { restartFromSnapshot(t, ObjectScheme+"kvindex-snapshots/llama") })
}

func restartFromSnapshot(t *testing.T, snap string) {
	ctx, ns, nc, h, sc, p := memoryStream(t, 2, 3000)
	steady := newReplica(t, ctx, ns.connect(t), ReplicaConfig{Stream: sc}, "")

	half := len(h.ops) / 2
	if _, err := PublishOps(ctx, p, testModel, h.ops[:half]); err != nil {
		t.Fatal(err)
	}
	mid := streamLast(t, ctx, nc, DefaultStream)
	r1 := NewReplica(ns.connect(t), specChain(ReplicaConfig{Stream: sc}))
	if err := r1.Start(ctx, snap); err != nil { // no file yet: full replay
		t.Fatal(err)
	}
	waitApplied(t, ctx, r1, mid)
	if err := r1.Snapshot(snap); err != nil {
		t.Fatal(err)
	}
	r1.Close()

	// The rest of the history, published by the same relay (numbering continues).
	if _, err := PublishOps(ctx, p, testModel, h.ops); err != nil {
		t.Fatal(err)
	}
	if st := p.Stats(); st.Skipped != uint64(half) {
		t.Fatalf("publisher skipped %d, want %d", st.Skipped, half)
	}
	last := streamLast(t, ctx, nc, DefaultStream)
	// A snapshot larger than MaxSnapshotBytes is refused (read no further than the
	// bound), and the replica replays the stream instead.
	small := newReplica(t, ctx, ns.connect(t), ReplicaConfig{Stream: sc, MaxSnapshotBytes: 64}, snap)
	if st := small.Stats(); st.Restored || !errors.Is(st.SnapshotErr, ErrSnapshot) {
		t.Fatalf("oversized snapshot: %+v, want refused", st)
	}
	waitApplied(t, ctx, small, last)
	checkModel(t, small.Engine(), h, h.model(len(h.ops)))
	r2 := newReplica(t, ctx, ns.connect(t), ReplicaConfig{Stream: sc}, snap)
	// r2 consumes the stream as soon as it has started: where it restored is its
	// position less what it has applied since (every message past mid applies, as the
	// count below checks), one reading under its lock.
	st := r2.Stats()
	if !st.Restored || st.SnapshotErr != nil || st.LastApplied-st.Applied != mid {
		t.Fatalf("restart: %+v, want restored at %d", st, mid)
	}
	for _, r := range []*Replica{steady, r2} {
		waitApplied(t, ctx, r, last)
	}
	if st := r2.Stats(); st.Applied != last-mid || st.Duplicates != 0 {
		t.Fatalf("restarted replica applied %d (dups %d), want %d", st.Applied, st.Duplicates, last-mid)
	}
	if !bytes.Equal(engineBytes(t, steady.Engine()), engineBytes(t, r2.Engine())) {
		t.Fatal("restarted replica differs from the steady one")
	}
	checkModel(t, r2.Engine(), h, h.model(len(h.ops)))
}

// TestObjectSnapshotRefused: a damaged snapshot object is refused and the replica
// replays the stream; a malformed location is an error.
func TestObjectSnapshotRefused(t *testing.T) {
	ctx, ns, nc, h, sc, p := memoryStream(t, 4, 800)
	if _, err := PublishOps(ctx, p, testModel, h.ops); err != nil {
		t.Fatal(err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	if err := putObject(js, "snaps", "bad", []byte("not a snapshot")); err != nil {
		t.Fatal(err)
	}
	r := newReplica(t, ctx, ns.connect(t), ReplicaConfig{Stream: sc}, ObjectScheme+"snaps/bad")
	if st := r.Stats(); st.Restored || !errors.Is(st.SnapshotErr, ErrSnapshot) {
		t.Fatalf("damaged object: %+v", st)
	}
	waitApplied(t, ctx, r, streamLast(t, ctx, nc, DefaultStream))
	checkModel(t, r.Engine(), h, h.model(len(h.ops)))
	if err := NewReplica(nc, ReplicaConfig{Stream: sc}).Start(ctx, ObjectScheme+"no-name"); err == nil {
		t.Fatal("a location without an object name was accepted")
	}
}

// TestRelayRestartNoDuplicates: a relay restarted from the start of its input adds
// nothing to the stream, whether it asks the stream where each worker stands (resume)
// or relies on the deduplication window alone.
func TestRelayRestartNoDuplicates(t *testing.T) {
	ctx := testCtx(t)
	ns := startNATS(t)
	h := randomHistory(3, 2000)
	sc := StreamConfig{Memory: true}
	part := len(h.ops) * 3 / 5
	p1 := newPublisher(t, ctx, ns.connect(t), PublisherConfig{Stream: sc})
	if _, err := PublishOps(ctx, p1, testModel, h.ops[:part]); err != nil {
		t.Fatal(err)
	}
	// "Crash" mid-stream: a new relay on a new connection starts from the beginning.
	p2 := newPublisher(t, ctx, ns.connect(t), PublisherConfig{Stream: sc})
	if _, err := PublishOps(ctx, p2, testModel, h.ops); err != nil {
		t.Fatal(err)
	}
	if st := p2.Stats(); st.Skipped != uint64(part) || st.Published != uint64(len(h.ops)-part) {
		t.Fatalf("resuming relay: %+v", st)
	}
	// A relay without the resume check re-sends everything; the window drops it all.
	p3 := newPublisher(t, ctx, ns.connect(t), PublisherConfig{Stream: sc, NoResume: true})
	if _, err := PublishOps(ctx, p3, testModel, h.ops); err != nil {
		t.Fatal(err)
	}
	if st := p3.Stats(); st.Duplicates != uint64(len(h.ops)) || st.Published != 0 {
		t.Fatalf("non-resuming relay: %+v", st)
	}
	nc := ns.connect(t)
	last := streamLast(t, ctx, nc, DefaultStream)
	if last != uint64(len(h.ops)) {
		t.Fatalf("stream holds %d messages for %d events", last, len(h.ops))
	}
	r := newReplica(t, ctx, nc, ReplicaConfig{Stream: sc}, "")
	waitApplied(t, ctx, r, last)
	checkModel(t, r.Engine(), h, h.model(len(h.ops)))
}

// TestReplicaSkipsDuplicates: messages the window let through twice (re-sent after
// it expired) are applied once.
func TestReplicaSkipsDuplicates(t *testing.T) {
	ctx, _, nc, h, sc, p := memoryStream(t, 4, 1000)
	if _, err := PublishOps(ctx, p, testModel, h.ops); err != nil {
		t.Fatal(err)
	}
	// Re-send the history with no message ids (as if the window had expired).
	js, _ := jetstream.New(nc)
	seqs := map[string]uint64{}
	var buf []byte
	for i := range h.ops {
		ev := replay.ModelEvent(&h.ops[i], testModel)
		seqs[ev.Worker]++
		buf = AppendMessage(buf[:0], &Message{WorkerSeq: seqs[ev.Worker], Event: ev})
		if _, err := js.Publish(ctx, Subject(DefaultSubjectPrefix, testModel, ev.Worker), buf); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := js.Publish(ctx, Subject(DefaultSubjectPrefix, testModel, "junk"), []byte("junk")); err != nil {
		t.Fatal(err)
	}
	last := streamLast(t, ctx, nc, DefaultStream)
	r := newReplica(t, ctx, nc, ReplicaConfig{Stream: sc}, "")
	waitApplied(t, ctx, r, last)
	if st := r.Stats(); st.Duplicates != uint64(len(h.ops)) || st.Malformed != 1 {
		t.Fatalf("stats %+v, want %d duplicates and 1 malformed", st, len(h.ops))
	}
	checkModel(t, r.Engine(), h, h.model(len(h.ops)))
}

// TestBadSnapshotFallsBack: a truncated, corrupted or foreign snapshot is refused with
// a clear error and the replica replays the stream in full.
func TestBadSnapshotFallsBack(t *testing.T) {
	ctx, _, nc, h, sc, p := memoryStream(t, 5, 1500)
	if _, err := PublishOps(ctx, p, testModel, h.ops); err != nil {
		t.Fatal(err)
	}
	last := streamLast(t, ctx, nc, DefaultStream)
	dir := t.TempDir()
	good := filepath.Join(dir, "good.snap")
	r := newReplica(t, ctx, nc, ReplicaConfig{Stream: sc}, "")
	waitApplied(t, ctx, r, last)
	if err := r.Snapshot(good); err != nil {
		t.Fatal(err)
	}
	want := engineBytes(t, r.Engine())
	data, err := os.ReadFile(good)
	if err != nil {
		t.Fatal(err)
	}
	flipped := bytes.Clone(data)
	flipped[len(flipped)/2] ^= 0x40
	cases := map[string][]byte{
		"truncated": data[:len(data)-7],
		"corrupted": flipped,
		"empty":     {},
		"garbage":   []byte("not a snapshot at all"),
	}
	m := h.model(len(h.ops))
	for name, b := range cases {
		path := filepath.Join(dir, name+".snap")
		if err := os.WriteFile(path, b, 0o644); err != nil {
			t.Fatal(err)
		}
		rr := newReplica(t, ctx, nc, ReplicaConfig{Stream: sc}, path)
		st := rr.Stats()
		if st.Restored || !errors.Is(st.SnapshotErr, ErrSnapshot) {
			t.Fatalf("%s: restored %v, err %v", name, st.Restored, st.SnapshotErr)
		}
		t.Logf("%s: %v", name, st.SnapshotErr)
		waitApplied(t, ctx, rr, last)
		if !bytes.Equal(engineBytes(t, rr.Engine()), want) {
			t.Fatalf("%s: full replay differs", name)
		}
		checkModel(t, rr.Engine(), h, m)
		rr.Close()
	}
	// Every single-byte corruption and every truncation is refused (no panic).
	for i := range data {
		b := bytes.Clone(data)
		b[i] ^= 1
		if s, err := decodeSnapshot(b, r.cfg.Engine); !errors.Is(err, ErrSnapshot) {
			if err == nil {
				s.eng.Close()
			}
			t.Fatalf("flip at %d accepted (err %v)", i, err)
		}
		if s, err := decodeSnapshot(data[:i], r.cfg.Engine); !errors.Is(err, ErrSnapshot) {
			if err == nil {
				s.eng.Close()
			}
			t.Fatalf("truncation at %d accepted (err %v)", i, err)
		}
	}
	// A snapshot of another stream (same name, re-created) is refused.
	js, _ := jetstream.New(nc)
	if err := js.DeleteStream(ctx, DefaultStream); err != nil {
		t.Fatal(err)
	}
	p2 := newPublisher(t, ctx, nc, PublisherConfig{Stream: sc})
	if _, err := PublishOps(ctx, p2, testModel, h.ops[:100]); err != nil {
		t.Fatal(err)
	}
	rr := newReplica(t, ctx, nc, ReplicaConfig{Stream: sc}, good)
	if st := rr.Stats(); st.Restored || !errors.Is(st.SnapshotErr, ErrSnapshot) {
		t.Fatalf("foreign stream: %+v", st)
	}
	waitApplied(t, ctx, rr, 100)
	checkModel(t, rr.Engine(), h, h.model(100))
}

// TestFaults: with file storage, the NATS server is shut down and restarted, a relay
// crashes and restarts from its input's beginning, and a replica is killed and restarted
// from a snapshot, all mid-stream; afterwards every replica answers the reference
// model's queries exactly, and nothing was lost or applied twice.
func TestFaults(t *testing.T) {
	ctx := testCtx(t)
	ns := startNATS(t)
	h := randomHistory(6, testsize.Pick(4000, 2000)) // make test-long: 4,000
	sc := StreamConfig{}                             // file storage
	snap := filepath.Join(t.TempDir(), "b.snap")

	relay := func(ctx context.Context, ops int) (*Publisher, error) {
		nc := ns.connect(t)
		p, err := NewPublisher(ctx, nc, PublisherConfig{Stream: sc})
		if err != nil {
			return nil, err
		}
		_, err = PublishOps(ctx, p, testModel, h.ops[:ops])
		nc.Close()
		return p, err
	}
	// Relay 1 publishes the first third and crashes.
	if _, err := relay(ctx, len(h.ops)/3); err != nil {
		t.Fatal(err)
	}
	a := newReplica(t, ctx, ns.connect(t), ReplicaConfig{Stream: sc}, "")
	b := NewReplica(ns.connect(t), specChain(ReplicaConfig{Stream: sc}))
	if err := b.Start(ctx, snap); err != nil {
		t.Fatal(err)
	}

	// Relay 2 starts over from the beginning of its input and runs to the end. At 40% of
	// it the server goes down (the relay keeps retrying) and comes back; at 70% replica b
	// writes a snapshot, is killed, and restarts from the snapshot while the relay goes on.
	at40, down, at70, resume := make(chan struct{}), make(chan struct{}), make(chan struct{}), make(chan struct{})
	closeDown, closeResume := sync.OnceFunc(func() { close(down) }), sync.OnceFunc(func() { close(resume) })
	rctx, rcancel := context.WithCancel(ctx)
	finished := make(chan struct{})
	var p2 *Publisher
	var relayErr error
	var relayReconnects uint64
	rnc := ns.connect(t) // dialled here: the goroutine must not call t.Fatal
	go func() {
		defer close(finished)
		defer func() { relayReconnects = rnc.Stats().Reconnects; rnc.Close() }()
		p2, relayErr = NewPublisher(rctx, rnc, PublisherConfig{Stream: sc})
		if relayErr != nil {
			return
		}
		seqs := map[string]uint64{}
		for i := range h.ops {
			switch i {
			case len(h.ops) * 4 / 10:
				close(at40)
				<-down
			case len(h.ops) * 7 / 10:
				close(at70)
				<-resume
			}
			ev := replay.ModelEvent(&h.ops[i], testModel)
			seqs[ev.Worker]++
			if relayErr = p2.Publish(rctx, testModel, &ev, seqs[ev.Worker]); relayErr != nil {
				return
			}
		}
	}()
	// Whatever fails below, the relay goroutine is let go and waited for.
	t.Cleanup(func() { rcancel(); closeDown(); closeResume(); <-finished })
	reach := func(ch chan struct{}, what string) {
		t.Helper()
		select {
		case <-ch:
		case <-finished:
			t.Fatalf("relay 2 ended before %s: %v", what, relayErr)
		}
	}
	reach(at40, "40%")
	ns.stop()
	closeDown()
	ns.start()

	reach(at70, "70%")
	if err := b.WaitFor(ctx, uint64(len(h.ops)*6/10)); err != nil {
		t.Fatal(err)
	}
	if err := b.Snapshot(snap); err != nil {
		t.Fatal(err)
	}
	b.Close()
	closeResume()
	b = newReplica(t, ctx, ns.connect(t), ReplicaConfig{Stream: sc}, snap)
	if st := b.Stats(); !st.Restored {
		t.Fatalf("b not restored: %v", st.SnapshotErr)
	}

	<-finished
	if relayErr != nil {
		t.Fatal(relayErr)
	}
	t.Logf("relay 2: %+v", p2.Stats())
	if relayReconnects == 0 {
		t.Fatal("the relay never saw the server down")
	}
	nc := ns.connect(t)
	last := streamLast(t, ctx, nc, DefaultStream)
	if last != uint64(len(h.ops)) {
		t.Fatalf("stream holds %d messages for %d events", last, len(h.ops))
	}
	m := h.model(len(h.ops))
	for _, r := range []*Replica{a, b} {
		waitApplied(t, ctx, r, last)
		if st := r.Stats(); st.Duplicates != 0 || st.Gaps != 0 || st.Malformed != 0 {
			t.Fatalf("stats %+v", st)
		}
		checkModel(t, r.Engine(), h, m)
	}
	if !bytes.Equal(engineBytes(t, a.Engine()), engineBytes(t, b.Engine())) {
		t.Fatal("replicas differ")
	}
}
