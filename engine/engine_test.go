package engine_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/kvindex/kvindex/engine"
	"github.com/kvindex/kvindex/hash"
	"github.com/kvindex/kvindex/internal/oplog"
	"github.com/kvindex/kvindex/internal/refmodel"
	"github.com/kvindex/kvindex/internal/replay"
	"github.com/kvindex/kvindex/internal/testsize"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var ctx = context.Background()

func newEngine(t testing.TB, cfg engine.Config) *engine.Engine {
	t.Helper()
	e, err := engine.New(cfg)
	require.NoError(t, err)
	t.Cleanup(func() { e.Close() })
	return e
}

func TestConfigValidation(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  engine.Config
		ok   bool
	}{
		{"zero is default", engine.Config{}, true},
		{"explicit", engine.Config{Shards: 3, JumpSize: 7, QueueSize: 2, MaxEventBlocks: 10, QueryQueue: 1}, true},
		{"negative shards", engine.Config{Shards: -1}, false},
		{"too many shards", engine.Config{Shards: engine.MaxShards + 1}, false},
		{"negative jump", engine.Config{JumpSize: -4}, false},
		{"huge jump", engine.Config{JumpSize: engine.MaxJumpSize + 1}, false},
		{"queue not a power of two", engine.Config{QueueSize: 3}, false},
		{"queue of one", engine.Config{QueueSize: 1}, false},
		{"queue too big", engine.Config{QueueSize: engine.MaxQueueSize * 2}, false},
		{"rings too big in total", engine.Config{Shards: 256, QueueSize: engine.MaxQueueSize}, false},
		{"negative max blocks", engine.Config{MaxEventBlocks: -1}, false},
		{"negative query queue", engine.Config{QueryQueue: -1}, false},
		{"huge query queue", engine.Config{QueryQueue: math.MaxInt}, false}, // 1<<40 on 64-bit machines made New die out of memory
		{"query queue past its bound", engine.Config{QueryQueue: engine.MaxQueryQueue + 1}, false},
		{"largest query queue", engine.Config{QueryQueue: engine.MaxQueryQueue}, true},
		{"locked index", engine.Config{LockedIndex: true}, true},
		{"locked index with shards", engine.Config{LockedIndex: true, Shards: 2}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := tc.cfg
			verr := cfg.Validate()
			e, err := engine.New(cfg)
			require.Equal(t, tc.cfg, cfg, "New must not modify the caller's config")
			if !tc.ok {
				require.ErrorIs(t, err, engine.ErrInvalidConfig)
				require.ErrorIs(t, verr, engine.ErrInvalidConfig, "Validate must refuse what New refuses")
				require.Nil(t, e)
				return
			}
			require.NoError(t, err)
			require.NoError(t, verr)
			got := e.Config()
			require.Equal(t, cfg.WithDefaults(), got, "WithDefaults is the configuration New runs")
			require.Positive(t, got.Shards)
			if tc.cfg.JumpSize == 0 {
				require.Equal(t, 64, got.JumpSize)
			}
			require.NoError(t, e.Close())
		})
	}
}

func TestCloseIsIdempotentAndFinal(t *testing.T) {
	e, err := engine.New(engine.Config{Shards: 2})
	require.NoError(t, err)
	require.NoError(t, e.Store("w", []engine.Block{{Content: 1, Seq: 1}}))
	require.NoError(t, e.Close())
	require.NoError(t, e.Close())
	require.ErrorIs(t, e.Store("w", []engine.Block{{Content: 1, Seq: 2}}), engine.ErrClosed)
	require.ErrorIs(t, e.StoreUnder("w", 1, []engine.Block{{Content: 1, Seq: 2}}), engine.ErrClosed)
	require.ErrorIs(t, e.Remove("w", 1), engine.ErrClosed)
	require.ErrorIs(t, e.Clear("w"), engine.ErrClosed)
	require.ErrorIs(t, e.RemoveWorker("w"), engine.ErrClosed)
	require.ErrorIs(t, e.Barrier(ctx), engine.ErrClosed)
	_, err = e.FindMatches(ctx, []uint64{1}, nil)
	require.ErrorIs(t, err, engine.ErrClosed)
}

