package refmodel

import (
	"math/rand/v2"

	"github.com/kvindex/kvindex/internal/oplog"
)

// HybridOptions shapes RandomHybridOps.
type HybridOptions struct {
	Workers  int // default 6
	Alphabet int // content values 1..Alphabet; default 3
	MaxDoc   int // longest document in units; default 40
	// Tiers mixes in host-tier stores and copies of group blocks.
	Tiers bool
}

// RandomHybridOps returns a random history of hybrid and plain workers with queries,
// for differential tests of KV-cache groups: workers declare groups (full, sliding
// window and Mamba, spans 1 to 4, some declarations malformed on purpose, some dense),
// store a document's blocks group by group as roots or continuations, evict blocks of
// one group (a window's early blocks, a Mamba state, a full block in the middle), copy
// blocks to the host tier, clear, leave, redeclare, and send events the contract
// rejects (an undeclared group, contents of the wrong size, an unknown parent). Queries
// follow documents to random lengths or diverge. Queries carry no expectation: the
// caller asks a Model.
func RandomHybridOps(r *rand.Rand, n int, opt HybridOptions) []oplog.Op {
	if opt.Workers == 0 {
		opt.Workers = 6
	}
	if opt.Alphabet == 0 {
		opt.Alphabet = 3
	}
	if opt.MaxDoc == 0 {
		opt.MaxDoc = 40
	}
	const unit = 16
	g := &hybridGen{r: r, opt: opt, decl: make([][]oplog.GroupSpec, opt.Workers), seq: 1}
	for i := 0; i < 4; i++ {
		g.docs = append(g.docs, g.newDoc())
	}
	var ops []oplog.Op
	for len(ops) < n {
		w := r.IntN(opt.Workers)
		name := workerName(w)
		switch x := r.IntN(100); {
		case x < 6 || g.decl[w] == nil && x < 30:
			specs := g.randomGroups()
			ops = append(ops, oplog.Op{Kind: oplog.Groups, Worker: name, Unit: unit, GroupSpecs: specs})
			if _, err := groupRules(unit, specs); err == nil {
				g.decl[w] = specs
			}
		case x < 50:
			ops = append(ops, g.store(w, name)...)
		case x < 62:
			gi := g.group(w)
			seqs := make([]uint64, 1+r.IntN(4))
			for i := range seqs {
				seqs[i] = g.oldSeq()
			}
			op := oplog.Op{Kind: oplog.Removed, Worker: name, Group: gi, Seqs: seqs}
			if opt.Tiers && r.IntN(4) == 0 {
				op.Tier = 1
			}
			ops = append(ops, op)
		case x < 66 && opt.Tiers:
			ops = append(ops, oplog.Op{Kind: oplog.Copied, Worker: name, Group: g.group(w), Tier: 1, Seqs: []uint64{g.oldSeq(), g.oldSeq()}})
		case x < 68:
			ops = append(ops, oplog.Op{Kind: oplog.Cleared, Worker: name})
		case x < 69:
			ops = append(ops, oplog.Op{Kind: oplog.RemoveWorker, Worker: name})
			g.decl[w] = nil
		default:
			ops = append(ops, g.query())
		}
	}
	return ops[:n]
}

// hybridGen is RandomHybridOps' state: each worker's last accepted declaration (what
// it believes; the Model decides), the documents, and the seqs given out.
type hybridGen struct {
	r    *rand.Rand
	opt  HybridOptions
	decl [][]oplog.GroupSpec
	docs [][]uint64
	seq  uint64
	// given remembers recent seqs with the chain they were stored for, so removals,
	// copies and continuations name real blocks most of the time.
	given []givenSeq
}

type givenSeq struct {
	seq   uint64
	end   int // the block's end in units
	doc   int
	group int
}

func workerName(w int) string { return string(rune('a'+w)) + "-hybrid" }

func (g *hybridGen) newDoc() []uint64 {
	d := make([]uint64, 4+g.r.IntN(g.opt.MaxDoc))
	for i := range d {
		d[i] = uint64(1 + g.r.IntN(g.opt.Alphabet))
	}
	return d
}

// randomGroups returns a declaration: mostly a well-formed hybrid, sometimes dense,
// sometimes malformed.
func (g *hybridGen) randomGroups() []oplog.GroupSpec {
	r := g.r
	if r.IntN(12) == 0 {
		bad := [][]oplog.GroupSpec{
			{},
			{{Kind: "linear", BlockSize: 16}},
			{{Kind: "full", BlockSize: 24}},
			{{Kind: "sliding_window", BlockSize: 16}},
			{{Kind: "mamba", BlockSize: 16, Window: 4, HasWindow: true}},
		}
		return bad[r.IntN(len(bad))]
	}
	if r.IntN(8) == 0 {
		return []oplog.GroupSpec{{Kind: "full", BlockSize: 16}}
	}
	n := 1 + r.IntN(3)
	specs := make([]oplog.GroupSpec, n)
	for i := range specs {
		bs := 16 * (1 + r.IntN(4))
		if r.IntN(2) == 0 {
			bs = 16
		}
		switch k := r.IntN(3); {
		case i == 0 && r.IntN(3) > 0 || k == 0:
			specs[i] = oplog.GroupSpec{Kind: "full", BlockSize: bs}
		case k == 1:
			specs[i] = oplog.GroupSpec{Kind: "sliding_window", BlockSize: bs, Window: 1 + r.IntN(80), HasWindow: true}
		default:
			specs[i] = oplog.GroupSpec{Kind: "mamba", BlockSize: bs}
		}
	}
	return specs
}

