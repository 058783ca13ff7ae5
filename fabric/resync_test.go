package fabric

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/kvindex/kvindex/engine"
	"github.com/kvindex/kvindex/internal/namespace"
)

// TestReplicaResync: two replicas of one stream (one on SPEC's chain, one on its own
// keyed chain) agree on every worker's digest; a block applied to one replica behind
// the stream's back makes exactly that worker differ (engine.DiffDigests), and Resync
// of the worker, run while the relay is still publishing, rebuilds it from the stream:
// the digests agree again, and the resynced replica answers every query as the
// reference model does (nothing lost, nothing applied twice).
func TestReplicaResync(t *testing.T) {
	ctx, ns, nc, h, sc, p := memoryStream(t, 11, 3000)
	a := newReplica(t, ctx, ns.connect(t), ReplicaConfig{Stream: sc}, "")
	b := NewReplica(ns.connect(t), ReplicaConfig{Stream: sc, Models: []string{testModel}})
	t.Cleanup(func() { b.Close() })
	if err := b.Start(ctx, ""); err != nil {
		t.Fatal(err)
	}
	stray := func(worker string) {
		t.Helper()
		ev := engine.Event{Kind: engine.EventStored, Worker: worker, Namespace: namespace.Of(testModel, ""), Blocks: []engine.Block{{Content: 12345, Seq: 1 << 60}}}
		if err := b.Engine().Apply(&ev); err != nil {
			t.Fatal(err)
		}
	}
	published := make(chan error, 1)
	go func() {
		_, err := PublishOps(ctx, p, testModel, h.ops)
		published <- err
	}()
	waitApplied(t, ctx, b, uint64(len(h.ops)/3))
	ws := b.Workers()
	if len(ws) == 0 {
		t.Fatal("no worker after a third of the stream")
	}
	victim := ws[0].Worker
	stray(victim)
	res, err := b.Resync(ctx, victim) // the relay is still publishing
	if err != nil {
		t.Fatal(err)
	}
	if !res.Complete || res.Messages == 0 {
		t.Fatalf("resync %+v, want a complete replay of some messages", res)
	}
	if err := <-published; err != nil {
		t.Fatal(err)
	}
	last := streamLast(t, ctx, nc, DefaultStream)
	waitApplied(t, ctx, a, last)
	waitApplied(t, ctx, b, last)
	if diff := engine.DiffDigests(a.Engine().Digests(), b.Engine().Digests()); len(diff) != 0 {
		t.Fatalf("after the resync, workers %q differ", diff)
	}
	m := h.model(len(h.ops))
	checkModel(t, b.Engine(), h, m)

	// At rest: the stray block is the one difference, and the resync its cure.
	names := m.Workers()
	second := names[len(names)-1]
	stray(second)
	if diff := engine.DiffDigests(a.Engine().Digests(), b.Engine().Digests()); !slices.Equal(diff, []string{second}) {
		t.Fatalf("workers %q differ, want [%s]", diff, second)
	}
	if _, err := b.Resync(ctx, second); err != nil {
		t.Fatal(err)
	}
	if diff := engine.DiffDigests(a.Engine().Digests(), b.Engine().Digests()); len(diff) != 0 {
		t.Fatalf("after the second resync, workers %q differ", diff)
	}
	checkModel(t, b.Engine(), h, m)
}

// TestReplicaResyncRefusesTrimmedStream: on a stream whose retention dropped its first
// messages, Resync refuses (ErrStreamTrimmed) and leaves the worker as it was.
func TestReplicaResyncRefusesTrimmedStream(t *testing.T) {
	ctx := testCtx(t)
	ns := startNATS(t)
	nc := ns.connect(t)
	sc := StreamConfig{Memory: true, MaxBytes: 16 << 10}
	p := newPublisher(t, ctx, nc, PublisherConfig{Stream: sc})
	h := randomHistory(5, 600)
	if _, err := PublishOps(ctx, p, testModel, h.ops); err != nil {
		t.Fatal(err)
	}
	r := newReplica(t, ctx, ns.connect(t), ReplicaConfig{Stream: sc}, "")
	waitApplied(t, ctx, r, streamLast(t, ctx, nc, DefaultStream))
	ws := r.Workers()
	if len(ws) == 0 {
		t.Fatal("no worker in the stream's tail")
	}
	before := r.Engine().Digests()
	_, err := r.Resync(ctx, ws[0].Worker)
	if !errors.Is(err, ErrStreamTrimmed) || !errors.Is(err, ErrResync) {
		t.Fatalf("resync of a trimmed stream: %v, want ErrStreamTrimmed", err)
	}
	if diff := engine.DiffDigests(before, r.Engine().Digests()); len(diff) != 0 {
		t.Fatalf("a refused resync changed %q", diff)
	}
}

// TestResyncKeepsApplying (issue 33, row 12): Resync held the replica's lock for the
// whole replay, so four clients resyncing for 20 s made the replica lag 14.6 s behind
// the stream and 16% of matches found the worker empty. Now the lock is held one
// message at a time: while a worker of about 500 messages (two batches) is replayed, an event of
// another worker published mid-replay is applied before the replay ends, a second
// Resync of the same worker is refused, and the resynced replica still answers every
// query as the reference model does.
func TestResyncKeepsApplying(t *testing.T) {
	ctx, ns, nc, h, sc, p := memoryStream(t, 12, 6000)
	r := newReplica(t, ctx, ns.connect(t), ReplicaConfig{Stream: sc}, "")
	if _, err := PublishOps(ctx, p, testModel, h.ops); err != nil {
		t.Fatal(err)
	}
	waitApplied(t, ctx, r, streamLast(t, ctx, nc, DefaultStream))
	// The victim: the worker with the most events (more than one batch of 256).
	count := map[string]int{}
	victim := ""
	for _, op := range h.ops {
		if count[op.Worker]++; count[op.Worker] > count[victim] {
			victim = op.Worker
		}
	}
	hooked := 0
	var during error
	r.resyncHook = func() {
		if hooked++; hooked > 1 {
			return
		}
		if _, err := r.Resync(ctx, victim); err == nil || !errors.Is(err, ErrResync) {
			t.Errorf("a second resync of %s during the first: %v, want refused", victim, err)
		}
		ev := engine.Event{Kind: engine.EventStored, Worker: "bystander", Namespace: namespace.Of(testModel, ""),
			Blocks: []engine.Block{{Content: 777, Seq: 1}}}
		if err := p.Publish(ctx, testModel, &ev, 1); err != nil {
			during = err
			return
		}
		wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		during = r.WaitFor(wctx, streamLast(t, ctx, nc, DefaultStream))
	}
	began := time.Now()
	res, err := r.Resync(ctx, victim)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("the replay of %d messages took %v; the bystander's event was applied during it", res.Messages, time.Since(began))
	if hooked == 0 {
		t.Fatalf("the replay read %d messages in %d batches, want more than one batch", res.Messages, hooked+1)
	}
	if during != nil {
		t.Fatalf("an event published during the replay was not applied before it ended: %v", during)
	}
	waitApplied(t, ctx, r, streamLast(t, ctx, nc, DefaultStream))
	got, err := r.Engine().FindMatchesIn(ctx, namespace.Of(testModel, ""), []uint64{777}, nil)
	if err != nil || len(got) != 1 || got[0].Worker != "bystander" {
		t.Fatalf("the bystander's block: %+v %v", got, err)
	}
	if err := r.Engine().RemoveWorker("bystander"); err != nil {
		t.Fatal(err)
	}
	checkModel(t, r.Engine(), h, h.model(len(h.ops)))
}