func TestRejections(t *testing.T) {
	e := newEngine(t, engine.Config{Shards: 2, MaxEventBlocks: 4})
	b := func(c, s uint64) engine.Block { return engine.Block{Content: c, Seq: s} }
	require.NoError(t, e.Store("w", []engine.Block{b(1, 10), b(2, 11)}))
	for _, tc := range []struct {
		name string
		do   func() error
		want error
	}{
		{"empty worker", func() error { return e.Store("", []engine.Block{b(1, 1)}) }, engine.ErrInvalidEvent},
		{"empty worker remove", func() error { return e.Remove("", 1) }, engine.ErrInvalidEvent},
		{"empty worker clear", func() error { return e.Clear("") }, engine.ErrInvalidEvent},
		{"unknown parent", func() error { return e.StoreUnder("w", 99, []engine.Block{b(3, 12)}) }, engine.ErrParentNotFound},
		{"unknown worker with parent", func() error { return e.StoreUnder("x", 10, []engine.Block{b(3, 12)}) }, engine.ErrParentNotFound},
		{"duplicate seq", func() error { return e.Store("w", []engine.Block{b(1, 5), b(2, 5)}) }, engine.ErrInvalidEvent},
		{"seq equals parent", func() error { return e.StoreUnder("w", 10, []engine.Block{b(1, 10)}) }, engine.ErrInvalidEvent},
		{"both faults report parent", func() error { return e.StoreUnder("w", 99, []engine.Block{b(1, 99), b(1, 99)}) }, engine.ErrParentNotFound},
		{"too many blocks", func() error { return e.Store("w", make([]engine.Block, 5)) }, engine.ErrInvalidEvent},
		{"too many seqs", func() error { return e.Remove("w", 1, 2, 3, 4, 5) }, engine.ErrInvalidEvent},
	} {
		t.Run(tc.name, func(t *testing.T) {
			require.ErrorIs(t, tc.do(), tc.want)
		})
	}
	// Nothing changed, nothing became known, and every rejection was counted.
	require.NoError(t, e.Barrier(ctx))
	got, err := e.FindMatches(ctx, []uint64{1, 2}, nil)
	require.NoError(t, err)
	require.Equal(t, []engine.Match{{Worker: "w", Score: 2, Size: 2, Tiers: [3]int{2, 2, 2}}}, got)
	st := e.Stats()
	require.Equal(t, 1, st.Workers)
	require.Equal(t, uint64(3), st.RejectedParentNotFound)
	require.Equal(t, uint64(7), st.RejectedInvalid)
	// An empty store is never an error, even under an unknown parent on an unknown worker.
	require.NoError(t, e.StoreUnder("nobody", 1, nil))
	require.Equal(t, 1, e.Stats().Workers)
}

// TestRejectedStoreLeavesNoTrace: a stored event that fails the duplicate check after
// its first blocks went in (the check runs at the first seq found held: a seq the
// event repeats, or its parent's) leaves the engine as it was: sizes, memberships,
// index entries, digests and answers, on the locked index and on shards. Its blocks
// cross positions the index keeps (below 16 and every 64th), so their deltas are
// queued before the duplicate is found.
func TestRejectedStoreLeavesNoTrace(t *testing.T) {
	for _, cfg := range []engine.Config{{LockedIndex: true}, {Shards: 2}} {
		t.Run(fmt.Sprintf("locked=%v", cfg.LockedIndex), func(t *testing.T) {
			e := newEngine(t, cfg)
			chain := func(from, n uint64) []engine.Block {
				bs := make([]engine.Block, n)
				for i := range bs {
					bs[i] = engine.Block{Content: from + uint64(i), Seq: from + uint64(i)}
				}
				return bs
			}
			require.NoError(t, e.Store("w", chain(1, 100)))
			require.NoError(t, e.Store("v", chain(1, 30)))
			query := make([]uint64, 200)
			for i := range query {
				query[i] = uint64(1 + i)
			}
			state := func() (engine.Stats, map[string]engine.WorkerDigest, []engine.Match) {
				require.NoError(t, e.Barrier(ctx))
				got, err := e.FindMatches(ctx, query, nil)
				require.NoError(t, err)
				st := e.Stats()
				st.Shards, st.Queries, st.QueryRounds, st.QueryProbes, st.RejectedInvalid = nil, 0, 0, 0, 0
				return st, e.Digests(), got
			}
			st0, dg0, got0 := state()
			repeat := chain(101, 80)
			repeat[70].Seq = repeat[5].Seq
			parent := chain(101, 40)
			parent[39].Seq = 100
			root := chain(1001, 20)
			root[19].Seq = 1003
			for name, do := range map[string]func() error{
				"a seq twice":       func() error { return e.StoreUnder("w", 100, repeat) },
				"the parent's seq":  func() error { return e.StoreUnder("w", 100, parent) },
				"a root chain":      func() error { return e.Store("w", root) },
				"on another worker": func() error { return e.StoreUnder("v", 30, repeat) },
			} {
				require.ErrorIs(t, do(), engine.ErrInvalidEvent, name)
				st, dg, got := state()
				require.Equal(t, st0, st, name)
				require.Equal(t, dg0, dg, name)
				require.Equal(t, got0, got, name)
			}
			// The same blocks without the duplicate go in.
			repeat[70].Seq = 5000
			require.NoError(t, e.StoreUnder("w", 100, repeat))
			st, _, _ := state()
			require.Equal(t, st0.Blocks+80, st.Blocks)
		})
	}
}

// TestDifferential replays long random histories on the engine and on the reference
// model, comparing every query after a barrier, for several jump sizes and shard counts.
func TestDifferential(t *testing.T) {
	n := testsize.Sized(6000, 2000, 500) // full size in the plain build (make test's plain-index) or in make test-long
	if testing.Short() && n > 2000 {
		n = 2000
	}
	for si, shards := range []int{0, 1, 2, 3} { // 0: the LockedIndex baseline
		for ji, jump := range []int{1, 3, 64} {
			for seed := uint64(1); seed <= 3; seed++ {
				if !latinCell(si, ji, seed) {
					continue
				}
				t.Run(fmt.Sprintf("shards=%d/jump=%d/seed=%d", shards, jump, seed), func(t *testing.T) {
					t.Parallel()
					r := rand.New(rand.NewPCG(seed, uint64(jump)))
					opt := refmodel.RandomOptions{Alphabet: int(2 + seed), MaxChain: []int{20, 150, 300}[seed-1]}
					ops := refmodel.RandomOps(r, n, opt)
					cfg := engine.Config{Shards: shards, JumpSize: jump, QueueSize: 4}
					if shards == 0 {
						cfg = engine.Config{LockedIndex: true, JumpSize: jump}
					}
					cfg.SpecChain = seed == 2 // both prefix chains at every shard count and jump
					// Both dense prefixes (the engine picks one from its recent queries).
					dense := []int{16, 8, 16}[seed-1]
					require.Positive(t, differential(t, cfg, ops, func(e *engine.Engine) { engine.SetDenseLandings(e, dense) }))
				})
			}
		}
	}
}

