package shard

import (
	"github.com/kvindex/kvindex/internal/invariants"
	"math/rand/v2"
	"slices"
	"testing"
	"unsafe"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/kvindex/kvindex/internal/table"
	"github.com/kvindex/kvindex/internal/testsize"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestSlotSize(t *testing.T) {
	require.Equal(t, uintptr(12), unsafe.Sizeof(slot{}), "a slot is a fingerprint and one member")
}

// TestIndexAgainstMap drives the table with random adds and removes over a small key
// space (so probe runs, overflow sets, growth, shrink and backward-shift deletion all
// happen) and compares every observable with a map of sets.
func TestIndexAgainstMap(t *testing.T) {
	for _, tc := range []struct {
		name    string
		keys    int
		workers int
		// collide forces every key onto few home slots by using prefixes that differ
		// only in bits the mixer cannot separate... it cannot, so instead we use few
		// positions and tiny prefixes, the shape roots take in the conformance logs.
		seed uint64
		// high draws worker ids just below MaxMember, where a slot's member word meets
		// the overflow mark.
		high bool
	}{
		{"few-keys-many-workers", 8, 40, 1, false},
		{"many-keys-few-workers", 5000, 3, 2, false},
		{"mixed", 600, 12, 3, false},
		{"high-worker-ids", 600, 12, 4, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := rand.New(rand.NewPCG(tc.seed, 7))
			x := New(0)
			seed := table.SeedFrom(tc.seed)
			model := map[Key]map[uint32]bool{}
			members := 0
			// Under -tags invariants every change rechecks the table (O(n) each): a sixth
			// of the history there; make test's plain-index runs it whole.
			steps := testsize.Sized(60000, 60000, 10000)
			for step := 0; step < steps; step++ {
				k := Key{Prefix: uint64(r.IntN(tc.keys)), Pos: uint32(r.IntN(3))}
				w := uint32(r.IntN(tc.workers))
				if tc.high {
					w = MaxMember - w
				}
				if r.IntN(100) < 55 {
					want := !model[k][w]
					require.Equal(t, want, x.Add(Hash(seed, k), w))
					if want {
						if model[k] == nil {
							model[k] = map[uint32]bool{}
						}
						model[k][w] = true
						members++
					}
				} else {
					want := model[k][w]
					require.Equal(t, want, x.Remove(Hash(seed, k), w))
					if want {
						delete(model[k], w)
						if len(model[k]) == 0 {
							delete(model, k)
						}
						members--
					}
				}
				require.Equal(t, len(model), x.Len())
				require.Equal(t, members, x.Memberships())
				if step%97 == 0 {
					require.Equal(t, bytesByWalk(x), x.Bytes(), "step %d", step)
				}
				if step%997 == 0 {
					for mk, set := range model {
						got := x.AppendMembers(nil, Hash(seed, mk))
						slices.Sort(got)
						var want []uint32
						for w := range set {
							want = append(want, w)
						}
						slices.Sort(want)
						require.Equal(t, want, got)
						require.True(t, x.Has(Hash(seed, mk), want[0]))
					}
				}
			}
			// Drain everything: the table shrinks back and stays consistent.
			for mk, set := range model {
				for w := range set {
					require.True(t, x.Remove(Hash(seed, mk), w))
				}
			}
			require.Zero(t, x.Len())
			require.Zero(t, x.Memberships())
			require.LessOrEqual(t, x.Capacity(), shrinkFloor, "a drained table gives its memory back")
		})
	}
}

func TestIndexZeroAllocsSteadyState(t *testing.T) {
	if invariants.Enabled {
		t.Skip("the invariants build checks the table after every change")
	}
	x := New(1024)
	seed := table.NewSeed()
	keys := make([]uint64, 512)
	for i := range keys {
		keys[i] = Hash(seed, Key{Prefix: uint64(i) * 0x9e3779b97f4a7c15, Pos: uint32(i % 7)})
	}
	// Resident keys keep the table at its size; the churn below is the steady state.
	for i := range 4096 {
		x.Add(Hash(seed, Key{Prefix: uint64(i), Pos: 100}), 9)
	}
	buf := make([]uint32, 0, 16)
	allocs := testing.AllocsPerRun(50, func() {
		for _, k := range keys {
			x.Add(k, 1)
			x.Add(k, 2)
			buf = x.AppendMembers(buf[:0], k)
		}
		for _, k := range keys {
			x.Remove(k, 1)
			x.Remove(k, 2)
		}
	})
	require.Zero(t, allocs)
}

// bytesByWalk is what Bytes keeps track of, computed the slow way.
func bytesByWalk(x *Index) int {
	b := len(x.slots) * int(unsafe.Sizeof(slot{}))
	for _, o := range x.ovf {
		b += int(unsafe.Sizeof(o)) + cap(o)*4
	}
	return b + cap(x.ovfFree)*4
}
