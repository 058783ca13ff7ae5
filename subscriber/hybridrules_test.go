package subscriber

import (
	"bytes"
	"context"
	"encoding/binary"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/zeebo/xxh3"

	"github.com/kvindex/kvindex/engine"
	"github.com/kvindex/kvindex/internal/oplog"
	"github.com/kvindex/kvindex/internal/refmodel"
)

// gev is a vLLM v0.26 map event of a hybrid model's group: a store carries group_idx,
// kv_cache_spec_kind, its block size and (sliding window) the window; a removal
// group_idx alone.
type gev struct {
	kind   string // stored, removed, cleared
	group  int
	spec   string
	bs     int // tokens per block (a multiple of testBS)
	window int // sliding window in tokens; 0: nil
	seqs   []uint64
	parent *uint64
	units  [][]uint64 // each block's unit values (bs/testBS of them), stored only
}

func (g gev) encode(m mp) mp {
	switch g.kind {
	case "removed":
		return m.Map(4).Str("type").Str("BlockRemoved").Str("block_hashes").Uints(g.seqs...).
			Str("medium").Str("GPU").Str("group_idx").Uint(uint64(g.group))
	case "cleared":
		return m.Arr(1).Str("AllBlocksCleared")
	}
	m = m.Map(11).Str("type").Str("BlockStored").Str("block_hashes").Uints(g.seqs...).Str("parent_block_hash")
	if g.parent != nil {
		m = m.Uint(*g.parent)
	} else {
		m = m.Nil()
	}
	var toks []uint32
	for _, b := range g.units {
		for _, v := range b {
			toks = append(toks, blockTokens(v)...)
		}
	}
	m = m.Str("token_ids").Tokens(toks).Str("block_size").Uint(uint64(g.bs)).Str("medium").Str("GPU").
		Str("lora_name").Nil().Str("extra_keys").Arr(len(g.seqs))
	for range g.seqs {
		m = m.Nil()
	}
	m = m.Str("group_idx").Uint(uint64(g.group)).Str("kv_cache_spec_kind").Str(g.spec).Str("kv_cache_spec_sliding_window")
	if g.window > 0 {
		return m.Uint(uint64(g.window))
	}
	return m.Nil()
}

func gbatch(events ...gev) []byte {
	m := mp{}.Arr(3).F64(1750000000.25).Arr(len(events))
	for _, e := range events {
		m = e.encode(m)
	}
	return m.Uint(0)
}

// apply applies g to the reference model as the index must: its group is gi of the
// declaration (-1: not indexed).
func (g gev) apply(m *refmodel.Model, gi int) {
	switch {
	case g.kind == "cleared":
		m.Cleared("w")
		return
	case gi < 0:
		return
	case g.kind == "removed":
		m.RemovedIn("w", gi, 0, g.seqs)
		return
	}
	blocks := make([][2]uint64, len(g.seqs))
	var lists [][]uint64
	if g.bs != testBS {
		lists = make([][]uint64, len(g.seqs))
	}
	for i, s := range g.seqs {
		c := contents(g.units[i]...)
		blocks[i] = [2]uint64{c[0], s}
		if lists != nil {
			lists[i] = c
		}
	}
	var parent uint64
	if g.parent != nil {
		parent = *g.parent
	}
	_ = m.StoredIn("w", gi, 0, parent, g.parent != nil, blocks, lists)
}

// groupModel is one group of a simulated hybrid engine.
type groupModel struct {
	idx    int
	spec   string // kv_cache_spec_kind
	kind   string // oplog's kind
	bs     int
	window int
}

func (g groupModel) oplogSpec() oplog.GroupSpec {
	return oplog.GroupSpec{Kind: g.kind, BlockSize: g.bs, Window: g.window, HasWindow: g.window > 0}
}