// TestDifferentialDeepFleet holds jump search to the model on a fleet that shares one
// long chain to many depths (around each wave's end, 1,024 and 4,096 with the default
// stride), with a worker whose chain has a hole, one that diverges, and queries of many
// lengths, on sharded engines that send their next wave early or not.
func TestDifferentialDeepFleet(t *testing.T) {
	h := newChainHistory(5000, 7)
	for i, depth := range []int{1000, 1024, 1025, 1030, 1500, 2100, 4096, 4097, 5000} {
		h.store(fmt.Sprintf("w%d", i), h.content[:depth])
	}
	h.store("gappy", h.content[:3000])
	h.remove("gappy", 1700)
	diverged := append([]uint64(nil), h.content[:2500]...)
	diverged[1200]++
	h.store("diverged", diverged)
	h.query(1, 900, 1025, 1026, 1100, 1701, 2050, 3000, 4097, 4098, 5000)
	ops := h.ops
	// Under the invariant checks (each event recounts its worker's 5,000-block chain) the
	// corners are enough: one and several shards, the narrowest and the default jump.
	shardCounts, jumps := testsize.Sized([]int{1, 2, 3}, []int{1, 2, 3}, []int{1, 3}), testsize.Sized([]int{1, 3, 64}, []int{1, 3, 64}, []int{1, 64})
	for si, shards := range shardCounts {
		for ji, jump := range jumps {
			for _, early := range []bool{false, true} {
				// Under the checks, half of them: each pair of shard count, jump and
				// early or not still meets once (an orthogonal array of four runs).
				if checkedSparse && early != ((si+ji)%2 == 1) {
					continue
				}
				t.Run(fmt.Sprintf("shards=%d/jump=%d/early=%v", shards, jump, early), func(t *testing.T) {
					t.Parallel()
					cfg := engine.Config{Shards: shards, JumpSize: jump}
					require.Positive(t, differential(t, cfg, ops, func(e *engine.Engine) { engine.SetSpeculation(e, early) }))
				})
			}
		}
	}
}

// chainHistory builds a history over one long chain for the differential tests: content
// is the chain's content hashes, and the ops store prefixes of it (or variants), remove
// single blocks and query prefixes. Every store names its blocks' engine hashes by
// position + 1.
type chainHistory struct {
	content []uint64
	ops     []oplog.Op
}

func newChainHistory(n int, salt uint64) *chainHistory {
	h := &chainHistory{content: make([]uint64, n)}
	for i := range h.content {
		h.content[i] = uint64(i)*0x9e3779b97f4a7c15 + salt
	}
	return h
}

func (h *chainHistory) store(w string, c []uint64) {
	blocks := make([][2]uint64, len(c))
	for i := range c {
		blocks[i] = [2]uint64{c[i], uint64(i + 1)}
	}
	h.ops = append(h.ops, oplog.Op{Kind: oplog.Stored, Worker: w, Blocks: blocks})
}

// remove removes the block w stored at position pos.
func (h *chainHistory) remove(w string, pos int) {
	h.ops = append(h.ops, oplog.Op{Kind: oplog.Removed, Worker: w, Seqs: []uint64{uint64(pos + 1)}})
}

// query asks for the chain's prefixes of the given lengths.
func (h *chainHistory) query(lengths ...int) {
	for _, l := range lengths {
		h.ops = append(h.ops, oplog.Op{Kind: oplog.Query, Content: h.content[:l]})
	}
}

// TestDifferentialEveryDepth holds the scoring of a drop inside a stride to the model
// for every depth: workers hold one shared chain to each depth from 1 to 200, one more
// holds it with a hole (so that the locked index takes jump search too), and queries of
// several lengths ask for all of them; round 2 (and, where it runs, narrow's coarse
// round) must find each worker's first missed position wherever it falls in its stride.
func TestDifferentialEveryDepth(t *testing.T) {
	const n = 200
	h := newChainHistory(n, 11)
	for d := 1; d <= n; d++ {
		h.store(fmt.Sprintf("d%03d", d), h.content[:d])
	}
	h.store("gappy", h.content)
	h.remove("gappy", 150)
	// A hole at a position that narrow probes for the workers dropping out in (128, 192]
	// (every 8th from 136): round 2 must read it from that probe, not scan past it.
	h.store("gappy144", h.content)
	h.remove("gappy144", 144)
	h.query(n, 129, 100, 65)
	ops := h.ops
	cfgs := []engine.Config{{LockedIndex: true}, {Shards: 1}, {Shards: 2}, {Shards: 1, JumpSize: 16}, {LockedIndex: true, JumpSize: 128}}
	cfgs = cfgs[:testsize.Sized(5, 5, 3)] // under the invariant checks: the default jump only
	for _, cfg := range cfgs {
		t.Run(fmt.Sprintf("locked=%v/shards=%d/jump=%d", cfg.LockedIndex, cfg.Shards, cfg.JumpSize), func(t *testing.T) {
			t.Parallel()
			require.Positive(t, differential(t, cfg, ops))
		})
	}
}