// group picks one of w's groups, or now and then one it did not declare.
func (g *hybridGen) group(w int) int {
	if len(g.decl[w]) == 0 || g.r.IntN(25) == 0 {
		return g.r.IntN(3)
	}
	return g.r.IntN(len(g.decl[w]))
}

func (g *hybridGen) span(w, gi int) int {
	if gi < len(g.decl[w]) {
		return max(1, g.decl[w][gi].BlockSize/16)
	}
	return 1
}

func (g *hybridGen) oldSeq() uint64 {
	if len(g.given) == 0 || g.r.IntN(10) == 0 {
		return g.seq + uint64(g.r.IntN(3))
	}
	return g.given[len(g.given)-1-g.r.IntN(min(len(g.given), 200))].seq
}

// store returns a stored op of one group of w: a document's blocks from a start end to
// a stop end, as a root chain or under a block the generator gave out earlier for the
// same document, group and end; some blocks are left out afterwards (removed), as an
// engine that evicts a window's early blocks or keeps sparse Mamba states would.
func (g *hybridGen) store(w int, name string) []oplog.Op {
	r := g.r
	gi := g.group(w)
	span := g.span(w, gi)
	di := r.IntN(len(g.docs))
	if r.IntN(6) == 0 {
		g.docs = append(g.docs, g.newDoc())
		di = len(g.docs) - 1
	}
	doc := g.docs[di]
	nblocks := len(doc) / span
	if nblocks == 0 {
		return nil
	}
	op := oplog.Op{Kind: oplog.Stored, Worker: name, Group: gi}
	if g.opt.Tiers && r.IntN(5) == 0 {
		op.Tier = 1
	}
	from := 0 // blocks before from are the parent's
	if r.IntN(2) == 0 {
		for i := len(g.given) - 1; i >= 0 && i >= len(g.given)-100; i-- {
			if x := g.given[i]; x.doc == di && x.group == gi && x.end%span == 0 && x.end/span < nblocks {
				op.Parent, op.HasParent, from = x.seq, true, x.end/span
				break
			}
		}
	}
	to := from + 1 + r.IntN(nblocks-from)
	wrong := r.IntN(30) == 0 // a content list of the wrong size
	for b := from; b < to; b++ {
		seq := g.seq
		g.seq++
		if r.IntN(15) == 0 && len(g.given) > 0 {
			seq = g.oldSeq() // a re-store of a seq: last write wins, or a duplicate
		}
		c := doc[b*span : (b+1)*span]
		if span > 1 || wrong || r.IntN(10) == 0 {
			if op.Contents == nil {
				op.Contents = make([][]uint64, b-from)
				for i := range op.Contents {
					op.Contents[i] = []uint64{op.Blocks[i][0]}
				}
			}
			list := append([]uint64(nil), c...)
			if wrong {
				list = append(list, 1)
			}
			op.Contents = append(op.Contents, list)
		} else if op.Contents != nil {
			op.Contents = append(op.Contents, []uint64{c[0]})
		}
		op.Blocks = append(op.Blocks, [2]uint64{c[0], seq})
		g.given = append(g.given, givenSeq{seq: seq, end: (b + 1) * span, doc: di, group: gi})
	}
	ops := []oplog.Op{op}
	// Evict some of what was stored: early blocks (a window's), or all but a few ends
	// (sparse Mamba states), or one in the middle.
	if r.IntN(3) == 0 && to-from > 1 {
		var seqs []uint64
		for i, b := range op.Blocks {
			if r.IntN(3) == 0 || i < (to-from)/2 && r.IntN(2) == 0 {
				seqs = append(seqs, b[1])
			}
		}
		ops = append(ops, oplog.Op{Kind: oplog.Removed, Worker: name, Group: gi, Tier: op.Tier, Seqs: seqs})
	}
	return ops
}

// query asks for a document's prefix of some length, sometimes diverging at the end.
func (g *hybridGen) query() oplog.Op {
	r := g.r
	doc := g.docs[r.IntN(len(g.docs))]
	q := append([]uint64(nil), doc[:1+r.IntN(len(doc))]...)
	if r.IntN(5) == 0 {
		q[len(q)-1] += uint64(g.opt.Alphabet)
	}
	return oplog.Op{Kind: oplog.Query, Content: q}
}