// blockSeq is the engine hash of the block of span units ending at end of doc: equal
// prefixes get equal hashes, in every group of that block size, as vLLM's do.
func blockSeq(doc []uint64, end, span int) uint64 {
	b := make([]byte, 0, 8*end+8)
	b = binary.LittleEndian.AppendUint64(b, uint64(span))
	for _, v := range doc[:end] {
		b = binary.LittleEndian.AppendUint64(b, v)
	}
	return xxh3.Hash(b) | 1
}

// hybridEngine simulates one vLLM worker serving a hybrid model: each request stores
// its prompt's blocks in every group, from the first block the group does not hold;
// sliding-window groups then evict the blocks their window left, Mamba groups every
// state but the last, and some blocks of any group are evicted at random.
type hybridEngine struct {
	r      *rand.Rand
	groups []groupModel
	docs   [][]uint64
	held   []map[uint64]bool // per group: seqs held
}

func newHybridEngine(r *rand.Rand, groups []groupModel) *hybridEngine {
	h := &hybridEngine{r: r, groups: groups}
	for range groups {
		h.held = append(h.held, map[uint64]bool{})
	}
	for range 4 {
		h.docs = append(h.docs, h.newDoc())
	}
	return h
}

func (h *hybridEngine) newDoc() []uint64 {
	d := make([]uint64, 8+h.r.IntN(24))
	for i := range d {
		d[i] = 1 + uint64(h.r.IntN(3))
	}
	return d
}

// request returns one batch: a prompt's stores in every group and the evictions after
// it.
func (h *hybridEngine) request() []gev {
	if h.r.IntN(20) == 0 {
		for _, m := range h.held {
			clear(m)
		}
		return []gev{{kind: "cleared"}}
	}
	di := h.r.IntN(len(h.docs))
	if h.r.IntN(4) == 0 { // a new document sharing a prefix with an old one
		d := h.docs[di]
		nd := append(slices.Clone(d[:h.r.IntN(len(d))]), h.newDoc()...)
		h.docs = append(h.docs, nd)
		di = len(h.docs) - 1
	}
	doc := h.docs[di]
	n := 1 + h.r.IntN(len(doc))
	var out []gev
	for gi, g := range h.groups {
		span := g.bs / testBS
		e := gev{kind: "stored", group: g.idx, spec: g.spec, bs: g.bs, window: g.window}
		for end := span; end <= n; end += span {
			s := blockSeq(doc, end, span)
			if h.held[gi][s] && len(e.seqs) == 0 {
				p := s
				e.parent = &p
				continue
			}
			e.seqs = append(e.seqs, s)
			e.units = append(e.units, slices.Clone(doc[end-span:end]))
			h.held[gi][s] = true
		}
		if len(e.seqs) > 0 {
			out = append(out, e)
		}
		// Evictions: what the group no longer needs, and random ones.
		var rm []uint64
		last := n / span * span
		for end := span; end <= last; end += span {
			s := blockSeq(doc, end, span)
			drop := false
			switch g.kind {
			case oplog.KindSlidingWindow:
				drop = end*testBS <= last*testBS-g.window && h.r.IntN(2) == 0
			case oplog.KindMamba:
				drop = end < last && h.r.IntN(2) == 0
			}
			if drop || h.r.IntN(12) == 0 {
				if h.held[gi][s] {
					rm = append(rm, s)
					delete(h.held[gi], s)
				}
			}
		}
		if len(rm) > 0 {
			out = append(out, gev{kind: "removed", group: g.idx, seqs: rm})
		}
	}
	return out
}

// query returns a random prompt: a document's prefix, diverging sometimes.
func (h *hybridEngine) query() []uint64 {
	doc := h.docs[h.r.IntN(len(h.docs))]
	q := slices.Clone(doc[:1+h.r.IntN(len(doc))])
	if h.r.IntN(4) == 0 {
		q[h.r.IntN(len(q))] = 9
	}
	return contents(q...)
}

