package table

import (
	"math/rand/v2"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestHashesDoNotCollideOnStructuredKeys feeds the keyed hashes the shapes keys take
// in the engine and that a client can choose: small root contents at every position and
// namespace, sequential engine hashes, prefixes that differ in one bit. The index stores
// only Hash128 of a key, so a collision among such keys would merge two keys; none may
// appear (for random 64-bit outputs, a collision among these 2^20 keys has probability
// about 2^-25).
func TestHashesDoNotCollideOnStructuredKeys(t *testing.T) {
	for _, seed := range []Seed{SeedFrom(1), SeedFrom(2), NewSeed()} {
		seen := make(map[uint64][2]uint64, 1<<20)
		add := func(a, b uint64) {
			h := seed.Hash128(a, b)
			if prev, dup := seen[h]; dup && prev != [2]uint64{a, b} {
				t.Fatalf("Hash128(%#x, %#x) = Hash128(%#x, %#x)", a, b, prev[0], prev[1])
			}
			seen[h] = [2]uint64{a, b}
		}
		for prefix := uint64(0); prefix < 512; prefix++ {
			for pos := uint64(0); pos < 512; pos++ {
				add(prefix, pos)                // default namespace
				add(prefix, 1<<32|pos)          // namespace 1
				add(1<<(prefix%64)^pos, pos<<1) // one-bit prefixes
				add(prefix<<32|pos, pos)        // prefix equal to another key's loc word
			}
		}
		seqs := make(map[uint64]uint64, 1<<20)
		for x := uint64(0); x < 1<<20; x++ {
			h := seed.Hash64(x)
			if prev, dup := seqs[h]; dup {
				t.Fatalf("Hash64(%d) = Hash64(%d)", x, prev)
			}
			seqs[h] = x
		}
	}
}

func TestSizing(t *testing.T) {
	for n := 0; n < 5000; n++ {
		c := ForEntries(n)
		if FullDense(n-1, c) {
			t.Fatalf("ForEntries(%d) = %d is full", n, c)
		}
	}
	for n := MinSlots; n < 1<<20; n = Grown(n) {
		if g := Grown(n); g <= n {
			t.Fatalf("Grown(%d) = %d", n, g)
		}
	}
	for n := MinSlots; n < 1<<20; n = GrownLean(n) {
		g := GrownLean(n)
		if g <= n || n >= LeanFrom && g > n+n/4 || n < LeanFrom && g != max(2*n, MinSlots) {
			t.Fatalf("GrownLean(%d) = %d", n, g)
		}
	}
	for _, n := range []int{1, 2, 3, 7, 100, 1 << 20} {
		for h := uint64(0); h < 1000; h++ {
			if i := Home(h*0x9e3779b97f4a7c15, n); i >= uint64(n) {
				t.Fatalf("Home in a table of %d = %d", n, i)
			}
		}
	}
}

// TestMix64Inverts checks that Unmix64 undoes Mix64 under random seeds, on random words
// and on the edges.
func TestMix64Inverts(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for n := 0; n < 20; n++ {
		s := SeedFrom(r.Uint64())
		for _, x := range []uint64{0, 1, ^uint64(0), 1 << 63} {
			if got := s.Unmix64(s.Mix64(x)); got != x {
				t.Fatalf("Unmix64(Mix64(%#x)) = %#x", x, got)
			}
		}
		for i := 0; i < 10000; i++ {
			x := r.Uint64()
			if got := s.Unmix64(s.Mix64(x)); got != x {
				t.Fatalf("Unmix64(Mix64(%#x)) = %#x", x, got)
			}
		}
	}
}

// TestShiftRight checks the insertion shift against a slot-by-slot model, on runs that
// do and do not wrap past the end of the table.
func TestShiftRight(t *testing.T) {
	const n = 7
	for i := uint64(0); i < n; i++ {
		for l := uint64(0); l < n; l++ { // run length: slots i .. i+l-1 are full, i+l is empty
			slots := make([]int, n)
			for k := uint64(0); k < n; k++ {
				slots[k] = int(k) + 1
			}
			j := (i + l) % n
			slots[j] = 0
			want := append([]int(nil), slots...)
			for k := l; k > 0; k-- { // move i+k-1 to i+k, from the end of the run back
				want[(i+k)%n] = want[(i+k-1)%n]
			}
			ShiftRight(slots, i, j)
			for k := uint64(0); k < l; k++ {
				if got, w := slots[(i+k+1)%n], want[(i+k+1)%n]; got != w {
					t.Fatalf("i=%d run %d: slot %d = %d, want %d", i, l, (i+k+1)%n, got, w)
				}
			}
			for k := uint64(0); k < n; k++ {
				if in := (k+n-i)%n <= l && k != i; !in && slots[k] != want[k] {
					t.Fatalf("i=%d run %d: slot %d outside the run changed", i, l, k)
				}
			}
		}
	}
}
