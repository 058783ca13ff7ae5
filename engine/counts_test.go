package engine_test

import (
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kvindex/kvindex/engine"
	"github.com/kvindex/kvindex/internal/oplog"
)

// TestKeyHeldUnderManySeqs holds one key under more engine hashes than a key record
// counts inline (its counts then move to the worker's side table and back), with
// children under several of them and a second key beside it, and checks every query
// against the reference model while the seqs are stored, replaced and removed in random
// order.
func TestKeyHeldUnderManySeqs(t *testing.T) {
	const seqs = 600
	r := rand.New(rand.NewPCG(5, 6))
	var ops []oplog.Op
	query := func() {
		ops = append(ops, oplog.Op{Kind: oplog.Query, Content: []uint64{7, 8, 9}},
			oplog.Op{Kind: oplog.Query, Content: []uint64{7, 1000}})
	}
	for s := uint64(1); s <= seqs; s++ {
		ops = append(ops, oplog.Op{Kind: oplog.Stored, Worker: "w", Blocks: [][2]uint64{{7, s}}})
		if s%50 == 0 {
			// A child and grandchild under this seq of the shared root key.
			ops = append(ops, oplog.Op{Kind: oplog.Stored, Worker: "w", Parent: s, HasParent: true,
				Blocks: [][2]uint64{{8, 10_000 + s}, {9, 20_000 + s}}})
			query()
		}
	}
	ops = append(ops, oplog.Op{Kind: oplog.Stored, Worker: "w", Blocks: [][2]uint64{{7, 30_000}, {1000, 30_001}}})
	query()
	order := r.Perm(seqs)
	for i, j := range order {
		s := uint64(j + 1)
		if i%7 == 3 {
			// Last write wins: the seq moves to another key and back.
			ops = append(ops, oplog.Op{Kind: oplog.Stored, Worker: "w", Blocks: [][2]uint64{{11, s}}},
				oplog.Op{Kind: oplog.Stored, Worker: "w", Blocks: [][2]uint64{{7, s}}})
		}
		ops = append(ops, oplog.Op{Kind: oplog.Removed, Worker: "w", Seqs: []uint64{s}})
		if i%40 == 0 || i > seqs-5 {
			query()
		}
	}
	for _, cfg := range []engine.Config{{LockedIndex: true}, {Shards: 2, JumpSize: 1}} {
		require.Positive(t, differential(t, cfg, ops))
	}
}