var hybridModels = map[string][]groupModel{
	"full+window+mamba": {
		{0, "full_attention", oplog.KindFull, testBS, 0},
		{1, "sliding_window", oplog.KindSlidingWindow, testBS, 10},
		{2, "mamba", oplog.KindMamba, 2 * testBS, 0},
	},
	"full+2 windows": { // Gemma 3: one full group, several window groups alike
		{0, "full_attention", oplog.KindFull, testBS, 0},
		{1, "sliding_window", oplog.KindSlidingWindow, testBS, 6},
		{2, "sliding_window", oplog.KindSlidingWindow, testBS, 6},
	},
	"mla+mamba of 3 units": {
		{0, "mla_attention", oplog.KindFull, testBS, 0},
		{1, "mamba", oplog.KindMamba, 3 * testBS, 0},
	},
	"full of 2 units+window": {
		{0, "full_attention", oplog.KindFull, 2 * testBS, 0},
		{1, "sliding_window", oplog.KindSlidingWindow, 2 * testBS, 12},
	},
}

// TestHybridDifferential: random streams of hybrid models through a subscriber in
// hybrid mode (groups learned from the events, and declared in the configuration)
// answer every query as the reference model holding each group's blocks does.
func TestHybridDifferential(t *testing.T) {
	for name, groups := range hybridModels {
		for _, declared := range []bool{false, true} {
			t.Run(name+map[bool]string{false: "/learned", true: "/declared"}[declared], func(t *testing.T) {
				r := rand.New(rand.NewPCG(uint64(len(name)), 7))
				var decl []engine.Group
				specs := make([]oplog.GroupSpec, len(groups))
				for i, g := range groups {
					specs[i] = g.oplogSpec()
					k, _ := groupKind(g.spec)
					decl = append(decl, engine.Group{Kind: k, BlockSize: g.bs, Window: g.window})
				}
				s, _, _ := diagSub(t, func(c *Config) {
					c.Groups = GroupFilter{Hybrid: true}
					if declared {
						c.Groups.Declared = decl
					}
				})
				m := refmodel.New()
				if err := m.Groups("w", testBS, specs); err != nil {
					t.Fatal(err)
				}
				h := newHybridEngine(r, groups)
				f := &feeder{s: s}
				// The first request stores a block of every group: the groups are
				// learned together, declared once.
				for {
					b := h.request()
					if len(b) >= len(groups) && b[0].kind == "stored" {
						f.send(t, gbatch(b...))
						for _, e := range b {
							e.apply(m, e.group)
						}
						break
					}
				}
				e := s.cfg.Index.(*engine.Engine)
				matched := 0
				for round := range 40 {
					for range 5 {
						b := h.request()
						f.send(t, gbatch(b...))
						for _, e := range b {
							e.apply(m, e.group)
						}
					}
					qs := make([][]uint64, 8)
					for i := range qs {
						qs[i] = h.query()
					}
					sameAnswers(t, e, Namespace("m", ""), m, qs)
					for _, q := range qs {
						if len(m.Query(q)) > 0 {
							matched++
						}
					}
					if t.Failed() {
						t.Fatalf("round %d", round)
					}
				}
				if matched < 40*8/10 {
					t.Fatalf("%d of %d queries matched: the histories test little", matched, 40*8)
				}
				t.Logf("%d of %d queries matched", matched, 40*8)
				st := s.Status()
				if st.GroupDeclarations != 1 || st.Invalidations != 0 || st.Rejected[ReasonKVGroup] != 0 {
					t.Fatalf("declarations %d, invalidations %d, rejected %v", st.GroupDeclarations, st.Invalidations, st.Rejected)
				}
				if unit, got, ok := e.Groups("w"); !ok || unit != testBS || !slices.Equal(got, decl) {
					t.Fatalf("index holds groups %v (unit %d, %v), want %v", got, unit, ok, decl)
				}
			})
		}
	}
}

