package refmodel

import (
	"fmt"
	"math/rand/v2"

	"github.com/kvindex/kvindex/internal/oplog"
)

// RandomOptions shapes RandomOps.
type RandomOptions struct {
	Workers  int // default 5
	Alphabet int // content values are drawn from 1..Alphabet; default 3 (equal content under other prefixes is common)
	MaxChain int // longest chain a store event builds; default 150
	// Tiers mixes in events of the host and disk tiers: stores and removals on them,
	// and copies of held blocks to another tier (an offload) under their parent.
	Tiers bool
}

// RandomOps returns a random event history with queries, meant for differential tests:
// workers store chains (roots, continuations under held blocks, refills of removed
// blocks, re-stores of held seqs elsewhere), remove tails and middles, clear, leave and
// return; some events are rejected on purpose. Queries follow held prefixes, diverge,
// overrun or start nowhere. Every query carries no expectation: the caller asks a Model.
func RandomOps(r *rand.Rand, n int, opt RandomOptions) []oplog.Op {
	if opt.Workers == 0 {
		opt.Workers = 5
	}
	if opt.Alphabet == 0 {
		opt.Alphabet = 3
	}
	if opt.MaxChain == 0 {
		opt.MaxChain = 150
	}
	type held struct {
		seq       uint64
		chain     []uint64 // content from position 0
		tier      uint8
		parent    uint64
		hasParent bool
	}
	tier := func() uint8 {
		if !opt.Tiers {
			return 0
		}
		switch x := r.IntN(20); {
		case x < 12:
			return 0
		case x < 17:
			return 1
		default:
			return 2
		}
	}
	// Each worker's view of what it stored; it may be stale (the point is to produce
	// interesting events, the Model decides what they mean).
	views := make([][]held, opt.Workers)
	var docs [][]uint64
	nextSeq := uint64(1)
	content := func() uint64 { return uint64(1 + r.IntN(opt.Alphabet)) }
	name := func(w int) string { return fmt.Sprintf("w%d", w) }
	var ops []oplog.Op
	for len(ops) < n {
		w := r.IntN(opt.Workers)
		v := views[w]
		switch k := r.IntN(100); {
		case opt.Tiers && k < 4 && len(v) > 0: // copy held blocks to host or disk by seq (an offload)
			t := uint8(1 + r.IntN(2))
			var seqs []uint64
			for i := r.IntN(4); i >= 0; i-- {
				h := v[r.IntN(len(v))]
				seqs = append(seqs, h.seq)
				v = append(v, held{seq: h.seq, chain: h.chain, tier: t, parent: h.parent, hasParent: h.hasParent})
			}
			if r.IntN(10) == 0 {
				seqs = append(seqs, nextSeq+7000) // held nowhere: skipped
			}
			ops = append(ops, oplog.Op{Kind: oplog.Copied, Worker: name(w), Tier: t, Seqs: seqs})
		case opt.Tiers && k < 8 && len(v) > 0: // copy a held block to another tier, under its parent
			h := v[r.IntN(len(v))]
			t := uint8((int(h.tier) + 1 + r.IntN(2)) % 3)
			op := oplog.Op{Kind: oplog.Stored, Worker: name(w), Tier: t, Parent: h.parent, HasParent: h.hasParent,
				Blocks: [][2]uint64{{h.chain[len(h.chain)-1], h.seq}}}
			ops = append(ops, op)
			v = append(v, held{seq: h.seq, chain: h.chain, tier: t, parent: h.parent, hasParent: h.hasParent})
		case k < 30: // store a chain: fresh root, continuation, or a document's prefix
			var parent *held
			var base []uint64
			if len(v) > 0 && r.IntN(3) > 0 {
				parent = &v[r.IntN(len(v))]
				base = parent.chain
			}
			m := 1 + r.IntN(1+r.IntN(opt.MaxChain))
			blocks := make([][2]uint64, m)
			chain := append([]uint64(nil), base...)
			var doc []uint64
			if len(docs) > 0 && r.IntN(2) == 0 {
				doc = docs[r.IntN(len(docs))]
			}
			t := tier()
			prev, hasPrev := uint64(0), parent != nil
			if parent != nil {
				prev = parent.seq
			}
			for i := range blocks {
				c := content()
				if p := len(chain); p < len(doc) && r.IntN(10) > 0 {
					c = doc[p]
				}
				seq := nextSeq
				nextSeq++
				switch x := r.IntN(40); {
				case x == 0 && len(v) > 0: // re-store a held seq elsewhere (or the same place)
					seq = v[r.IntN(len(v))].seq
				case x == 1 && i > 0: // duplicate seq in one event: rejected
					seq = blocks[0][1]
				case x == 2 && parent != nil: // seq equal to the parent: rejected
					seq = parent.seq
				}
				blocks[i] = [2]uint64{c, seq}
				chain = append(chain, c)
				v = append(v, held{seq: seq, chain: append([]uint64(nil), chain...), tier: t, parent: prev, hasParent: hasPrev})
				prev, hasPrev = seq, true
			}
			op := oplog.Op{Kind: oplog.Stored, Worker: name(w), Blocks: blocks, Tier: t}
			if parent != nil {
				op.Parent, op.HasParent = parent.seq, true
				if r.IntN(25) == 0 {
					op.Parent = nextSeq + 1000 // unknown parent: rejected
				}
			}
			if r.IntN(30) == 0 {
				op.Blocks = nil // an empty store is a no-op, whatever the parent
			}
			ops = append(ops, op)
			if r.IntN(4) == 0 {
				docs = append(docs, chain)
			}
		case k < 50: // remove: mostly tails, sometimes middles, sometimes unknown
			if len(v) == 0 {
				continue
			}
			var seqs []uint64
			cnt := 1 + r.IntN(4)
			t := v[len(v)-1].tier
			if opt.Tiers && r.IntN(4) == 0 {
				t = tier()
			}
			for i := 0; i < cnt; i++ {
				j := len(v) - 1
				if r.IntN(3) == 0 {
					j = r.IntN(len(v))
				}
				seqs = append(seqs, v[j].seq)
				if r.IntN(2) == 0 {
					v = append(v[:j], v[j+1:]...)
				}
				if len(v) == 0 {
					break
				}
			}
			if r.IntN(10) == 0 {
				seqs = append(seqs, nextSeq+5000)
			}
			ops = append(ops, oplog.Op{Kind: oplog.Removed, Worker: name(w), Seqs: seqs, Tier: t})
		case k < 52:
			ops = append(ops, oplog.Op{Kind: oplog.Cleared, Worker: name(w)})
			v = nil
		case k < 53:
			ops = append(ops, oplog.Op{Kind: oplog.RemoveWorker, Worker: name(w)})
			v = nil
		default: // query
			var q []uint64
			switch x := r.IntN(5); {
			case x <= 2 && len(v) > 0:
				q = append(q, v[r.IntN(len(v))].chain...)
			case x == 3 && len(docs) > 0:
				q = append(q, docs[r.IntN(len(docs))]...)
			default:
				for i := r.IntN(20); i > 0; i-- {
					q = append(q, content())
				}
			}
			if len(q) > 0 && r.IntN(2) == 0 {
				q = q[:1+r.IntN(len(q))]
			}
			if len(q) > 0 && r.IntN(3) == 0 {
				q[r.IntN(len(q))] = content()
			}
			for i := r.IntN(3); i > 0; i-- {
				q = append(q, content())
			}
			ops = append(ops, oplog.Op{Kind: oplog.Query, Content: q})
		}
		views[w] = v
	}
	return ops
}

// Apply applies one non-query op to the model and returns the stored event's error.
func (m *Model) Apply(op *oplog.Op) error {
	switch op.Kind {
	case oplog.Stored:
		return m.StoredIn(op.Worker, op.Group, int(op.Tier), op.Parent, op.HasParent, op.Blocks, op.Contents)
	case oplog.Removed:
		m.RemovedIn(op.Worker, op.Group, int(op.Tier), op.Seqs)
	case oplog.Copied:
		_, err := m.CopiedIn(op.Worker, op.Group, int(op.Tier), op.Seqs)
		return err
	case oplog.Groups:
		return m.Groups(op.Worker, op.Unit, op.GroupSpecs)
	case oplog.Cleared:
		m.Cleared(op.Worker)
	case oplog.RemoveWorker:
		m.RemoveWorker(op.Worker)
	}
	return nil
}
