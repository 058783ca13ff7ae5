package fabric

import (
	"testing"

	"github.com/kvindex/kvindex/engine"
	"github.com/kvindex/kvindex/internal/replay"
	"github.com/kvindex/kvindex/subscriber"
)

// TestIndexAdapterExactlyOnce drives the adapter the way a ZeroMQ subscriber does: each
// event carries its source position, a restarted relay's subscriber replays the
// engine's history from the start, and a restarted engine (announced by a made-up clear
// with Cursor 0) numbers its batches from 0 again. The replica must end equal to the
// reference model of the history as the engine lived it: nothing twice, nothing lost.
func TestIndexAdapterExactlyOnce(t *testing.T) {
	ctx := testCtx(t)
	ns := startNATS(t)
	sc := StreamConfig{Memory: true}
	h := randomHistory(9, 1200)
	// One event per batch: event i of the engine's life before the restart is batch i.
	src := func(batch int) uint64 { return subscriber.SourceCursor(uint64(batch), 0) }
	events := make([]engine.Event, len(h.ops))
	for i := range h.ops {
		events[i] = replay.ModelEvent(&h.ops[i], testModel)
	}
	apply := func(a *IndexAdapter, ev engine.Event, cursor uint64) {
		ev.Cursor = cursor
		if err := a.Apply(&ev); err != nil {
			t.Fatal(err)
		}
	}
	half := len(events) / 2
	p1 := newPublisher(t, ctx, ns.connect(t), PublisherConfig{Stream: sc})
	a1 := p1.Index(ctx, testModel)
	for i := range events[:half] {
		apply(a1, events[i], src(i))
	}
	// The relay restarts: its subscriber replays every batch the engine still buffers,
	// from 0, and then the engine goes on.
	p2 := newPublisher(t, ctx, ns.connect(t), PublisherConfig{Stream: sc})
	a2 := p2.Index(ctx, testModel)
	for i := range events {
		apply(a2, events[i], src(i))
	}
	if st := p2.Stats(); st.Skipped != uint64(half) {
		t.Fatalf("restarted relay skipped %d events, want %d (%+v)", st.Skipped, half, st)
	}
	// The engines restart: the subscriber clears each worker (Cursor 0) and the engines'
	// new histories number their batches from 0 again.
	m := h.model(len(h.ops))
	workers := m.Workers()
	for _, w := range workers {
		apply(a2, engine.Event{Kind: engine.EventCleared, Worker: w}, 0)
		m.Cleared(w)
	}
	h2 := randomHistory(10, 400)
	for i := range h2.ops {
		apply(a2, replay.ModelEvent(&h2.ops[i], testModel), src(i))
		_ = m.Apply(&h2.ops[i])
	}
	nc := ns.connect(t)
	r := newReplica(t, ctx, nc, ReplicaConfig{Stream: sc}, "")
	waitApplied(t, ctx, r, streamLast(t, ctx, nc, DefaultStream))
	checkModel(t, r.Engine(), history{queries: append(h.queries, h2.queries...)}, m)
}
