// Package table is the toolkit that every open-addressing table of kvindex is built
// from: the positional index (package shard), a worker's seq table and key index
// (package engine) and the duplicate check's scratch set. Each table keeps its own
// slot type and probe loop: a generic table calls its slot methods through a type
// parameter, and on the seq table's shape it was slower (engine's
// BenchmarkSeqTableGeneric, best of 6 rounds: 127 ns per key concrete, 140 generic);
// the tables' policies differ too (Robin Hood order where a slot gives its home). What
// they share lives here: the seeded hashes (and Mix64, a keyed bijection for a table
// that stores its keys mixed), the mapping of a hash to a home slot in a table of any
// size, the sizing policy, the run test of backward-shift deletion and the shift of a
// Robin Hood insertion.
//
// The positional index and a worker's key index are linear-probing with backward-shift
// deletion (no tombstones) in Robin Hood order (the positional index's slot carries its
// hash, the key index's its distance from home), so a miss and a deletion stop early;
// both run dense (13/16). A worker's seq table probes groups of eight slots by a
// control word (swiss-table style, with dead bytes) and stores Mix64 of its key. They are
// sized by the policy below rather than in powers of two: a table grows by half at a
// load of 3/4 (13/16 for the dense ones), so its load stays between 0.5 and 0.75 (0.375
// to 0.75 with doubling).
package table

import (
	"crypto/rand"
	"encoding/binary"
	"fmt"
	"math/bits"
)

// Seed keys the hashes of the tables of one engine. Keys a client can steer (content
// and prefix hashes come from prompts, engine block hashes from their contents) would
// otherwise let a client choose keys that share a home slot: a table would then probe
// one long run for every operation. With a secret seed per engine, which keys collide is
// unknown outside the process. Nothing persistent depends on it.
type Seed struct{ k0, k1, k2, k3 uint64 }

// NewSeed returns a seed drawn from the operating system's random source.
func NewSeed() Seed {
	var b [32]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic("table: no randomness: " + err.Error()) // crypto/rand.Read does not fail on supported platforms
	}
	return Seed{
		binary.LittleEndian.Uint64(b[0:]), binary.LittleEndian.Uint64(b[8:]),
		binary.LittleEndian.Uint64(b[16:]), binary.LittleEndian.Uint64(b[24:]),
	}
}

// Words returns the seed's four words, for a secret that must travel with data keyed by
// it (the engine's prefix chain key in a snapshot); SeedOf is its inverse.
func (s Seed) Words() [4]uint64 { return [4]uint64{s.k0, s.k1, s.k2, s.k3} }

// SeedOf returns the seed whose Words are w.
func SeedOf(w [4]uint64) Seed { return Seed{w[0], w[1], w[2], w[3]} }

// SeedFrom derives a seed from x, for tests that need a known one.
func SeedFrom(x uint64) Seed {
	s := Seed{}
	for i, k := range []*uint64{&s.k0, &s.k1, &s.k2, &s.k3} {
		x += 0x9e3779b97f4a7c15
		*k = mum(x^uint64(i), m1) ^ x
	}
	return s
}

const (
	m1 = 0xa0761d6478bd642f
	m2 = 0xe7037ed1a0b428db
)

// mum folds the 128-bit product of a and b: the mixing step of wyhash. It is zero only
// when a or b is, so the rounds below xor a secret into their input first and multiply
// by a fixed odd constant: no input value but one can zero a round.
func mum(a, b uint64) uint64 {
	hi, lo := bits.Mul64(a, b)
	return hi ^ lo
}

// Hash64 hashes one word under the seed: two keyed multiply-fold rounds.
func (s Seed) Hash64(x uint64) uint64 {
	return mum(mum(x^s.k0, m1)^s.k1, m2)
}

// Hash128 hashes two words under the seed. The second word (a key's namespace and
// position) enters between the rounds, so keys that differ only in it are spread by the
// whole second round.
func (s Seed) Hash128(a, b uint64) uint64 {
	return mum(mum(a^s.k0, m1)^b^s.k2, m2^s.k3|1)
}

// Home maps a hash to a slot of a table of n slots (Lemire's multiply-shift: the top
// bits of h decide, so a caller that also uses h for something else takes its low bits).
func Home(h uint64, n int) uint64 {
	hi, _ := bits.Mul64(h, uint64(n))
	return hi
}

// Next is the slot after i in a table of n slots.
func Next(i uint64, n int) uint64 {
	if i++; i == uint64(n) {
		return 0
	}
	return i
}

// MinSlots is the smallest table.
const MinSlots = 2

// Full reports whether a table of n slots holding used entries must grow before it
// takes one more: at a load of 3/4. The runs of linear probing lengthen quickly above
// this load (measured on the trace-driven replay: growing the seq table at 13/16 instead
// cost 15% of its throughput for 12% less memory while its deletions rehashed every
// entry they shifted; in Robin Hood order it is still slower there).
func Full(used, n int) bool { return (used+1)*4 > n*3 }

// FullDense is Full for tables whose slots give their home cheaply (a hash or a distance
// from home, so long runs are cheap to shift): they grow at 13/16.
func FullDense(used, n int) bool { return (used+1)*16 > n*13 }

// Grown is the size a full table of n slots grows to: by half, but at least to
// MinSlots (and doubled while small, where half a slot is nothing).
func Grown(n int) int {
	if n < 64 {
		return max(2*n, MinSlots)
	}
	return n + n/2
}

