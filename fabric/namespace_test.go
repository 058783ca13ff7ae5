package fabric

import (
	"errors"
	"path/filepath"
	"testing"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/kvindex/kvindex/engine"
	"github.com/kvindex/kvindex/internal/namespace"
)

// TestPublishRefusesForeignNamespace: a store outside its model's namespaces could never
// match a query for the model; Publish refuses it and the stream stays empty. Clears
// and removals carry no namespace and pass.
func TestPublishRefusesForeignNamespace(t *testing.T) {
	ctx := testCtx(t)
	ns := startNATS(t)
	nc := ns.connect(t)
	p := newPublisher(t, ctx, nc, PublisherConfig{Stream: StreamConfig{Memory: true}})
	blocks := []engine.Block{{Content: 1, Seq: 1}}
	for _, c := range []struct{ model, ns string }{
		{testModel, ""},                          // the op log's namespace, before Of
		{testModel, "lora=a"},                    // an event namespace, before Of
		{testModel, namespace.Of("other", "")},   // another model's
		{"", namespace.Of(testModel, "")},        // a model's, under no model
		{"m", namespace.Of("mm", "salt=x")},      // a model whose name extends m's
		{"a;b", namespace.Of("a", "salt=b;x=1")}, // escaping keeps models apart
	} {
		ev := engine.Event{Kind: engine.EventStored, Worker: "w", Namespace: c.ns, Blocks: blocks}
		if err := p.Publish(ctx, c.model, &ev, 0); !errors.Is(err, ErrMalformed) {
			t.Errorf("model %q, namespace %q: err %v, want ErrMalformed", c.model, c.ns, err)
		}
	}
	if last := streamLast(t, ctx, nc, DefaultStream); last != 0 {
		t.Fatalf("stream holds %d messages", last)
	}
	for _, ev := range []engine.Event{
		{Kind: engine.EventStored, Worker: "w", Namespace: namespace.Of(testModel, "lora=a"), Blocks: blocks},
		{Kind: engine.EventCleared, Worker: "w"},
		{Kind: engine.EventRemoved, Worker: "w", Seqs: []uint64{1}},
	} {
		if err := p.Publish(ctx, testModel, &ev, 0); err != nil {
			t.Fatalf("%+v: %v", ev, err)
		}
	}
}

// TestReplicaSkipsForeign: a message whose subject names another worker, or a model
// that does not hold the message's namespace, is skipped and counted (Foreign); the
// rest of the stream applies.
func TestReplicaSkipsForeign(t *testing.T) {
	ctx, _, nc, _, sc, _ := memoryStream(t, 21, 10)
	js, _ := jetstream.New(nc)
	raw := func(model, subjWorker string, ev engine.Event) {
		t.Helper()
		b := AppendMessage(nil, &Message{Event: ev})
		if _, err := js.Publish(ctx, Subject(DefaultSubjectPrefix, model, subjWorker), b); err != nil {
			t.Fatal(err)
		}
	}
	store := func(worker, ns string, c uint64) engine.Event {
		return engine.Event{Kind: engine.EventStored, Worker: worker, Namespace: ns, Blocks: []engine.Block{{Content: c, Seq: c}}}
	}
	raw(testModel, "b", store("a", namespace.Of(testModel, ""), 1))       // another worker's subject
	raw(testModel, "a", store("a", "", 2))                                // no model's namespace
	raw(testModel, "a", store("a", namespace.Of("other", ""), 3))         // another model's
	raw("", "a", store("a", namespace.Of(testModel, ""), 4))              // a model's under none
	raw(testModel, "a", store("a", namespace.Of(testModel, "lora=x"), 5)) // good
	raw(testModel, "a", engine.Event{Kind: engine.EventRemoved, Worker: "a", Seqs: []uint64{9}})
	if _, err := js.Publish(ctx, DefaultSubjectPrefix+".zz.61", AppendMessage(nil, &Message{Event: store("a", "", 6)})); err != nil {
		t.Fatal(err) // a model token that is not hex
	}
	r := newReplica(t, ctx, nc, ReplicaConfig{Stream: sc}, "")
	waitApplied(t, ctx, r, streamLast(t, ctx, nc, DefaultStream))
	if st := r.Stats(); st.Foreign != 5 || st.Applied != 2 {
		t.Fatalf("stats %+v, want 5 foreign and 2 applied", st)
	}
	if est := r.Engine().Stats(); est.Blocks != 1 {
		t.Fatalf("engine holds %d blocks, want 1", est.Blocks)
	}
}

// TestSnapshotKeepsModels: a snapshot describes the stream for the models its replica
// followed; restored into a replica of other models it would miss their messages before
// it, so it is refused there (and the stream replayed) and accepted by a replica of
// the same models, in any order.
func TestSnapshotKeepsModels(t *testing.T) {
	ctx, _, nc, h, sc, p := memoryStream(t, 22, 600)
	if _, err := PublishOps(ctx, p, testModel, h.ops); err != nil {
		t.Fatal(err)
	}
	last := streamLast(t, ctx, nc, DefaultStream)
	snap := filepath.Join(t.TempDir(), "r.snap")
	models := []string{testModel, "other"}
	r := newReplica(t, ctx, nc, ReplicaConfig{Stream: sc, Models: models}, "")
	waitApplied(t, ctx, r, last)
	if err := r.Snapshot(snap); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		models   []string
		restored bool
	}{
		{[]string{"other", testModel, "other"}, true},
		{nil, false},
		{[]string{testModel}, false},
		{[]string{testModel, "other", "third"}, false},
	} {
		rr := newReplica(t, ctx, nc, ReplicaConfig{Stream: sc, Models: c.models}, snap)
		st := rr.Stats()
		if st.Restored != c.restored || (!c.restored && !errors.Is(st.SnapshotErr, ErrSnapshot)) {
			t.Fatalf("models %q: %+v, want restored %v", c.models, st, c.restored)
		}
		waitApplied(t, ctx, rr, last)
		checkModel(t, rr.Engine(), h, h.model(len(h.ops)))
		rr.Close()
	}
}