// TestDifferentialGallopHints holds gallop's scores to the model wherever bisect's hint
// (the score of the previous query's largest group) falls: right, one off, inside or
// outside the stride being bisected, and a probe that every candidate holds or that none
// does. Gap-free workers only (gallop, not the walk): one at each of a sparse set of
// depths, and groups at a few more, each group larger than the ones before it, so that
// once it is stored the full-length query makes its depth the hint for the queries after
// it, whose lengths put that depth in every part of a stride; queries along a second
// chain, held to other depths, meet each hint where no candidate scores it.
func TestDifferentialGallopHints(t *testing.T) {
	const n = 200
	h := newChainHistory(n, 13)
	for _, d := range []int{1, 2, 3, 5, 8, 13, 21, 34, 55, 89, 144, n} {
		h.store(fmt.Sprintf("d%03d", d), h.content[:d])
	}
	other := newChainHistory(n, 17)
	for _, d := range []int{3, 10, 19, 30, 60, 150} {
		h.store(fmt.Sprintf("other%03d", d), other.content[:d])
	}
	for k, g := range []int{7, 8, 9, 20, 23, 24, 57, 100, 199} {
		for i := range k + 2 {
			h.store(fmt.Sprintf("g%03d-%d", g, i), h.content[:g])
		}
		h.query(n, g+1, 129, 100, 25, 21, 9, 8, g, g-1, n)
		for _, l := range []int{n, 18, 31, 61, 151, 6} {
			h.query(n)
			h.ops = append(h.ops, oplog.Op{Kind: oplog.Query, Content: other.content[:l]})
		}
	}
	ops := h.ops
	for _, cfg := range []engine.Config{{LockedIndex: true}, {Shards: 1}, {LockedIndex: true, JumpSize: 4}} {
		t.Run(fmt.Sprintf("locked=%v/shards=%d/jump=%d", cfg.LockedIndex, cfg.Shards, cfg.JumpSize), func(t *testing.T) {
			t.Parallel()
			require.Positive(t, differential(t, cfg, ops))
		})
	}
}

// TestDifferentialTiers is TestDifferential over histories with host and disk events:
// stores and removals per tier, copies of held blocks to other tiers under parents held
// elsewhere. Every answer's per-tier lengths are compared.
func TestDifferentialTiers(t *testing.T) {
	n := testsize.Sized(6000, 2000, 500) // full size in the plain build (make test's plain-index) or in make test-long
	if testing.Short() && n > 2000 {
		n = 2000
	}
	for si, shards := range []int{0, 1, 2, 3} {
		for ji, jump := range []int{1, 3, 64} {
			for seed := uint64(1); seed <= 3; seed++ {
				if !latinCell(si, ji, seed) {
					continue
				}
				t.Run(fmt.Sprintf("shards=%d/jump=%d/seed=%d", shards, jump, seed), func(t *testing.T) {
					t.Parallel()
					r := rand.New(rand.NewPCG(seed, uint64(jump)+100))
					opt := refmodel.RandomOptions{Alphabet: int(2 + seed), MaxChain: []int{20, 150, 300}[seed-1], Tiers: true}
					ops := refmodel.RandomOps(r, n, opt)
					cfg := engine.Config{Shards: shards, JumpSize: jump, QueueSize: 4}
					if shards == 0 {
						cfg = engine.Config{LockedIndex: true, JumpSize: jump}
					}
					cfg.SpecChain = seed == 2 // both prefix chains at every shard count and jump
					require.Positive(t, differential(t, cfg, ops))
				})
			}
		}
	}
}

// checkedSparse: under the invariant checks (make test's race-invariants phase, where each
// event recounts its worker's tables) the differentials' matrices run a covering subset;
// the plain build (make test's plain-index) and make test-long run every cell.
var checkedSparse = testsize.Sized(false, false, true)

// latinCell reports whether the differentials' cell of shard count si (of 4), jump ji
// (of 3) and seed (1-3) runs: every cell in full, and under checkedSparse the 12 of 36
// where seed = 1 + (si+ji) mod 3, a Latin rectangle in which every shard count meets
// every jump once and every seed at each of them.
func latinCell(si, ji int, seed uint64) bool {
	return !checkedSparse || seed == 1+uint64((si+ji)%3)
}

// differential applies ops to a fresh engine and to the reference model, checks every
// query and rejection, and returns how many queries it compared.
func differential(t *testing.T, cfg engine.Config, ops []oplog.Op, setup ...func(*engine.Engine)) int {
	return differentialMode(t, cfg, ops, false, setup...)
}

// differentialMode is differential; with batched set, the events between two queries go
// through one ApplyBatch call.
func differentialMode(t *testing.T, cfg engine.Config, ops []oplog.Op, batched bool, setup ...func(*engine.Engine)) int {
	t.Helper()
	n, _ := differentialSteps(t, cfg, refmodel.Steps(ops), batched, setup...)
	return n
}

