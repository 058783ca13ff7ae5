package engine_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"runtime"
	"testing"

	"github.com/kvindex/kvindex/engine"
)

// BenchmarkFindMatches is the figure the core issue asks for: a 1,000-block query
// against 64 workers that share a 500-block prefix and then diverge (each holds 300
// more blocks of its own), at several shard counts and on the locked baseline.
func BenchmarkFindMatches(b *testing.B) {
	for _, tc := range []struct {
		name string
		cfg  engine.Config
	}{
		{"impl=locked", engine.Config{LockedIndex: true}},
		{"impl=engine/shards=1", engine.Config{Shards: 1}},
		{"impl=engine/shards=2", engine.Config{Shards: 2}},
		{"impl=engine/shards=4", engine.Config{Shards: 4}},
	} {
		b.Run(tc.name, func(b *testing.B) {
			e := newEngine(b, tc.cfg)
			shared := make([]engine.Block, 500)
			q := make([]uint64, 1000)
			for i := range shared {
				shared[i] = engine.Block{Content: uint64(i + 1), Seq: uint64(i + 1)}
				q[i] = uint64(i + 1)
			}
			for i := 500; i < 1000; i++ {
				q[i] = uint64(1_000_000 + i)
			}
			for w := 0; w < 64; w++ {
				name := fmt.Sprintf("w%02d", w)
				if err := e.Store(name, shared); err != nil {
					b.Fatal(err)
				}
				tail := make([]engine.Block, 300)
				for i := range tail {
					tail[i] = engine.Block{Content: uint64(w*10_000 + i), Seq: uint64(1000 + i)}
				}
				if err := e.StoreUnder(name, 500, tail); err != nil {
					b.Fatal(err)
				}
			}
			if err := e.Barrier(ctx); err != nil {
				b.Fatal(err)
			}
			dst := make([]engine.Match, 0, 64)
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				var err error
				if dst, err = e.FindMatches(ctx, q, dst[:0]); err != nil {
					b.Fatal(err)
				}
			}
			if len(dst) != 64 || dst[0].Score != 500 {
				b.Fatalf("unexpected answer %v", dst[:1])
			}
		})
	}
}

// BenchmarkEvents applies a store of a 32-block chain and its tail-first eviction, one
// removed event per block, as vLLM emits them, and reports events per second.
func BenchmarkEvents(b *testing.B) {
	for _, tc := range []struct {
		name string
		cfg  engine.Config
	}{
		{"impl=locked", engine.Config{LockedIndex: true}},
		{"impl=engine/shards=1", engine.Config{Shards: 1}},
		{"impl=engine/shards=2", engine.Config{Shards: 2}},
	} {
		b.Run(tc.name, func(b *testing.B) {
			e := newEngine(b, tc.cfg)
			r := rand.New(rand.NewPCG(1, 1))
			const workers, chain = 16, 32
			blocks := make([]engine.Block, chain)
			names := make([]string, workers)
			for i := range names {
				names[i] = fmt.Sprintf("w%d", i)
			}
			b.ReportAllocs()
			b.ResetTimer()
			events := 0
			for i := 0; i < b.N; i++ {
				w := names[i%workers]
				base := uint64(i) * chain
				for j := range blocks {
					blocks[j] = engine.Block{Content: r.Uint64() % 64, Seq: base + uint64(j)}
				}
				if err := e.Store(w, blocks); err != nil {
					b.Fatal(err)
				}
				for j := chain - 1; j >= 0; j-- {
					if err := e.Remove(w, base+uint64(j)); err != nil {
						b.Fatal(err)
					}
				}
				events += 1 + chain
			}
			if err := e.Barrier(ctx); err != nil {
				b.Fatal(err)
			}
			b.ReportMetric(float64(events)/b.Elapsed().Seconds(), "events/s")
			b.ReportMetric(float64(2*chain*b.N)/b.Elapsed().Seconds(), "blockops/s")
		})
	}
}

// BenchmarkMemory loads 1,000,000 memberships (16 workers x 62,500 blocks: chains of 250
// blocks whose first 50 come from one of 40 shared system prompts) and reports the heap
// the engine holds per membership, measured with runtime.MemStats after a GC.
func BenchmarkMemory(b *testing.B) {
	for _, tc := range []struct {
		name string
		cfg  engine.Config
	}{
		{"impl=engine/shards=1", engine.Config{Shards: 1}},
		{"impl=engine/shards=4", engine.Config{Shards: 4}},
		{"impl=locked", engine.Config{LockedIndex: true}},
	} {
		b.Run(tc.name, func(b *testing.B) {
			for i := 0; i < b.N; i++ {
				perMembership := loadMillion(b, tc.cfg)
				b.ReportMetric(perMembership, "B/membership")
			}
		})
	}
}

func loadMillion(b *testing.B, cfg engine.Config) float64 {
	const workers, perWorker, chain, shared, prompts = 16, 62_500, 250, 50, 40
	runtime.GC()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	e, err := engine.New(cfg)
	if err != nil {
		b.Fatal(err)
	}
	defer e.Close()
	r := rand.New(rand.NewPCG(7, 7))
	blocks := make([]engine.Block, chain)
	seq := uint64(0)
	for w := 0; w < workers; w++ {
		name := fmt.Sprintf("w%d", w)
		for n := 0; n < perWorker; n += chain {
			p := uint64(r.IntN(prompts))
			for j := range blocks {
				c := r.Uint64()
				if j < shared {
					c = p<<32 | uint64(j)
				}
				seq++
				blocks[j] = engine.Block{Content: c, Seq: seq}
			}
			if err := e.Store(name, blocks); err != nil {
				b.Fatal(err)
			}
		}
	}
	if err := e.Barrier(context.Background()); err != nil {
		b.Fatal(err)
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	st := e.Stats()
	if st.Blocks != workers*perWorker {
		b.Fatalf("loaded %d memberships", st.Blocks)
	}
	return float64(after.HeapAlloc-before.HeapAlloc) / float64(st.Blocks)
}
