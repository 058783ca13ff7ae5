package bench

import (
	"slices"
	"testing"

	"github.com/kvindex/kvindex/engine"
	"github.com/kvindex/kvindex/internal/oplog"
	"github.com/kvindex/kvindex/internal/refmodel"
)

// TestCoalescedMerges pins the merge rule on a log that exercises each of its cases.
func TestCoalescedMerges(t *testing.T) {
	st := func(w string, parent uint64, has bool, seqs ...uint64) oplog.Op {
		op := oplog.Op{Kind: oplog.Stored, Worker: w, Parent: parent, HasParent: has}
		for _, s := range seqs {
			op.Blocks = append(op.Blocks, [2]uint64{s * 10, s})
		}
		return op
	}
	rm := func(w string, seqs ...uint64) oplog.Op { return oplog.Op{Kind: oplog.Removed, Worker: w, Seqs: seqs} }
	ops := []oplog.Op{
		st("a", 0, false, 1, 2),
		st("a", 2, true, 3),    // extends the store before: merged
		st("a", 3, true, 4),    // and again
		st("a", 3, true, 5, 6), // its parent is not the last block: not merged
		st("a", 6, true, 5),    // a seq of the store before: not merged
		rm("a", 4),             // a removal after a store: not merged
		rm("a", 3),             // merged
		rm("b", 9),             // another worker: not merged
		rm("b", 8),             // merged
		{Kind: oplog.Query, Content: []uint64{10}}, // a query cuts
		rm("b", 7),
		{Kind: oplog.Removed, Worker: "b", Seqs: []uint64{6}, Tier: 1}, // another tier
	}
	w := NewWorkload("t", ops)
	c := w.Coalesced()
	type ev struct {
		kind   engine.EventKind
		worker string
		seqs   []uint64
	}
	var got []ev
	for _, e := range c.Events {
		x := ev{kind: e.Kind, worker: e.Worker, seqs: e.Seqs}
		for _, b := range e.Blocks {
			x.seqs = append(x.seqs, b.Seq)
		}
		got = append(got, x)
	}
	want := []ev{
		{engine.EventStored, "a", []uint64{1, 2, 3, 4}},
		{engine.EventStored, "a", []uint64{5, 6}},
		{engine.EventStored, "a", []uint64{5}},
		{engine.EventRemoved, "a", []uint64{4, 3}},
		{engine.EventRemoved, "b", []uint64{9, 8}},
		{engine.EventRemoved, "b", []uint64{7}},
		{engine.EventRemoved, "b", []uint64{6}},
	}
	if !slices.EqualFunc(got, want, func(a, b ev) bool {
		return a.kind == b.kind && a.worker == b.worker && slices.Equal(a.seqs, b.seqs)
	}) {
		t.Fatalf("coalesced events\n got %v\nwant %v", got, want)
	}
	if c.BlockOps != w.BlockOps || len(c.wid) != len(c.Events) || len(c.cut) != len(c.Events) {
		t.Errorf("block ops %d (want %d), %d worker ids and %d cuts for %d events", c.BlockOps, w.BlockOps, len(c.wid), len(c.cut), len(c.Events))
	}
	// w is untouched: its first event still holds its own two blocks.
	if len(w.Events[0].Blocks) != 2 || len(w.Events) != len(ops)-1 {
		t.Errorf("Coalesced modified w: first event %+v, %d events", w.Events[0], len(w.Events))
	}
}

// TestCoalescedKeepsAnswers replays coalesced random logs (removals of middles and of
// unknown seqs, re-stores elsewhere, duplicates) and checks every checked query against
// the reference model's answer on the original log, on the locked index, a sharded
// engine and the radix tree.
func TestCoalescedKeepsAnswers(t *testing.T) {
	for seed := range uint64(4) {
		w := Builtin(seed, 3000)
		// Runs of single-seq removals, as in the trace-driven logs, so that merges happen.
		var ops []oplog.Op
		m := refmodel.New()
		for _, s := range w.steps {
			if s < 0 {
				op := w.checks[^s]
				m.Expect(&op)
				ops = append(ops, op)
				continue
			}
			for _, op := range splitRemoval(eventOp(&w.Events[s])) {
				if m.Apply(&op) == nil {
					ops = append(ops, op)
				}
			}
		}
		w = NewWorkload("split", ops)
		c := w.Coalesced()
		if len(c.Events) >= len(w.Events) || c.Checked != w.Checked || w.Checked == 0 {
			t.Fatalf("seed %d: %d events coalesced to %d; %d checks (%d)", seed, len(w.Events), len(c.Events), c.Checked, w.Checked)
		}
		for _, impl := range []Impl{LockedImpl(), EngineImpl(2), RadixImpl()} {
			v, err := Verify(impl, c)
			if err != nil {
				t.Fatal(err)
			}
			if v.Failed > 0 || v.Passed != c.Checked {
				t.Errorf("seed %d, %s: %d of %d passed; first failure: %s", seed, impl.Name, v.Passed, c.Checked, v.First)
			}
		}
	}
}

// eventOp is ev as an op (stored and removed events of the default namespace, tier and
// group: what Builtin makes).
func eventOp(ev *engine.Event) oplog.Op {
	op := oplog.Op{Worker: ev.Worker, Parent: ev.Parent, HasParent: ev.HasParent, Seqs: ev.Seqs}
	switch ev.Kind {
	case engine.EventStored:
		op.Kind = oplog.Stored
		for _, b := range ev.Blocks {
			op.Blocks = append(op.Blocks, [2]uint64{b.Content, b.Seq})
		}
	case engine.EventRemoved:
		op.Kind = oplog.Removed
	}
	return op
}

// splitRemoval returns a removal as one removal per seq, and any other op as itself.
func splitRemoval(op oplog.Op) []oplog.Op {
	if op.Kind != oplog.Removed {
		return []oplog.Op{op}
	}
	var out []oplog.Op
	for _, s := range op.Seqs {
		out = append(out, oplog.Op{Kind: oplog.Removed, Worker: op.Worker, Seqs: []uint64{s}})
	}
	return out
}
