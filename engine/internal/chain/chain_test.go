package chain

import (
	"math/bits"
	"sync"
	"testing"

	"github.com/kvindex/kvindex/internal/table"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestChainTableGrows: the keyed chain's multiplier table starts small and grows to the
// deepest position hashed, while goroutines hash concurrently; every prefix word equals
// the one computed from the definition (T(j) = Hash64(j) | 1 under the chain's key),
// whatever table a goroutine held.
func TestChainTableGrows(t *testing.T) {
	c := New(false, table.SeedFrom(11))
	if n := len(*c.tab.Load()); n != chainTableMin {
		t.Fatalf("a new chain's table has %d multipliers, want %d", n, chainTableMin)
	}
	want := func(content []uint64) []uint64 {
		pre := make([]uint64, len(content))
		pre[0] = content[0]
		for j := 1; j < len(content); j++ {
			hi, lo := bits.Mul64(content[j]^c.k, c.key.Hash64(uint64(j))|1)
			pre[j] = pre[j-1] + (hi ^ lo)
		}
		return pre
	}
	content := make([]uint64, TableMax+700)
	for i := range content {
		content[i] = uint64(i)*0x9e3779b97f4a7c15 + 3
	}
	ref := want(content)
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Go(func() {
			for _, n := range []int{300, 1000 + g, 600, 2500, TableMax + 700 - g, 5} {
				pre := make([]uint64, n)
				pre[0] = content[0]
				c.Fill(pre, content, 1)
				for j := range pre {
					if pre[j] != ref[j] {
						t.Errorf("goroutine %d, length %d: P(%d) differs", g, n, j)
						return
					}
				}
				// step, past the table and within it
				if n > 1 && c.Step(ref[n-2], content[n-1], uint32(n-1)) != ref[n-1] {
					t.Errorf("goroutine %d: step at %d differs", g, n-1)
				}
			}
		})
	}
	wg.Wait()
	if n := len(*c.tab.Load()); n != TableMax {
		t.Fatalf("after hashing %d positions the table has %d multipliers, want %d", len(content), n, TableMax)
	}
}

// TestMults: the keyed chain's multipliers of a run step exactly as Step does, within
// the table; past the table, and for SPEC's and the given chain, Mults declines.
func TestMults(t *testing.T) {
	c := New(false, table.SeedFrom(12))
	content := []uint64{7, 11, 13, 17, 19, 23}
	for _, pos := range []uint32{1, 100, chainTableMin - uint32(len(content))} {
		k, m, ok := c.Mults(pos, len(content))
		if !ok || len(m) != len(content) {
			t.Fatalf("Mults(%d, %d): %d multipliers, ok %v", pos, len(content), len(m), ok)
		}
		got, want := uint64(5), uint64(5)
		for j, x := range content {
			hi, lo := bits.Mul64(x^k, m[j])
			got += hi ^ lo
			want = c.Step(want, x, pos+uint32(j))
			if got != want {
				t.Fatalf("run from %d: prefix %d differs from Step's", pos, j)
			}
		}
	}
	if _, _, ok := c.Mults(chainTableMin-2, 3); ok {
		t.Fatal("Mults past the table's multipliers reported ok")
	}
	for _, sc := range []Chain{New(true, table.SeedFrom(12)), Given} {
		if _, _, ok := sc.Mults(1, 2); ok {
			t.Fatal("Mults of an unkeyed chain reported ok")
		}
	}
}
