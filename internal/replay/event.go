package replay

import (
	"github.com/kvindex/kvindex/engine"
	"github.com/kvindex/kvindex/internal/namespace"
	"github.com/kvindex/kvindex/internal/oplog"
)

// Event returns the engine event of a non-query op (the blocks are copied), or the zero
// Event for a query.
//
// A stored op whose blocks carry lists of contents (a group spanning several units)
// becomes an event with Contents, each block's list in order. Lists of unequal lengths
// fit no group's span, which the contract rejects whatever the worker's state: such an
// op becomes an event with a content count no block count divides, which the engine
// rejects as the contract does (ErrInvalidEvent, before the parent is looked up).
//
// The event is in the namespace of no model: what replay, sim and bench apply and query
// with FindMatches.
func Event(op *oplog.Op) engine.Event { return ModelEvent(op, "") }

// ModelEvent is Event for an op log of model's engines: the event is in model's
// namespace (namespace.Of), the one a replica or a serve serving model queries. An op
// log names no LoRA adapters or cache salts, so that is model's default namespace.
func ModelEvent(op *oplog.Op, model string) engine.Event {
	ev := engine.Event{Worker: op.Worker, Parent: op.Parent, HasParent: op.HasParent, Tier: engine.Tier(op.Tier), Group: op.Group,
		Namespace: namespace.Of(model, "")}
	switch op.Kind {
	case oplog.Stored:
		ev.Kind = engine.EventStored
		ev.Blocks = make([]engine.Block, len(op.Blocks))
		for i, b := range op.Blocks {
			ev.Blocks[i] = engine.Block{Content: b[0], Seq: b[1]}
		}
		ev.Contents = contents(op)
	case oplog.Groups:
		ev.Kind, ev.Unit = engine.EventGroups, op.Unit
		ev.Groups = make([]engine.Group, len(op.GroupSpecs))
		for i, g := range op.GroupSpecs {
			k, err := engine.ParseGroupKind(g.Kind)
			if err != nil {
				k = 0 // an unknown kind: the engine rejects the declaration
			}
			ev.Groups[i] = engine.Group{Kind: k, BlockSize: g.BlockSize, Window: g.Window}
			if g.Kind == oplog.KindSlidingWindow && !g.HasWindow {
				ev.Groups[i].Window = 0 // a window missing: rejected
			}
			if g.Kind != oplog.KindSlidingWindow && g.HasWindow && g.Window == 0 {
				ev.Groups[i].Window = -1 // a window present on another kind: rejected
			}
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

// contents returns a stored op's per-unit contents for the engine: nil when every
// block has one content (a span of one unit), each block's list in order when the lists
// have one length, and an uneven count (see Event) when they do not.
func contents(op *oplog.Op) []uint64 {
	if op.Contents == nil {
		return nil
	}
	span, even, longest := -1, true, 0
	n := 0
	for _, c := range op.Contents {
		if span < 0 {
			span = len(c)
		}
		even = even && len(c) == span
		longest = max(longest, len(c))
		n += len(c)
	}
	switch {
	case even && span == 1:
		return nil // one content a block, written as a list: Blocks has them
	case even && span == 0:
		return []uint64{} // empty lists fit no span (at least 1): rejected
	case !even:
		// Unequal lists (so at least two blocks): blocks*longest+1 contents, which the
		// block count does not divide.
		return make([]uint64, len(op.Contents)*longest+1)
	}
	out := make([]uint64, 0, n)
	for _, c := range op.Contents {
		out = append(out, c...)
	}
	return out
}