// TestHybridWindowAndMambaRules: the reuse rules on a hand-made stream. A sliding
// window's evicted early blocks do not stop a cut; its blocks missing just before the
// cut do; a Mamba state missing at the cut moves the cut back to the last state held.
func TestHybridWindowAndMambaRules(t *testing.T) {
	s, _, _ := diagSub(t, func(c *Config) { c.Groups = GroupFilter{Hybrid: true} })
	f := &feeder{s: s}
	doc := []uint64{1, 2, 3, 1, 2, 3, 1, 2}
	seqs := func(span int) []uint64 {
		var out []uint64
		for end := span; end <= len(doc); end += span {
			out = append(out, blockSeq(doc, end, span))
		}
		return out
	}
	units := func(span int) [][]uint64 {
		var out [][]uint64
		for end := span; end <= len(doc); end += span {
			out = append(out, doc[end-span:end])
		}
		return out
	}
	full, mamba := seqs(1), seqs(2)
	f.send(t, gbatch(
		gev{kind: "stored", group: 0, spec: "full_attention", bs: testBS, seqs: full, units: units(1)},
		// window 5 tokens: a cut needs the one unit block before it (ceil(4/4)).
		gev{kind: "stored", group: 1, spec: "sliding_window", bs: testBS, window: 5, seqs: full, units: units(1)},
		gev{kind: "stored", group: 2, spec: "mamba", bs: 2 * testBS, seqs: mamba, units: units(2)},
	))
	e := s.cfg.Index.(*engine.Engine)
	score := func() int {
		t.Helper()
		if err := e.Barrier(context.Background()); err != nil {
			t.Fatal(err)
		}
		got, err := e.FindMatchesIn(context.Background(), Namespace("m", ""), contents(doc...), nil)
		if err != nil {
			t.Fatal(err)
		}
		if len(got) == 0 {
			return 0
		}
		return got[0].Score
	}
	if got := score(); got != 8 {
		t.Fatalf("every group holds the prompt: score %d, want 8", got)
	}
	// The window group evicts its first five blocks: a cut at 8 needs block 8 only.
	f.send(t, gbatch(gev{kind: "removed", group: 1, seqs: full[:5]}))
	if got := score(); got != 8 {
		t.Fatalf("window's early blocks evicted: score %d, want 8", got)
	}
	// Mamba's state at 8 goes: the cut falls to 6, the last state held, whose window
	// block (6) is there.
	f.send(t, gbatch(gev{kind: "removed", group: 2, seqs: mamba[3:]}))
	if got := score(); got != 6 {
		t.Fatalf("mamba state at 8 evicted: score %d, want 6", got)
	}
	// The window's block 6 goes: a cut at 6 has no window; Mamba's states at 2 and 4
	// remain, and 4's window block (4) was evicted, 2's too: nothing is reusable.
	f.send(t, gbatch(gev{kind: "removed", group: 1, seqs: full[5:6]}))
	if got := score(); got != 0 {
		t.Fatalf("window block before every cut evicted: score %d, want 0", got)
	}
}

