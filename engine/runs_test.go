package engine_test

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/kvindex/kvindex/engine"
	"github.com/kvindex/kvindex/internal/oplog"
	"github.com/kvindex/kvindex/internal/testsize"
	"github.com/stretchr/testify/require"
)

// TestDifferentialRuns holds the engine to the reference model on histories made of
// long contiguous runs, the shape the trace logs have (almost every removal follows one
// of the same worker, leaf before parent): chains stored in pieces (each piece under the
// last block of the one before), evicted by ranges tail first or head first (leaving
// holes and ghosts), in one removed event per block or one per range, ranges that
// overlap blocks already gone, refills of a hole under fresh engine hashes (so that a key
// is held twice), chains shared by workers (keys with several members), clears, and
// queries of every length, through Apply and through ApplyBatch, on the locked index and
// on sharded engines at the narrowest and the default jump.
func TestDifferentialRuns(t *testing.T) {
	n := testsize.Sized(3000, 1500, 400)
	for _, shards := range []int{0, 1, 3} { // 0: the locked index
		for _, jump := range []int{1, 64} {
			for _, batched := range []bool{false, true} {
				for seed := uint64(1); seed <= 2; seed++ {
					t.Run(fmt.Sprintf("shards=%d/jump=%d/batched=%v/seed=%d", shards, jump, batched, seed), func(t *testing.T) {
						t.Parallel()
						ops := runOps(rand.New(rand.NewPCG(seed, uint64(shards*100+jump))), n)
						cfg := engine.Config{Shards: shards, JumpSize: jump, QueueSize: 8}
						if shards == 0 {
							cfg = engine.Config{LockedIndex: true, JumpSize: jump}
						}
						require.Positive(t, differentialMode(t, cfg, ops, batched))
					})
				}
			}
		}
	}
}

// runHistory generates runOps's histories: per worker and document, the engine hash the
// worker holds each position of the document under (0: none it knows of).
type runHistory struct {
	r    *rand.Rand
	docs [][]uint64
	held map[string][][]uint64
	next uint64
	ops  []oplog.Op
}

// runOps returns n ops over 4 workers and 3 documents of 300 blocks.
func runOps(r *rand.Rand, n int) []oplog.Op {
	h := &runHistory{r: r, held: map[string][][]uint64{}, next: 1}
	for d := 0; d < 3; d++ {
		doc := make([]uint64, 300)
		for i := range doc {
			doc[i] = r.Uint64()%50 + uint64(d)*1000 // repeats inside a document: one content at several positions
		}
		h.docs = append(h.docs, doc)
	}
	for len(h.ops) < n {
		w := fmt.Sprintf("w%d", r.IntN(4))
		if h.held[w] == nil {
			h.held[w] = make([][]uint64, len(h.docs))
			for d := range h.held[w] {
				h.held[w][d] = make([]uint64, 300)
			}
		}
		d := r.IntN(len(h.docs))
		switch x := r.IntN(20); {
		case x < 7:
			h.store(w, d)
		case x < 15:
			h.removeRange(w, d)
		case x < 16:
			h.ops = append(h.ops, oplog.Op{Kind: oplog.Cleared, Worker: w})
			for d := range h.held[w] {
				clear(h.held[w][d])
			}
		default:
			q := h.docs[d][:r.IntN(301)]
			if r.IntN(8) == 0 && len(q) > 0 {
				q = append(append([]uint64(nil), q...), 999_999) // a query past every chain
			}
			h.ops = append(h.ops, oplog.Op{Kind: oplog.Query, Content: q})
		}
	}
	return h.ops
}