// differentialSteps is differentialMode over a history with predictions and clock
// advances: the engine runs on a fake clock that the steps advance, with the model's
// prediction limits; setup runs on the engine before the first step. It returns how many
// queries it compared and how many matches had a predicted part.
func differentialSteps(t *testing.T, cfg engine.Config, steps []refmodel.Step, batched bool, setup ...func(*engine.Engine)) (queries, predicted int) {
	t.Helper()
	var clock time.Duration
	base := time.Unix(1_000_000, 0)
	cfg.Clock = func() time.Time { return base.Add(clock) }
	e := newEngine(t, cfg)
	for _, f := range setup {
		f(e)
	}
	m := refmodel.New()
	m.PredictionsPerWorker, m.PredictedBlocks, m.PredictionTTL = cfg.PredictionsPerWorker, cfg.PredictedBlocks, cfg.PredictionTTL
	var got, byPrefix []engine.Match
	var prefixes []uint64
	var pending []engine.Event
	var pendingOps []int
	var errs []error
	flushBatch := func() {
		errs = e.ApplyBatch(pending, errs[:0])
		require.Len(t, errs, len(pending))
		for k, i := range pendingOps {
			werr := m.ApplyStep(&steps[i])
			checkRejection(t, i, werr, errs[k])
		}
		pending, pendingOps = pending[:0], pendingOps[:0]
	}
	for i := range steps {
		st := &steps[i]
		op := &st.Op
		event := st.Predict == nil && st.Advance == 0 && op.Kind != oplog.Query
		if batched && event {
			pending = append(pending, replay.Event(op))
			pendingOps = append(pendingOps, i)
			continue
		}
		if batched {
			flushBatch()
		}
		switch {
		case st.Predict != nil:
			checkRejection(t, i, m.ApplyStep(st), e.Predict(ctx, st.Predict.Worker, "", st.Predict.Content, st.Predict.TTL))
			continue
		case st.Advance > 0:
			m.ApplyStep(st)
			clock += st.Advance
			continue
		}
		if op.Kind == oplog.Query {
			require.NoError(t, e.Barrier(ctx))
			var err error
			got, err = e.FindMatches(ctx, op.Content, got[:0])
			require.NoError(t, err)
			want := m.Query(op.Content)
			require.Equal(t, len(want), len(got), "op %d: query %v\nwant %v\ngot  %v", i, op.Content, want, got)
			for j := range want {
				require.Equal(t, want[j], refmodel.Answer(got[j]), "op %d: query %v", i, op.Content)
				if got[j].Predicted > 0 {
					predicted++
				}
			}
			if cfg.SpecChain { // the same query by its rolling hashes answers the same
				prefixes = hash.Prefixes(prefixes[:0], op.Content)
				byPrefix, err = e.FindMatchesByPrefix(ctx, prefixes, byPrefix[:0])
				require.NoError(t, err)
				require.Equal(t, got, byPrefix, "op %d: query %v by its prefix hashes", i, op.Content)
			}
			queries++
			continue
		}
		werr := m.ApplyStep(st)
		checkRejection(t, i, werr, applyOp(e, op))
	}
	if batched {
		flushBatch()
	}
	require.NoError(t, e.Barrier(ctx))
	st := e.Stats()
	require.Equal(t, int64(m.Blocks()), st.Blocks)
	require.Equal(t, len(m.Workers()), st.Workers)
	return queries, predicted
}

func checkRejection(t *testing.T, i int, werr, gerr error) {
	t.Helper()
	require.Equal(t, werr != nil, engine.IsRejection(gerr), "op %d: IsRejection(%v)", i, gerr)
	switch {
	case errors.Is(werr, refmodel.ErrParentNotFound):
		require.ErrorIs(t, gerr, engine.ErrParentNotFound, "op %d", i)
	case errors.Is(werr, refmodel.ErrInvalidEvent):
		require.ErrorIs(t, gerr, engine.ErrInvalidEvent, "op %d", i)
	default:
		require.NoError(t, gerr, "op %d", i)
	}
}

// TestDifferentialBatched is TestDifferential through ApplyBatch.
func TestDifferentialBatched(t *testing.T) {
	for _, shards := range []int{1, 3} {
		for _, jump := range []int{1, 64} {
			for seed := uint64(1); seed <= 2; seed++ {
				t.Run(fmt.Sprintf("shards=%d/jump=%d/seed=%d", shards, jump, seed), func(t *testing.T) {
					t.Parallel()
					ops := refmodel.RandomOps(rand.New(rand.NewPCG(seed, 99)), testsize.Sized(3000, 1500, 1000), refmodel.RandomOptions{MaxChain: 80})
					require.Positive(t, differentialMode(t, engine.Config{Shards: shards, JumpSize: jump, QueueSize: 4}, ops, true))
				})
			}
		}
	}
}

// applyOp applies one non-query op.
func applyOp(e *engine.Engine, op *oplog.Op) error {
	ev := replay.Event(op)
	return e.Apply(&ev)
}

