package shard

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/dolthub/swiss"

	"github.com/kvindex/kvindex/internal/table"
)

// The benchmarks below measure the three candidate tables on exactly the index's shape:
// a key (prefix hash, position) mapping to an inline member set. The flat table is the
// one Index uses; the two others are what a reader would reach for first.

type benchKey struct {
	prefix uint64
	pos    uint32
}

type benchVal struct {
	n uint32
	m [Inline]uint32
}

var benchSeed = table.NewSeed()

// The flat table's timings include computing the seeded fingerprint, as the engine's
// callers do.
func benchKeys(n int) []benchKey {
	r := rand.New(rand.NewPCG(1, 2))
	ks := make([]benchKey, n)
	for i := range ks {
		ks[i] = benchKey{prefix: r.Uint64(), pos: uint32(r.IntN(2000))}
	}
	return ks
}

// BenchmarkTable compares insert, lookup and read-modify-write (add a member) per key.
func BenchmarkTable(b *testing.B) {
	for _, size := range []int{1 << 14, 1 << 20} {
		keys := benchKeys(size)
		b.Run(fmt.Sprintf("keys=%d/op=insert/impl=flat", size), func(b *testing.B) {
			b.ReportAllocs()
			for i := 0; i < b.N; {
				x := New(0)
				for _, k := range keys {
					x.Add(Hash(benchSeed, Key{Prefix: k.prefix, Pos: k.pos}), 1)
				}
				i += len(keys)
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N), "ns/key")
		})
		b.Run(fmt.Sprintf("keys=%d/op=insert/impl=gomap", size), func(b *testing.B) {
			b.ReportAllocs()
			for i := 0; i < b.N; {
				m := map[benchKey]benchVal{}
				for _, k := range keys {
					v := m[k]
					v.m[v.n] = 1
					v.n++
					m[k] = v
				}
				i += len(keys)
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N), "ns/key")
		})
		b.Run(fmt.Sprintf("keys=%d/op=insert/impl=swiss", size), func(b *testing.B) {
			b.ReportAllocs()
			for i := 0; i < b.N; {
				m := swiss.NewMap[benchKey, benchVal](0)
				for _, k := range keys {
					v, _ := m.Get(k)
					v.m[v.n] = 1
					v.n++
					m.Put(k, v)
				}
				i += len(keys)
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N), "ns/key")
		})

		flat := New(size)
		gomap := make(map[benchKey]benchVal, size)
		sw := swiss.NewMap[benchKey, benchVal](uint32(size))
		for _, k := range keys {
			flat.Add(Hash(benchSeed, Key{Prefix: k.prefix, Pos: k.pos}), 1)
			gomap[k] = benchVal{n: 1, m: [Inline]uint32{1}}
			sw.Put(k, benchVal{n: 1, m: [Inline]uint32{1}})
		}
		order := rand.New(rand.NewPCG(3, 4)).Perm(size)
		b.Run(fmt.Sprintf("keys=%d/op=get/impl=flat", size), func(b *testing.B) {
			b.ReportAllocs()
			var buf [8]uint32
			sum := 0
			for i := 0; i < b.N; i++ {
				k := keys[order[i%size]]
				sum += len(flat.AppendMembers(buf[:0], Hash(benchSeed, Key{Prefix: k.prefix, Pos: k.pos})))
			}
			sinkInt = sum
		})
		b.Run(fmt.Sprintf("keys=%d/op=get/impl=gomap", size), func(b *testing.B) {
			b.ReportAllocs()
			sum := 0
			for i := 0; i < b.N; i++ {
				sum += int(gomap[keys[order[i%size]]].n)
			}
			sinkInt = sum
		})
		b.Run(fmt.Sprintf("keys=%d/op=get/impl=swiss", size), func(b *testing.B) {
			b.ReportAllocs()
			sum := 0
			for i := 0; i < b.N; i++ {
				v, _ := sw.Get(keys[order[i%size]])
				sum += int(v.n)
			}
			sinkInt = sum
		})
		b.Run(fmt.Sprintf("keys=%d/op=addremove/impl=flat", size), func(b *testing.B) {
			b.ReportAllocs()
			for i := 0; i < b.N; i++ {
				k := keys[order[i%size]]
				key := Hash(benchSeed, Key{Prefix: k.prefix, Pos: k.pos})
				flat.Add(key, 2)
				flat.Remove(key, 2)
			}
		})
		b.Run(fmt.Sprintf("keys=%d/op=addremove/impl=gomap", size), func(b *testing.B) {
			b.ReportAllocs()
			for i := 0; i < b.N; i++ {
				k := keys[order[i%size]]
				v := gomap[k]
				v.m[v.n] = 2
				v.n++
				gomap[k] = v
				v = gomap[k]
				v.n--
				gomap[k] = v
			}
		})
		b.Run(fmt.Sprintf("keys=%d/op=addremove/impl=swiss", size), func(b *testing.B) {
			b.ReportAllocs()
			for i := 0; i < b.N; i++ {
				k := keys[order[i%size]]
				v, _ := sw.Get(k)
				v.m[v.n] = 2
				v.n++
				sw.Put(k, v)
				v, _ = sw.Get(k)
				v.n--
				sw.Put(k, v)
			}
		})
	}
}

var sinkInt int
