package fabric

import (
	"context"

	"github.com/kvindex/kvindex/engine"
	"github.com/kvindex/kvindex/internal/oplog"
)

// FromOp converts an op-log event to an engine event; ok is false for queries.
func FromOp(op *oplog.Op) (ev engine.Event, ok bool) {
	ev = engine.Event{Worker: op.Worker, Parent: op.Parent, HasParent: op.HasParent}
	switch op.Kind {
	case oplog.Stored:
		ev.Kind = engine.EventStored
		ev.Blocks = make([]engine.Block, len(op.Blocks))
		for i, b := range op.Blocks {
			ev.Blocks[i] = engine.Block{Content: b[0], Seq: b[1]}
		}
	case oplog.Removed:
		ev.Kind = engine.EventRemoved
		ev.Seqs = op.Seqs
	case oplog.Cleared:
		ev.Kind = engine.EventCleared
	case oplog.RemoveWorker:
		ev.Kind = engine.EventRemoveWorker
	default:
		return engine.Event{}, false
	}
	return ev, true
}

// PublishOps publishes the events of an op log (queries are skipped) under model,
// numbering each worker's events 1, 2, 3, ... in log order. The numbering depends on
// the log alone, so publishing the same log again (a relay restarted from the
// beginning of its input) adds nothing to the stream. It returns how many events it
// handed to the publisher.
func PublishOps(ctx context.Context, p *Publisher, model string, ops []oplog.Op) (int, error) {
	seqs := map[string]uint64{}
	n := 0
	for i := range ops {
		ev, ok := FromOp(&ops[i])
		if !ok {
			continue
		}
		seqs[ev.Worker]++
		if err := p.Publish(ctx, model, &ev, seqs[ev.Worker]); err != nil {
			return n, err
		}
		n++
	}
	return n, nil
}
