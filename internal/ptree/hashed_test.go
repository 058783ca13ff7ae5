package ptree

import (
	"fmt"
	"hash/maphash"
	"maps"
	"math/rand/v2"
	"slices"
	"testing"
)

// TestHashedDifferential: random sets and deletes of string keys through
// HashedBuilders, compared with Go's map after each (Len, Get of present and absent
// keys, the entries All and Keys yield), every version kept and checked again at the
// end; once with the seeded hash and once with one under which keys collide in a few
// buckets, so that buckets of several keys are changed and emptied.
func TestHashedDifferential(t *testing.T) {
	for _, collide := range []bool{false, true} {
		if collide {
			hashKey = func(_ maphash.Seed, k string) uint64 { return uint64(len(k) % 3) }
		}
		rng := rand.New(rand.NewPCG(3, 3))
		var (
			cur   Hashed[int]
			want  = map[string]int{}
			snaps []Hashed[int]
			wants []map[string]int
		)
		for step := range 3000 {
			b := cur.Edit()
			for range 1 + rng.IntN(3) {
				k, v := fmt.Sprint("w", rng.IntN(300)), rng.Int()
				if rng.IntN(100) < 45 {
					b.Delete(k)
					delete(want, k)
				} else {
					b.Set(k, v)
					want[k] = v
				}
			}
			cur = b.Map()
			checkHashed(t, cur, want, fmt.Sprintf("collide %v step %d", collide, step))
			if step%50 == 0 {
				snaps, wants = append(snaps, cur), append(wants, maps.Clone(want))
			}
		}
		for i := range snaps {
			checkHashed(t, snaps[i], wants[i], fmt.Sprintf("collide %v snapshot %d", collide, i))
		}
		hashKey = func(seed maphash.Seed, k string) uint64 { return maphash.String(seed, k) }
	}
}

func checkHashed(t *testing.T, h Hashed[int], want map[string]int, where string) {
	t.Helper()
	if h.Len() != len(want) {
		t.Fatalf("%s: Len %d, want %d", where, h.Len(), len(want))
	}
	got := maps.Collect(h.All())
	if !maps.Equal(got, want) || len(slices.Collect(h.Keys())) != len(want) {
		t.Fatalf("%s: entries %v, want %v", where, got, want)
	}
	for k, v := range want {
		if g, ok := h.Get(k); !ok || g != v {
			t.Fatalf("%s: Get(%q) = %d, %v; want %d", where, k, g, ok, v)
		}
	}
	if _, ok := h.Get("absent"); ok {
		t.Fatalf("%s: Get found an absent key", where)
	}
}

// TestHashedSeeds: two Hashed maps file the same keys under their own seeds (the order
// of All differs between them for enough keys), and the zero Hashed answers Get.
func TestHashedSeeds(t *testing.T) {
	var zero Hashed[int]
	if _, ok := zero.Get("x"); ok || zero.Len() != 0 {
		t.Fatal("the zero Hashed is not empty")
	}
	a, b := zero.Edit(), zero.Edit()
	for i := range 64 {
		a.Set(fmt.Sprint("w", i), i)
		b.Set(fmt.Sprint("w", i), i)
	}
	if slices.Equal(slices.Collect(a.Map().Keys()), slices.Collect(b.Map().Keys())) {
		t.Fatal("two maps ordered 64 keys alike: they share a seed")
	}
}
