package ptree

import (
	"maps"
	"strconv"
	"testing"
)

// BenchmarkChange measures one entry set and deleted again, keyed by worker-like
// strings, in a Map and (the baseline) in a Go map cloned for each change, as a
// copy-on-write map shared with lock-free readers must be.
func BenchmarkChange(b *testing.B) {
	for _, n := range []int{100, 1000, 10000} {
		var m Map[string, *int]
		g := map[string]*int{}
		for i := range n {
			k := "pod-" + strconv.Itoa(i)
			m, g[k] = m.Set(k, &i), &i
		}
		v := 1
		b.Run("ptree-"+strconv.Itoa(n), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				m = m.Set("probe", &v).Delete("probe")
			}
		})
		b.Run("clone-"+strconv.Itoa(n), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				c := maps.Clone(g)
				c["probe"] = &v
				c = maps.Clone(c)
				delete(c, "probe")
			}
		})
	}
}

// BenchmarkGet measures a lookup of a present key among 10,000, in a Map and in a Go
// map.
func BenchmarkGet(b *testing.B) {
	const n = 10000
	var m Map[string, *int]
	g := map[string]*int{}
	keys := make([]string, n)
	for i := range n {
		keys[i] = "pod-" + strconv.Itoa(i)
		m, g[keys[i]] = m.Set(keys[i], &i), &i
	}
	b.Run("ptree", func(b *testing.B) {
		i := 0
		for b.Loop() {
			if _, ok := m.Get(keys[i%n]); !ok {
				b.Fatal("missing")
			}
			i += 7919
		}
	})
	b.Run("map", func(b *testing.B) {
		i := 0
		for b.Loop() {
			if g[keys[i%n]] == nil {
				b.Fatal("missing")
			}
			i += 7919
		}
	})
}

// BenchmarkHashedGet measures a lookup of a present key among 10,000 in a Hashed.
func BenchmarkHashedGet(b *testing.B) {
	const n = 10000
	bl := Hashed[*int]{}.Edit()
	keys := make([]string, n)
	for i := range n {
		keys[i] = "pod-" + strconv.Itoa(i)
		bl.Set(keys[i], &i)
	}
	h := bl.Map()
	i := 0
	for b.Loop() {
		if _, ok := h.Get(keys[i%n]); !ok {
			b.Fatal("missing")
		}
		i += 7919
	}
}
