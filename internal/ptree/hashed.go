package ptree

import (
	"hash/maphash"
	"iter"
)

// Hashed is an immutable map from strings to V kept in a Map under a seeded hash of
// each key, for keys looked up often and chosen by clients: a lookup compares 64-bit
// hashes held in the nodes' arrays and reads one key's bytes at the end, where a
// Map[string, V] compares (and so reads from elsewhere in memory) a key per step. The
// seed is the map's own, made by NewHashed, so that no client can choose keys that
// share a hash; keys that do share one (never seen: 2^-64 a pair) share a bucket. The
// order of All is the hashes', not the keys'. Changes copy as a Map's do, plus the
// bucket of the key changed. The zero Hashed is empty and ready to use; its first Edit
// makes the seed.
type Hashed[V any] struct {
	m    Map[uint64, []entry[V]]
	n    int
	seed maphash.Seed
}

type entry[V any] struct {
	key string
	val V
}

// hashKey is the hash a Hashed files k under (a variable: the tests make keys
// collide).
var hashKey = func(seed maphash.Seed, k string) uint64 { return maphash.String(seed, k) }

// Len returns the number of entries.
func (h Hashed[V]) Len() int { return h.n }

// Get returns k's value and whether k is present.
func (h Hashed[V]) Get(k string) (V, bool) {
	if h.n > 0 {
		for _, e := range h.bucket(k) {
			if e.key == k {
				return e.val, true
			}
		}
	}
	var zero V
	return zero, false
}

// bucket returns k's bucket. It scans each node's hashes in order, which measured
// faster than Get's binary search: the hashes are one array of integers, and the scan's
// branches are predictable.
func (h Hashed[V]) bucket(k string) []entry[V] {
	hk := hashKey(h.seed, k)
	for x := h.m.root; x != nil; {
		i := 0
		for i < x.n && x.keys[i] < hk {
			i++
		}
		if i < x.n && x.keys[i] == hk {
			return x.vals[i]
		}
		x = x.kids[i]
	}
	return nil
}

// All yields the entries in the order of their keys' hashes.
func (h Hashed[V]) All() iter.Seq2[string, V] {
	return func(yield func(string, V) bool) {
		h.m.root.walk(func(_ uint64, b []entry[V]) bool {
			for _, e := range b {
				if !yield(e.key, e.val) {
					return false
				}
			}
			return true
		})
	}
}

// Keys yields the keys in the order of their hashes.
func (h Hashed[V]) Keys() iter.Seq[string] {
	return func(yield func(string) bool) {
		for k := range h.All() {
			if !yield(k) {
				return
			}
		}
	}
}

// Edit returns a HashedBuilder starting from h (h stays unchanged).
func (h Hashed[V]) Edit() *HashedBuilder[V] {
	if h.seed == (maphash.Seed{}) {
		h.seed = maphash.MakeSeed() // h is empty: nothing was filed under another seed
	}
	return &HashedBuilder[V]{b: h.m.Edit(), n: h.n, seed: h.seed}
}

// HashedBuilder makes a Hashed by a series of changes, as Builder makes a Map.
type HashedBuilder[V any] struct {
	b    *Builder[uint64, []entry[V]]
	n    int
	seed maphash.Seed
}

// Map returns the Hashed built so far. Later changes through b leave it unchanged.
func (b *HashedBuilder[V]) Map() Hashed[V] { return Hashed[V]{m: b.b.Map(), n: b.n, seed: b.seed} }

// Len returns the number of entries built so far.
func (b *HashedBuilder[V]) Len() int { return b.n }

// Set maps k to v.
func (b *HashedBuilder[V]) Set(k string, v V) {
	hk := hashKey(b.seed, k)
	old, _ := b.b.Get(hk)
	next := make([]entry[V], 0, len(old)+1) // a bucket may be shared with published versions
	for _, e := range old {
		if e.key != k {
			next = append(next, e)
		}
	}
	if len(next) == len(old) {
		b.n++
	}
	b.b.Set(hk, append(next, entry[V]{k, v}))
}

// Delete removes k (nothing when it is absent).
func (b *HashedBuilder[V]) Delete(k string) {
	hk := hashKey(b.seed, k)
	old, _ := b.b.Get(hk)
	i := 0
	for i < len(old) && old[i].key != k {
		i++
	}
	switch {
	case i == len(old):
		return
	case len(old) == 1:
		b.b.Delete(hk)
	default:
		next := make([]entry[V], 0, len(old)-1)
		b.b.Set(hk, append(append(next, old[:i]...), old[i+1:]...))
	}
	b.n--
}