// FuzzEngine decodes fuzz bytes into a small event history and checks the engine
// against the reference model after every query.
// TestRandomByteHistories runs the fuzz target's decoder over seeded random bytes, so the
// tiny-alphabet histories are exercised on every run, not only while fuzzing.
func TestRandomByteHistories(t *testing.T) {
	r := rand.New(rand.NewPCG(9, 9))
	for i := 0; i < testsize.Sized(5000, 2000, 500); i++ {
		b := make([]byte, r.IntN(64))
		for j := range b {
			b[j] = byte(r.Uint32())
		}
		differentialSteps(t, engine.Config{Shards: 2, JumpSize: 1 + i%8, QueueSize: 2, PredictionsPerWorker: 2, PredictedBlocks: 8}, stepsFromBytes(b), false)
	}
}

func FuzzEngine(f *testing.F) {
	f.Add([]byte{0, 1, 2, 3, 4, 5, 6, 7, 8, 9}, uint8(3))
	f.Add([]byte{0, 0, 0, 1, 1, 1, 40, 41, 42, 200, 201, 9, 9, 9}, uint8(1))
	f.Add([]byte{0, 0, 0, 1, 1, 1, 40, 41, 42, 200, 201, 9, 9, 9}, uint8(1|1<<3))
	f.Add([]byte{0, 0, 0, 1, 1, 1, 40, 41, 42, 200, 201, 9, 9, 9}, uint8(7|2<<3))
	f.Fuzz(func(t *testing.T, data []byte, jump uint8) {
		// jump's bits: 0-2 the jump size, 3-4 the layout (2 shards, 1 shard, the locked
		// index, 3 shards: one shard and the locked index narrow wide strides), 5 a
		// fixed dense prefix of 8, 6 SPEC's chain, 7 batched events.
		cfg := engine.Config{Shards: []int{2, 1, 0, 3}[jump>>3&3], LockedIndex: jump>>3&3 == 2, JumpSize: 1 + int(jump%8),
			QueueSize: 2, PredictionsPerWorker: 2, PredictedBlocks: 8, SpecChain: jump&0x40 != 0}
		differentialSteps(t, cfg, stepsFromBytes(data), jump&0x80 != 0, func(e *engine.Engine) {
			if jump&0x20 != 0 {
				engine.SetDenseLandings(e, 8)
			}
		})
	})
}

// stepsFromBytes maps bytes to steps over a tiny space of workers, contents and seqs, so
// that collisions of every kind are likely: events, queries, predictions (of w0, w1 and
// p, which sends no events; at most two per worker and eight blocks in all) and clock
// advances.
func stepsFromBytes(data []byte) []refmodel.Step {
	var ops []refmodel.Step
	next := func() byte {
		if len(data) == 0 {
			return 0
		}
		b := data[0]
		data = data[1:]
		return b
	}
	for len(data) > 0 {
		b := next()
		w := fmt.Sprintf("w%d", b&1)
		tier := (b >> 1) & 3 // bits 1-2: the tier of a store or removal (3: device)
		if tier == 3 {
			tier = 0
		}
		switch b >> 5 {
		case 0, 1, 2:
			n := int(next()%6) + 1
			op := oplog.Op{Kind: oplog.Stored, Worker: w, Tier: tier}
			if p := next(); p%3 != 0 {
				op.Parent, op.HasParent = uint64(p%12), true
			}
			for i := 0; i < n; i++ {
				x := next()
				op.Blocks = append(op.Blocks, [2]uint64{uint64(x % 3), uint64(x>>2) % 12})
			}
			ops = append(ops, refmodel.Step{Op: op})
		case 3, 4:
			ops = append(ops, refmodel.Step{Op: oplog.Op{Kind: oplog.Removed, Worker: w, Tier: tier, Seqs: []uint64{uint64(next() % 12)}}})
		case 5:
			switch {
			case b&8 != 0:
				ops = append(ops, refmodel.Step{Op: oplog.Op{Kind: oplog.Copied, Worker: w, Tier: 1 + (b>>4)&1, Seqs: []uint64{uint64(next() % 12)}}})
			case b&2 == 0:
				ops = append(ops, refmodel.Step{Op: oplog.Op{Kind: oplog.Cleared, Worker: w}})
			default:
				ops = append(ops, refmodel.Step{Op: oplog.Op{Kind: oplog.RemoveWorker, Worker: w}})
			}
		case 7:
			if b&2 == 0 {
				ops = append(ops, refmodel.Step{Advance: time.Duration(1+next()%3) * time.Millisecond})
				continue
			}
			if b&4 != 0 {
				w = "p"
			}
			c := make([]uint64, int(next()%6))
			for i := range c {
				c[i] = uint64(next() % 3)
			}
			ttl := time.Duration(next()%4) * time.Millisecond // 0: the default TTL
			ops = append(ops, refmodel.Step{Predict: &refmodel.Prediction{Worker: w, Content: c, TTL: ttl}})
		default:
			n := int(next() % 10)
			q := make([]uint64, n)
			for i := range q {
				q[i] = uint64(next() % 3)
			}
			ops = append(ops, refmodel.Step{Op: oplog.Op{Kind: oplog.Query, Content: q}})
		}
	}
	return ops
}