// TestHybridLateGroup: a group first seen after the worker holds blocks changes the
// declaration, which drops them: the worker is invalidated, and the resync from
// sequence 0 rebuilds it exactly under the new declaration.
func TestHybridLateGroup(t *testing.T) {
	s, _, fp := diagSub(t, func(c *Config) { c.Groups = GroupFilter{Hybrid: true} })
	doc := []uint64{1, 2, 3, 1}
	var full [][]uint64
	var seqs []uint64
	for end := 1; end <= len(doc); end++ {
		seqs = append(seqs, blockSeq(doc, end, 1))
		full = append(full, doc[end-1:end])
	}
	batches := [][]byte{
		// A model that looks dense: group 0 only, of the unit's size.
		gbatch(gev{kind: "stored", group: 0, spec: "full_attention", bs: testBS, seqs: seqs[:2], units: full[:2]}),
		// Then a window group.
		gbatch(gev{kind: "stored", group: 0, spec: "full_attention", bs: testBS, seqs: seqs[2:], units: full[2:], parent: &seqs[1]},
			gev{kind: "stored", group: 1, spec: "sliding_window", bs: testBS, window: 4, seqs: seqs, units: full}),
	}
	for i, b := range batches {
		fp.add(uint64(i), b)
		sendLive(t, s, uint64(i), b)
		if i == 0 {
			if st := s.Status(); st.GroupDeclarations != 0 || st.Stored != 1 {
				t.Fatalf("dense start: declarations %d, stored %d", st.GroupDeclarations, st.Stored)
			}
			if _, _, ok := s.cfg.Index.(*engine.Engine).Groups("w"); ok {
				t.Fatal("a dense worker was declared")
			}
		}
	}
	st := s.Status()
	if st.GroupDeclarations != 1 || st.Invalidations != 1 || st.State != StateStale {
		t.Fatalf("late group: declarations %d, invalidations %d, state %v; want 1, 1, stale", st.GroupDeclarations, st.Invalidations, st.State)
	}
	if err := s.resync(context.Background()); err != nil {
		t.Fatal(err)
	}
	s.setState()
	s.publish()
	if st := s.Status(); st.State != StateLive || st.Resyncs != 1 || st.GroupDeclarations != 1 {
		t.Fatalf("after resync: state %v, resyncs %d, declarations %d", st.State, st.Resyncs, st.GroupDeclarations)
	}
	m := refmodel.New()
	if err := m.Groups("w", testBS, []oplog.GroupSpec{{Kind: oplog.KindFull, BlockSize: testBS},
		{Kind: oplog.KindSlidingWindow, BlockSize: testBS, Window: 4, HasWindow: true}}); err != nil {
		t.Fatal(err)
	}
	gev{kind: "stored", group: 0, bs: testBS, seqs: seqs, units: full}.apply(m, 0)
	gev{kind: "stored", group: 1, bs: testBS, seqs: seqs, units: full}.apply(m, 1)
	sameAnswers(t, s.cfg.Index.(*engine.Engine), Namespace("m", ""), m, [][]uint64{contents(doc...), contents(1, 2), contents(1, 2, 9)})
}

// TestHybridUnmodelledAndDense: a group of a kind the index has no rule for (cross
// attention) is skipped and counted under its kind, as is a window group that names no
// window; a dense model in hybrid mode is never declared and its blocks ride the
// positional index as without hybrid mode.
func TestHybridUnmodelledAndDense(t *testing.T) {
	s, _, _ := diagSub(t, func(c *Config) { c.Groups = GroupFilter{Hybrid: true} })
	f := &feeder{s: s}
	f.send(t, gbatch(
		gev{kind: "stored", group: 0, spec: "full_attention", bs: testBS, seqs: []uint64{11, 12}, units: [][]uint64{{1}, {2}}},
		gev{kind: "stored", group: 1, spec: "cross_attention", bs: testBS, seqs: []uint64{11}, units: [][]uint64{{1}}},
		gev{kind: "stored", group: 2, spec: "sliding_window", bs: testBS, seqs: []uint64{11}, units: [][]uint64{{1}}},
		gev{kind: "removed", group: 1, seqs: []uint64{11}},
		gev{kind: "removed", group: 7, seqs: []uint64{12}},
	))
	st := s.Status()
	want := []GroupCount{{"cross_attention", 2}, {"sliding_window without a window", 1}, {"group 7", 1}}
	if !slices.Equal(st.Diag.SkippedGroups, want) || st.Rejected[ReasonKVGroup] != 4 {
		t.Fatalf("skipped %v (%d), want %v", st.Diag.SkippedGroups, st.Rejected[ReasonKVGroup], want)
	}
	if st.GroupDeclarations != 0 || st.Stored != 1 {
		t.Fatalf("dense model: declarations %d, stored %d", st.GroupDeclarations, st.Stored)
	}
	e := s.cfg.Index.(*engine.Engine)
	if _, _, ok := e.Groups("w"); ok {
		t.Fatal("a dense model was declared")
	}
	m := refmodel.New()
	_ = m.Stored("w", 0, false, [][2]uint64{{contents(1)[0], 11}, {contents(2)[0], 12}})
	sameAnswers(t, e, Namespace("m", ""), m, [][]uint64{contents(1, 2), contents(1)})
}

