package replay

import (
	"github.com/kvindex/kvindex/engine"
	"github.com/kvindex/kvindex/internal/oplog"
)

// Event returns the engine event of a non-query op (the blocks are copied), or the zero
// Event for a query.
func Event(op *oplog.Op) engine.Event {
	ev := engine.Event{Worker: op.Worker, Parent: op.Parent, HasParent: op.HasParent, Tier: engine.Tier(op.Tier)}
	switch op.Kind {
	case oplog.Stored:
		ev.Kind = engine.EventStored
		ev.Blocks = make([]engine.Block, len(op.Blocks))
		for i, b := range op.Blocks {
			ev.Blocks[i] = engine.Block{Content: b[0], Seq: b[1]}
		}
	case oplog.Removed:
		ev.Kind, ev.Seqs = engine.EventRemoved, op.Seqs
	case oplog.Copied:
		ev.Kind, ev.Seqs = engine.EventCopied, op.Seqs
	case oplog.Cleared:
		ev.Kind = engine.EventCleared
	case oplog.RemoveWorker:
		ev.Kind = engine.EventRemoveWorker
	default:
		return engine.Event{}
	}
	return ev
}