func TestFindMatchesZeroAllocs(t *testing.T) {
	testsize.SkipAllocs(t)
	// Two shards; one, which narrows wide strides before round 2; and the locked index.
	// Each also by prefix hashes on the spec chain (FindMatchesByPrefix).
	for _, cfg := range []engine.Config{{Shards: 2, JumpSize: 8}, {Shards: 1, JumpSize: 64}, {LockedIndex: true, JumpSize: 64},
		{Shards: 2, JumpSize: 8, SpecChain: true}, {Shards: 1, JumpSize: 64, SpecChain: true}, {LockedIndex: true, JumpSize: 64, SpecChain: true}} {
		t.Run(fmt.Sprintf("locked=%v/shards=%d/byprefix=%v", cfg.LockedIndex, cfg.Shards, cfg.SpecChain), func(t *testing.T) { testFindMatchesZeroAllocs(t, cfg) })
	}
}

func testFindMatchesZeroAllocs(t *testing.T, cfg engine.Config) {
	e := newEngine(t, cfg)
	chain := make([]engine.Block, 200)
	q := make([]uint64, 200)
	for i := range chain {
		chain[i] = engine.Block{Content: uint64(i), Seq: uint64(1000 + i)}
		q[i] = uint64(i)
	}
	for w := 0; w < 8; w++ {
		require.NoError(t, e.Store(fmt.Sprintf("w%d", w), chain[:50+20*w]))
	}
	require.NoError(t, e.Remove("w3", 1010)) // a gap, so round 2 runs too
	require.NoError(t, e.Barrier(ctx))
	find := e.FindMatches
	if cfg.SpecChain {
		q, find = hash.Prefixes(nil, q), e.FindMatchesByPrefix
	}
	// queryAllocs checks that a query answering want matches allocates nothing.
	queryAllocs := func(want int) {
		t.Helper()
		dst := make([]engine.Match, 0, 2*want)
		allocs := testing.AllocsPerRun(200, func() {
			var err error
			dst, err = find(ctx, q, dst[:0])
			if err != nil {
				t.Fatal(err)
			}
		})
		require.Len(t, dst, want)
		require.Zero(t, allocs)
	}
	queryAllocs(8)
	// An answer of more than 12 matches is sorted through the pooled query's keys.
	for w := 8; w < 20; w++ {
		require.NoError(t, e.Store(fmt.Sprintf("http://10.0.0.%d:8000", w), chain[:5+w]))
	}
	require.NoError(t, e.Barrier(ctx))
	queryAllocs(20)
}

func TestEventZeroAllocsSteadyState(t *testing.T) {
	testsize.SkipAllocs(t)
	e := newEngine(t, engine.Config{Shards: 2})
	chain := make([]engine.Block, 32)
	seqs := make([]uint64, 32)
	for i := range chain {
		chain[i] = engine.Block{Content: uint64(i % 5), Seq: uint64(7 + i)}
		seqs[i] = uint64(7 + i)
	}
	require.NoError(t, e.Store("resident", chain))
	// The worker keeps resident blocks, so its tables stay at their steady-state size.
	resident := make([]engine.Block, 64)
	for i := range resident {
		resident[i] = engine.Block{Content: uint64(100 + i), Seq: uint64(5000 + i)}
	}
	require.NoError(t, e.Store("w", resident))
	allocs := testing.AllocsPerRun(200, func() {
		if err := e.Store("w", chain); err != nil {
			t.Fatal(err)
		}
		if err := e.Remove("w", seqs[:16]...); err != nil {
			t.Fatal(err)
		}
		// One hash per call, as vLLM evicts: the variadic slice must stay on the stack.
		for _, s := range seqs[16:] {
			if err := e.Remove("w", s); err != nil {
				t.Fatal(err)
			}
		}
	})
	require.Zero(t, allocs)
}

// TestBarrierThenStatsAndQuery checks, after every event, that a Barrier makes the
// event visible to a query and to the counters the shards publish (Memberships), at
// several shard counts: the barrier's fast path (every shard already caught up) must
// give what its token path gives.
func TestBarrierThenStatsAndQuery(t *testing.T) {
	for _, shards := range []int{1, 2, 4} {
		e := newEngine(t, engine.Config{Shards: shards})
		r := rand.New(rand.NewPCG(uint64(shards), 9))
		next := uint64(1)
		for i := 0; i < 300; i++ {
			w := fmt.Sprintf("w%d", i%5)
			n := 1 + r.IntN(8)
			blocks := make([]engine.Block, n)
			content := make([]uint64, n)
			for j := range blocks {
				blocks[j] = engine.Block{Content: next, Seq: next}
				content[j] = next
				next++
			}
			require.NoError(t, e.Store(w, blocks))
			if i%7 == 3 {
				require.NoError(t, e.Remove(w, blocks[n-1].Seq))
				n--
			}
			require.NoError(t, e.Barrier(ctx))
			st := e.Stats()
			require.Equal(t, st.Blocks, st.Memberships, "event %d, %d shards", i, shards)
			got, err := e.FindMatches(ctx, content, nil)
			require.NoError(t, err)
			if n == 0 {
				require.Empty(t, got)
				continue
			}
			require.Len(t, got, 1)
			require.Equal(t, w, got[0].Worker)
			require.Equal(t, n, got[0].Score)
		}
	}
}

