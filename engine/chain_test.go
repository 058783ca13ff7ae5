package engine

import (
	"context"
	"fmt"
	"github.com/kvindex/kvindex/engine/internal/chain"
	"math/rand/v2"
	"testing"

	"github.com/kvindex/kvindex/hash"
	"github.com/kvindex/kvindex/internal/table"
	"github.com/stretchr/testify/require"
)

// TestChainFillIsSteps: fill (the query's loop, split at the precomputed multipliers)
// equals step applied position by position, for both chains, across chain.TableMax, from
// any starting position; the spec chain is SPEC's hash.Next.
func TestChainFillIsSteps(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	content := make([]uint64, chain.TableMax+300)
	for i := range content {
		content[i] = r.Uint64()
	}
	for _, spec := range []bool{false, true} {
		c := chain.New(spec, table.SeedFrom(7))
		want := make([]uint64, len(content))
		want[0] = content[0]
		for i := 1; i < len(want); i++ {
			want[i] = c.Step(want[i-1], content[i], uint32(i))
			if spec {
				require.Equal(t, hash.Next(want[i-1], content[i]), want[i])
			}
		}
		for _, from := range []int{1, 2, 63, chain.TableMax - 1, chain.TableMax, chain.TableMax + 1, len(content) - 1} {
			got := make([]uint64, len(content))
			copy(got[:from], want[:from])
			c.Fill(got, content, from)
			require.Equal(t, want, got, "spec=%v from=%d", spec, from)
		}
	}
}

// TestChainCollisions looks for two distinct sequences of content hashes with the same
// prefix word at the same position under the keyed chain, over families an additive
// chain could be weak on: one position changed; two positions changed by the same xor
// difference (a top-bit flip adds 2^63, so in any chain that is linear mod 2^64 two of
// them cancel); two contents swapped; contents shifted by a position; runs of equal
// contents; and random sequences. Every family is run under many keys. It fails on the
// one-multiply chain P(j) = P(j-1) + c(j) * T(j) (two top-bit flips collide under every
// key) and on an unkeyed position term (swaps collide).
func TestChainCollisions(t *testing.T) {
	const length = 64
	keys := 64
	if testing.Short() {
		keys = 16
	}
	r := rand.New(rand.NewPCG(3, 4))
	for key := 0; key < keys; key++ {
		c := chain.New(false, table.SeedFrom(uint64(key)))
		// (position, prefix word) -> SPEC's chain of the same prefix, an independent
		// name for it: a family shares the prefixes its sequences agree on.
		seen := make(map[[2]uint64]uint64)
		add := func(name string, content []uint64) {
			pre := make([]uint64, len(content))
			pre[0] = content[0]
			c.Fill(pre, content, 1)
			x := content[0]
			for i := 1; i < len(pre); i++ {
				x = hash.Next(x, content[i])
				k := [2]uint64{uint64(i), pre[i]}
				if other, ok := seen[k]; ok && other != x {
					t.Fatalf("key %d: %s collides at position %d with an earlier sequence", key, name, i)
				}
				seen[k] = x
			}
		}
		base := make([]uint64, length)
		for i := range base {
			base[i] = r.Uint64()
		}
		mut := func(f func(s []uint64)) []uint64 {
			s := append([]uint64(nil), base...)
			f(s)
			return s
		}
		add("base", base)
		for a := 1; a < length; a++ {
			for _, d := range []uint64{1 << 63, 1, 3, 1<<32 | 1, ^uint64(0)} {
				add(fmt.Sprintf("xor%d@%d", d, a), mut(func(s []uint64) { s[a] ^= d }))
			}
			add(fmt.Sprintf("add1@%d", a), mut(func(s []uint64) { s[a]++ }))
			for b := a + 1; b < length; b += 3 {
				add(fmt.Sprintf("flip2@%d,%d", a, b), mut(func(s []uint64) { s[a] ^= 1 << 63; s[b] ^= 1 << 63 }))
				if base[a] != base[b] {
					add(fmt.Sprintf("swap@%d,%d", a, b), mut(func(s []uint64) { s[a], s[b] = s[b], s[a] }))
				}
			}
		}
		add("shift", mut(func(s []uint64) { copy(s[1:], base[:length-1]) }))
		for v := uint64(0); v < 4; v++ {
			add(fmt.Sprintf("run%d", v), mut(func(s []uint64) {
				for i := 1; i < len(s); i++ {
					s[i] = v
				}
			}))
		}
		for i := 0; i < 64; i++ {
			s := make([]uint64, length)
			s[0] = base[0]
			for j := 1; j < length; j++ {
				s[j] = r.Uint64() & 0xff // a small alphabet: many near-equal sequences
			}
			add(fmt.Sprintf("random%d", i), s)
		}
	}
}

// BenchmarkChain is the cost of a query's prefix words per block, for a query of 1,500
// blocks (the depth of the trace-driven log's slowest queries): SPEC's XXH3 chain is
// serial, the keyed chain's terms are computed in parallel.
func BenchmarkChain(b *testing.B) {
	content := make([]uint64, 1500)
	for i := range content {
		content[i] = uint64(i) * 0x9e3779b97f4a7c15
	}
	pre := make([]uint64, len(content))
	for _, spec := range []bool{true, false} {
		c := chain.New(spec, table.SeedFrom(1))
		name := map[bool]string{true: "spec", false: "keyed"}[spec]
		b.Run(name, func(b *testing.B) {
			for b.Loop() {
				pre[0] = content[0]
				c.Fill(pre, content, 1)
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(content)), "ns/block")
		})
	}
}

// TestChainPastTable: a worker holding a chain deeper than the precomputed multipliers
// answers exactly at and past chain.TableMax, with both chains, locked and sharded.
func TestChainPastTable(t *testing.T) {
	const n = chain.TableMax + 900
	blocks := make([]Block, n)
	content := make([]uint64, n)
	for i := range blocks {
		content[i] = uint64(i)*0x9e3779b97f4a7c15 + 1
		blocks[i] = Block{Content: content[i], Seq: uint64(i + 1)}
	}
	for _, cfg := range []Config{{LockedIndex: true}, {Shards: 2}, {LockedIndex: true, SpecChain: true}, {Shards: 2, SpecChain: true}} {
		e, err := New(cfg)
		require.NoError(t, err)
		t.Cleanup(func() { e.Close() }) // (a failed check must not leave its shards running)
		require.NoError(t, e.Store("w", blocks))
		require.NoError(t, e.Barrier(context.Background()))
		for _, q := range []struct{ len, changed, want int }{
			{n, -1, n}, {chain.TableMax, -1, chain.TableMax}, {chain.TableMax + 1, -1, chain.TableMax + 1},
			{n, chain.TableMax + 500, chain.TableMax + 500}, {n, chain.TableMax, chain.TableMax}, {n, chain.TableMax - 1, chain.TableMax - 1},
		} {
			qc := append([]uint64(nil), content[:q.len]...)
			if q.changed >= 0 {
				qc[q.changed]++
			}
			got, err := e.FindMatches(context.Background(), qc, nil)
			require.NoError(t, err)
			require.Len(t, got, 1)
			require.Equal(t, q.want, got[0].Score, "%+v: query %+v", cfg, q)
		}
	}
}