// TestHybridResume: a worker restored from a snapshot resumes under the declaration the
// snapshot carries when it is the configuration's (its blocks kept, nothing declared);
// a learned declaration is declared again, which invalidates the restored blocks.
func TestHybridResume(t *testing.T) {
	groups := hybridModels["full+window+mamba"]
	var decl []engine.Group
	for _, g := range groups {
		k, _ := groupKind(g.spec)
		decl = append(decl, engine.Group{Kind: k, BlockSize: g.bs, Window: g.window})
	}
	for _, declared := range []bool{true, false} {
		mod := func(c *Config) {
			c.Groups = GroupFilter{Hybrid: true}
			if declared {
				c.Groups.Declared = decl
			}
		}
		s, _, _ := diagSub(t, mod)
		h := newHybridEngine(rand.New(rand.NewPCG(3, 4)), groups)
		f := &feeder{s: s}
		var b []gev
		for len(b) < len(groups) || b[0].kind != "stored" {
			b = h.request()
		}
		f.send(t, gbatch(b...))
		e := s.cfg.Index.(*engine.Engine)
		if err := e.Barrier(context.Background()); err != nil {
			t.Fatal(err)
		}
		var snap bytes.Buffer
		if err := e.WriteSnapshot(&snap); err != nil {
			t.Fatal(err)
		}
		r, err := engine.RestoreBytes(engine.Config{Shards: 2, JumpSize: 4}, snap.Bytes())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { r.Close() })
		cp, ok := CheckpointAt(r.Positions()["w"])
		if !ok {
			t.Fatal("no checkpoint in the snapshot")
		}
		size := func(x *engine.Engine) int {
			n, _ := x.WorkerSize("w")
			return n
		}
		before := size(r)
		s2, _, _ := diagSub(t, func(c *Config) { mod(c); c.Index = r; c.Resume = &cp })
		sendLive(t, s2, cp.Seq+1, gbatch(h.request()...))
		st := s2.Status()
		if before == 0 || before != size(e) {
			t.Fatalf("restored worker holds %d blocks, the snapshotted one %d", before, size(e))
		}
		if declared {
			if st.GroupDeclarations != 0 || st.Invalidations != 0 || size(r) == 0 {
				t.Fatalf("declared resume: declarations %d, invalidations %d, size before %d", st.GroupDeclarations, st.Invalidations, before)
			}
		} else if st.GroupDeclarations != 1 || st.Invalidations != 1 || st.State != StateStale {
			t.Fatalf("learned resume: declarations %d, invalidations %d", st.GroupDeclarations, st.Invalidations)
		}
	}
}

// TestHybridConfig: hybrid mode needs the unit and refuses a group selection beside it
// and a declaration the index would refuse.
func TestHybridConfig(t *testing.T) {
	base := Config{Endpoint: "tcp://127.0.0.1:1", Worker: "w", Index: nopIdx{}, BlockSize: testBS}
	for name, g := range map[string]GroupFilter{
		"kinds too":      {Hybrid: true, Kinds: []string{"full_attention"}},
		"groups too":     {Hybrid: true, Groups: []int{0}},
		"not a multiple": {Declared: []engine.Group{{Kind: engine.GroupFull, BlockSize: testBS + 1}}},
		"no window":      {Declared: []engine.Group{{Kind: engine.GroupSlidingWindow, BlockSize: testBS}}},
	} {
		c := base
		c.Groups = g
		if _, err := New(c); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	c := base
	c.BlockSize = 0
	c.Groups = GroupFilter{Hybrid: true}
	if _, err := New(c); err == nil {
		t.Error("hybrid without a block size: accepted")
	}
	c = base
	c.Groups = GroupFilter{Declared: []engine.Group{{Kind: engine.GroupFull, BlockSize: testBS}, {Kind: engine.GroupMamba, BlockSize: 4 * testBS}}}
	if _, err := New(c); err != nil {
		t.Errorf("a valid declaration: %v", err)
	}
}