// TestStatsCounters checks the event counters, through single calls and through one
// ApplyBatch, after the calls return (no Barrier: these counters belong to the caller's
// side).
func TestStatsCounters(t *testing.T) {
	b := func(c, s uint64) engine.Block { return engine.Block{Content: c, Seq: s} }
	evs := []engine.Event{
		{Kind: engine.EventStored, Worker: "a", Blocks: []engine.Block{b(1, 1), b(2, 2)}},                    // accepted
		{Kind: engine.EventStored, Worker: "a", Parent: 9, HasParent: true, Blocks: []engine.Block{b(3, 3)}}, // parent not found
		{Kind: engine.EventStored, Worker: "a", Blocks: []engine.Block{b(4, 4), b(5, 4)}},                    // invalid: seq twice
		{Kind: engine.EventRemoved, Worker: "a", Seqs: []uint64{2, 7, 8}},                                    // accepted, 2 skipped
		{Kind: engine.EventRemoved, Worker: "ghost", Seqs: []uint64{1, 2, 3}},                                // unknown worker: 3 skipped
		{Kind: engine.EventStored, Worker: "b", Blocks: []engine.Block{b(1, 1)}},                             // accepted
		{Kind: engine.EventCleared, Worker: "b"},                                                             // accepted
		{Kind: engine.EventRemoveWorker, Worker: "b"},                                                        // accepted
		{Kind: engine.EventStored, Worker: "a", Parent: 1, HasParent: true, Blocks: []engine.Block{b(6, 6)}}, // accepted
	}
	check := func(t *testing.T, e *engine.Engine) {
		st := e.Stats()
		require.Equal(t, uint64(6), st.Events)
		require.Equal(t, uint64(5), st.SkippedRemovals)
		require.Equal(t, uint64(1), st.RejectedParentNotFound)
		require.Equal(t, uint64(1), st.RejectedInvalid)
		require.Equal(t, int64(2), st.Blocks)
		require.Equal(t, 1, st.Workers)
	}
	// The locked index counts under its write lock (plain words), the shards' engine
	// with atomics: both ways.
	for _, cfg := range []engine.Config{{Shards: 2}, {LockedIndex: true}} {
		name := "shards"
		if cfg.LockedIndex {
			name = "locked"
		}
		t.Run(name+"/Apply", func(t *testing.T) {
			e := newEngine(t, cfg)
			for i := range evs {
				_ = e.Apply(&evs[i])
			}
			check(t, e)
		})
		t.Run(name+"/ApplyBatch", func(t *testing.T) {
			e := newEngine(t, cfg)
			errs := e.ApplyBatch(evs, nil)
			require.Len(t, errs, len(evs))
			check(t, e)
		})
	}
}

// TestDifferentialPredictions replays random histories with predictions (confirmed,
// contradicted, expired, refreshed and evicted by both bounds, for event workers and for
// one that sends no events) on the engine and on the reference model.
func TestDifferentialPredictions(t *testing.T) {
	n := testsize.Sized(4000, 1500, 400) // full size in the plain build (make test's plain-index) or in make test-long
	if testing.Short() && n > 1500 {
		n = 1500
	}
	for _, shards := range []int{0, 1, 3} {
		for _, batched := range []bool{false, true} {
			for seed := uint64(1); seed <= 3; seed++ {
				t.Run(fmt.Sprintf("shards=%d/batched=%v/seed=%d", shards, batched, seed), func(t *testing.T) {
					t.Parallel()
					r := rand.New(rand.NewPCG(seed, 77))
					steps := refmodel.RandomSteps(r, n, refmodel.RandomOptions{Alphabet: int(2 + seed), MaxChain: 40})
					cfg := engine.Config{Shards: shards, JumpSize: 4, QueueSize: 4,
						PredictionsPerWorker: int(seed), PredictedBlocks: []int{30, 200, 1 << 20}[seed-1]}
					cfg.SpecChain = seed != 1 // and by prefix hashes (differentialSteps)
					if shards == 0 {
						cfg.Shards, cfg.LockedIndex = 1, true
					}
					queries, predicted := differentialSteps(t, cfg, steps, batched)
					require.Positive(t, queries)
					require.Positive(t, predicted)
					t.Logf("%d queries, %d matches with a predicted part", queries, predicted)
				})
			}
		}
	}
}

// TestLockedBatchesCountIndexChanges: on the locked index a flush hands the shard a
// batch only when its events changed the index, so Stats' Batches and Applied count the
// index's changes; a removal of a block inside a stride (no key of the sparse index)
// adds none.
func TestLockedBatchesCountIndexChanges(t *testing.T) {
	e := newEngine(t, engine.Config{LockedIndex: true})
	blocks := make([]engine.Block, 20) // positions 0-19: the head's 16 keys change the index
	for i := range blocks {
		blocks[i] = engine.Block{Content: uint64(100 + i), Seq: uint64(1 + i)}
	}
	require.NoError(t, e.Store("a", blocks))
	sh := e.Stats().Shards[0]
	require.Equal(t, uint64(1), sh.Batches)
	require.Equal(t, uint64(16), sh.Applied)
	for seq := uint64(20); seq > 16; seq-- { // positions 19 down to 16: no key of the index
		require.NoError(t, e.Remove("a", seq))
	}
	sh = e.Stats().Shards[0]
	require.Equal(t, uint64(1), sh.Batches)
	require.Equal(t, uint64(16), sh.Applied)
	require.NoError(t, e.Remove("a", 16)) // position 15, the head's last key
	sh = e.Stats().Shards[0]
	require.Equal(t, uint64(2), sh.Batches)
	require.Equal(t, uint64(17), sh.Applied)
}
