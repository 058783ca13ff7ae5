package bench

import (
	"github.com/kvindex/kvindex/engine"
)

// maxCoalesced bounds the blocks or seqs of one coalesced event: far below the engine's
// default MaxEventBlocks, and long enough that coalescing's savings are all there (the
// trace-driven logs' runs of removals are a few hundred seqs long).
const maxCoalesced = 4096

// Coalesced returns w with its events merged the way an ingester that holds an engine's
// batch could merge them before any index sees them, and the way the peer drivers'
// coalesced replay merges them (bench/peers/driver, oplog.rs), so that both sides of a
// coalesced row apply the same calls:
//
//   - a removal joins the event before it when that one is a removal of the same worker
//     on the same tier and group;
//   - a store joins the event before it when that one is a store of the same worker in
//     the same namespace, tier and group whose last block is the new store's parent, and
//     no seq of the new store is in it (a seq twice in one event is a rejection that two
//     events would not have been).
//
// Events with a query between them are never merged, and no merged event exceeds
// maxCoalesced blocks or seqs, so every checked query sees the state it sees in w and
// applying the merged events gives the state w's events give. Merged events get fresh
// slices; w is not modified.
func (w *Workload) Coalesced() *Workload {
	c := &Workload{Name: w.Name, Ops: w.Ops, Queries: w.Queries, Workers: w.Workers,
		BlockOps: w.BlockOps, QueryBlocks: w.QueryBlocks, Checked: w.Checked, checks: w.checks}
	owned := false // whether the last event of c has slices of its own
	for k, s := range w.steps {
		if s < 0 {
			c.steps = append(c.steps, s)
			continue
		}
		ev := &w.Events[s]
		if n := len(c.Events); n > 0 && k > 0 && w.steps[k-1] >= 0 && !w.cut[s] && joins(&c.Events[n-1], ev) {
			last := &c.Events[n-1]
			if !owned {
				last.Blocks = append([]engine.Block(nil), last.Blocks...)
				last.Seqs = append([]uint64(nil), last.Seqs...)
				owned = true
			}
			last.Blocks = append(last.Blocks, ev.Blocks...)
			last.Seqs = append(last.Seqs, ev.Seqs...)
			continue
		}
		owned = false
		c.steps = append(c.steps, int32(len(c.Events)))
		c.Events = append(c.Events, *ev)
		c.wid = append(c.wid, w.wid[s])
		c.cut = append(c.cut, w.cut[s])
	}
	return c
}

// joins reports whether ev may be merged into prev, the event before it (Coalesced).
func joins(prev, ev *engine.Event) bool {
	if prev.Kind != ev.Kind || prev.Worker != ev.Worker || prev.Tier != ev.Tier || prev.Group != ev.Group ||
		prev.Contents != nil || ev.Contents != nil {
		return false
	}
	switch ev.Kind {
	case engine.EventRemoved:
		return len(prev.Seqs)+len(ev.Seqs) <= maxCoalesced
	case engine.EventStored:
		if len(prev.Blocks) == 0 || !ev.HasParent || ev.Parent != prev.Blocks[len(prev.Blocks)-1].Seq ||
			prev.Namespace != ev.Namespace || len(prev.Blocks)+len(ev.Blocks) > maxCoalesced {
			return false
		}
		for i := range ev.Blocks {
			if ev.Blocks[i].Seq == prev.Parent && prev.HasParent {
				return false
			}
			for j := range prev.Blocks {
				if prev.Blocks[j].Seq == ev.Blocks[i].Seq {
					return false
				}
			}
		}
		return true
	}
	return false
}