// GrownLean is the growth of a table whose memory matters when it is large: doubled
// below LeanFrom slots, by a quarter past it, so that a large table's load stays
// between 0.6 and 0.75 at Full instead of 0.375 and 0.75. A worker's seq table (13
// bytes a held engine hash, the largest of its tables) grows so. Below LeanFrom the
// load is what costs: the fuller its groups, the more of them a probe reads and the
// fewer empty bytes let a deletion leave none dead. On the conversation trace (about
// 4,000 engine hashes a worker, tables of 5,000-10,000 slots), locked index, six
// alternating runs each: doubling below 65,536 slots instead of growing by a quarter
// past 4,096 took `bench.BenchmarkEvents` from 201-217 to 179-207 ns an event and
// `BenchmarkEventsCoalesced` from 4.98-5.34 to 4.43-4.72 µs a coalesced event, for
// 38.8 -> 43.2 bytes of heap per membership there (the benchmark's measure).
func GrownLean(n int) int {
	if n < LeanFrom {
		return max(2*n, MinSlots)
	}
	return n + n/4
}

// LeanFrom is the size, in slots, past which GrownLean grows a table by a quarter (832
// KiB of a seq table's slots and control bytes).
const LeanFrom = 1 << 16

// Sparse reports whether a table of n slots holding used entries should shrink (to
// Shrunk(n)); floor is the size below which a table never shrinks. The gap between the
// grow and shrink loads (13/16 and 1/8) keeps a table that fills and drains by the same
// amount in a loop from reallocating every cycle.
func Sparse(used, n, floor int) bool { return n > floor && used*8 < n }

// Shrunk is the size a sparse table of n slots shrinks to.
func Shrunk(n int) int { return max(n/2, MinSlots) }

// ForEntries returns the size of a dense table that holds n entries without growing.
func ForEntries(n int) int {
	c := MinSlots
	for FullDense(n-1, c) {
		c = Grown(c)
	}
	return c
}

// Dist is how far slot i lies past home slot h in a table of n slots (cyclically): a
// Robin Hood table keeps each probe run ordered by home, so that an entry farther from
// home than the one it meets takes that slot, a lookup stops at the first entry nearer
// to its home than the probe is, and a deletion shifts back only the entries after it
// that are not at their home.
func Dist(h, i uint64, n int) uint64 {
	if i >= h {
		return i - h
	}
	return i + uint64(n) - h
}

// InRun reports whether home h lies cyclically in (i, j]: an entry at slot j whose home
// is there must stay when slot i is emptied (it is not reachable from i's side).
func InRun(h, i, j uint64) bool {
	if i < j {
		return h > i && h <= j
	}
	return h > i || h <= j
}

// Mix64 is a keyed bijection of one word, for a table that stores the mixed value in
// place of its key: the key is recovered with Unmix64, and an entry's home slot comes
// from the stored value by one multiply (Home), so moving entries (growth, deletion's
// backward shift) rehashes nothing. Two rounds of xor with a secret, multiply by an odd
// constant and xor-shift: each step is invertible, and the secrets enter before each
// multiply, so which keys share the top bits (the home slot) is unknown without them,
// as with Hash64.
func (s Seed) Mix64(x uint64) uint64 {
	x = (x ^ s.k0) * m1
	x ^= x >> 32
	x = (x ^ s.k1) * m2
	return x ^ x>>29
}

// Unmix64 inverts Mix64.
func (s Seed) Unmix64(h uint64) uint64 {
	h ^= h>>29 ^ h>>58
	h = h*inverse(m2) ^ s.k1
	h ^= h >> 32
	return h*inverse(m1) ^ s.k0
}

// inverse returns the multiplicative inverse of odd a modulo 2^64 (Newton's iteration:
// each step doubles the correct low bits, from 3 for x = a). The compiler folds it for a
// constant.
func inverse(a uint64) uint64 {
	x := a
	for i := 0; i < 5; i++ {
		x *= 2 - a*x
	}
	return x
}

// ShiftRight moves the slots from i up to (not including) the empty slot j, cyclically,
// one step on, so that slot i can take a new entry: the insertion of a Robin Hood table
// whose runs are sorted by home.
func ShiftRight[S any](slots []S, i, j uint64) {
	if j >= i {
		copy(slots[i+1:j+1], slots[i:j])
		return
	}
	// The run wraps past the end of the table.
	copy(slots[1:j+1], slots[:j])
	n := uint64(len(slots))
	slots[0] = slots[n-1]
	copy(slots[i+1:], slots[i:n-1])
}

// CheckRobinHood verifies a linear-probing table of n slots in Robin Hood order: at(i)
// reports slot i's distance from its home and whether it is used. Every used slot past
// its home follows a used slot at most one step nearer to its own home (so a lookup
// that meets an entry nearer to its home than the probe has passed where its key would
// be, and a backward-shift deletion stops at the first entry at its home), no entry
// lies a whole table past its home, and used slots number want. It is a table's
// checkInvariants core (Go's internal/runtime/maps table_debug.go is the model): O(n),
// for tests and -tags invariants builds (package internal/invariants), never the hot
// path.
func CheckRobinHood(n, want int, at func(i uint64) (dist uint64, used bool)) error {
	used := 0
	for i := uint64(0); i < uint64(n); i++ {
		d, ok := at(i)
		if !ok {
			continue
		}
		used++
		if d >= uint64(n) {
			return fmt.Errorf("table: slot %d lies %d past its home in a table of %d", i, d, n)
		}
		if d == 0 {
			continue
		}
		prev := i - 1
		if i == 0 {
			prev = uint64(n - 1)
		}
		pd, pused := at(prev)
		switch {
		case !pused:
			return fmt.Errorf("table: slot %d lies %d past its home after an empty slot", i, d)
		case pd+1 < d:
			return fmt.Errorf("table: slot %d lies %d past its home after a slot %d past its own", i, d, pd)
		}
	}
	if used != want {
		return fmt.Errorf("table: %d slots used, count says %d", used, want)
	}
	return nil
}