// store stores a piece of document d for w: from the root, or under the block before
// its start (held or not: a parent the worker lacks is a rejection, as in the logs),
// in one event or in several pieces each under the last.
func (h *runHistory) store(w string, d int) {
	held := h.held[w][d]
	start := 0
	if h.r.IntN(3) > 0 {
		start = h.r.IntN(300)
	}
	end := min(300, start+1+h.r.IntN(120))
	for start < end {
		cut := min(end, start+1+h.r.IntN(64))
		op := oplog.Op{Kind: oplog.Stored, Worker: w}
		if start > 0 {
			op.Parent, op.HasParent = held[start-1], true
			if op.Parent == 0 {
				op.Parent = h.next + 1_000_000 // not held: the model rejects it too
			}
		}
		for i := start; i < cut; i++ {
			op.Blocks = append(op.Blocks, [2]uint64{h.docs[d][i], h.next})
			h.next++
		}
		h.ops = append(h.ops, op)
		if start == 0 || held[start-1] == op.Parent {
			for i := start; i < cut; i++ {
				held[i] = op.Blocks[i-start][1]
			}
		}
		start = cut
	}
}

// removeRange removes a contiguous range of w's chain of document d, tail first (as
// vLLM evicts) or head first, in one event or one per block; the range may reach past
// what w holds, and some of its hashes may be gone already.
func (h *runHistory) removeRange(w string, d int) {
	held := h.held[w][d]
	start := h.r.IntN(300)
	end := min(300, start+1+h.r.IntN(100))
	var seqs []uint64
	for i := start; i < end; i++ {
		if s := held[i]; s != 0 {
			seqs = append(seqs, s)
			held[i] = 0
		} else if h.r.IntN(4) == 0 {
			seqs = append(seqs, h.next+2_000_000) // never stored: skipped
		}
	}
	if h.r.IntN(4) > 0 { // tail first
		for i, j := 0, len(seqs)-1; i < j; i, j = i+1, j-1 {
			seqs[i], seqs[j] = seqs[j], seqs[i]
		}
	}
	if len(seqs) == 0 {
		return
	}
	if h.r.IntN(2) == 0 {
		h.ops = append(h.ops, oplog.Op{Kind: oplog.Removed, Worker: w, Seqs: seqs})
		return
	}
	for _, s := range seqs {
		h.ops = append(h.ops, oplog.Op{Kind: oplog.Removed, Worker: w, Seqs: []uint64{s}})
	}
}

// TestApplyBatchRunsZeroAllocs holds ApplyBatch of a store and of its eviction, one
// removed event per block and then one event for the rest (the runs whose engine hashes
// it reads ahead), to zero allocations in steady state, on the locked index and on
// shards.
func TestApplyBatchRunsZeroAllocs(t *testing.T) {
	testsize.SkipAllocs(t)
	for _, cfg := range []engine.Config{{LockedIndex: true}, {Shards: 2}} {
		e := newEngine(t, cfg)
		resident := make([]engine.Block, 64)
		for i := range resident {
			resident[i] = engine.Block{Content: uint64(100 + i), Seq: uint64(5000 + i)}
		}
		require.NoError(t, e.Store("w", resident))
		chain := make([]engine.Block, 64)
		seqs := make([]uint64, len(chain))
		for i := range chain {
			chain[i] = engine.Block{Content: uint64(i % 5), Seq: uint64(7 + i)}
			seqs[len(seqs)-1-i] = uint64(7 + i) // tail first
		}
		evs := []engine.Event{{Kind: engine.EventStored, Worker: "w", Blocks: chain}}
		for i := 0; i < 40; i++ {
			evs = append(evs, engine.Event{Kind: engine.EventRemoved, Worker: "w", Seqs: seqs[i : i+1]})
		}
		evs = append(evs, engine.Event{Kind: engine.EventRemoved, Worker: "w", Seqs: seqs[40:]})
		errs := make([]error, 0, len(evs))
		allocs := testing.AllocsPerRun(200, func() {
			errs = e.ApplyBatch(evs, errs[:0])
			for _, err := range errs {
				if err != nil {
					t.Fatal(err)
				}
			}
		})
		require.Zero(t, allocs, "%+v", cfg)
		require.NoError(t, e.Barrier(ctx))
		require.Equal(t, int64(len(resident)), e.Stats().Blocks)
	}
}
