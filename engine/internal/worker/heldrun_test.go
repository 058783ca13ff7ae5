package worker

import (
	"fmt"
	"math/rand/v2"
	"testing"
)

// TestHeldRun holds HeldRun to its definition on a sparse environment: deep chains
// sharing prefixes of one trunk (branches inside strides and across them, several seqs
// on shared blocks), random removals (holes, unheld blocks kept inside segments until
// compaction, unheld first blocks; on odd seeds whole chains go, which keeps the worker
// gap-free), then, for every chain extended with content no one stored and every anchor
// along it, the run HeldRun reports, by its linear walk and, where the worker has no
// holes, by its bisecting one, is the count of leading positions whose key the worker's
// tables hold, counted from the held keys by brute force. The deltas it queued are, replayed, exactly the held keys at the positions the
// sparse index keeps (Env.Indexed).
func TestHeldRun(t *testing.T) {
	for seed := uint64(1); seed <= 6; seed++ {
		t.Run(fmt.Sprintf("seed=%d", seed), func(t *testing.T) {
			r := rand.New(rand.NewPCG(seed, 91))
			env := testEnv()
			env.Locked = true
			w := New("w", 0)
			o := NewOutbox(env.Shards)
			m := members{}
			w.Lock()
			defer w.Unlock()
			w.SetOutbox(o)
			trunk := make([]uint64, 400)
			for i := range trunk {
				trunk[i] = uint64(r.IntN(3))
			}
			var chains [][]uint64
			var seqs []uint64
			var chainSeqs [][]uint64 // per chain, its seqs (nil once removed whole)
			next := uint64(1)
			for round := range 12 {
				for range 6 {
					cut := r.IntN(len(trunk))
					c := append([]uint64(nil), trunk[:cut]...)
					for range r.IntN(150) {
						c = append(c, uint64(3+r.IntN(3)))
					}
					if len(c) == 0 {
						continue
					}
					chains = append(chains, c)
					blocks := make([]Block, len(c))
					cs := make([]uint64, len(c))
					for i := range c {
						blocks[i] = Block{Content: c[i], Seq: next}
						seqs = append(seqs, next)
						cs[i] = next
						next++
					}
					chainSeqs = append(chainSeqs, cs)
					w.Store(env, Device, 0, Parent{}, blocks)
				}
				var rm []uint64
				if seed%2 == 1 {
					// Whole chains: every block left is held by a chain that holds its
					// ancestors too, so the worker stays gap-free (HeldRun's closed walk).
					for range 1 + r.IntN(3) {
						k := r.IntN(len(chainSeqs))
						rm = append(rm, chainSeqs[k]...)
						chainSeqs[k] = nil
					}
				} else {
					rm = make([]uint64, r.IntN(len(seqs)/3+1))
					for i := range rm {
						rm[i] = seqs[r.IntN(len(seqs))]
					}
				}
				w.Remove(env, Device, rm)
				w.Publish(env)
				if err := w.Check(env, true); err != nil {
					t.Fatalf("round %d: %v", round, err)
				}
				m.drain(t, env, o)
				heldFPs := held(env, w)
				want := 0
				w.keys.each(func(ref uint32) {
					if k := w.keys.key(ref); w.keys.seqs(ref) > 0 && env.Indexed(k.pos) {
						want++
						if !m[w.ID()][env.fingerprint(k)] {
							t.Fatalf("round %d: held key at position %d is no membership", round, k.pos)
						}
					}
				})
				if got := len(m[w.ID()]); got != want {
					t.Fatalf("round %d: %d memberships, %d held keys at indexed positions", round, got, want)
				}
				runs, closedRuns := 0, 0
				for _, c := range chains {
					q := append(append([]uint64(nil), c...), uint64(6+r.IntN(4)))
					pre := make([]uint64, len(q))
					pre[0] = q[0]
					env.Chain.Fill(pre, q, 1)
					for x0 := 0; x0 < len(q); x0 += SparseStride {
						n := 0
						for x0+n < len(q) && heldFPs[env.fingerprint(key{prefix: pre[x0+n], pos: uint32(x0 + n)})] {
							n++
						}
						if got := w.HeldRun(env, 0, x0, pre[x0:], false); got != n {
							t.Fatalf("round %d: chain of %d blocks from %d: HeldRun %d, the tables hold %d", round, len(c), x0, got, n)
						}
						if !w.HasHoles() {
							if got := w.HeldRun(env, 0, x0, pre[x0:], true); got != n {
								t.Fatalf("round %d: chain of %d blocks from %d: closed HeldRun %d, the tables hold %d", round, len(c), x0, got, n)
							}
							closedRuns += n
						}
						runs += n
					}
				}
				if runs == 0 || seed%2 == 1 && closedRuns == 0 {
					t.Fatalf("round %d: no held run to check (%d walked, %d closed)", round, runs, closedRuns)
				}
			}
		})
	}
}
