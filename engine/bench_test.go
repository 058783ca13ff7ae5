package engine_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"runtime"
	"slices"
	"testing"
	"time"

	"github.com/kvindex/kvindex/engine"
)

// timeQueries takes a Barrier, then times b.N runs of q and returns the last answer.
func timeQueries(b *testing.B, e *engine.Engine, q []uint64, capacity int) []engine.Match {
	b.Helper()
	if err := e.Barrier(ctx); err != nil {
		b.Fatal(err)
	}
	dst := make([]engine.Match, 0, capacity)
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		var err error
		if dst, err = e.FindMatches(ctx, q, dst[:0]); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	return dst
}

// benchConfig is one implementation a benchmark runs against.
type benchConfig struct {
	name string
	cfg  engine.Config
}

// benchConfigs returns the locked baseline and the engine at each shard count.
func benchConfigs(shards ...int) []benchConfig {
	out := []benchConfig{{"impl=locked", engine.Config{LockedIndex: true}}}
	for _, n := range shards {
		out = append(out, benchConfig{fmt.Sprintf("impl=engine/shards=%d", n), engine.Config{Shards: n}})
	}
	return out
}

// BenchmarkFindMatches is the figure the core issue asks for: a 1,000-block query
// against 64 workers that share a 500-block prefix and then diverge (each holds 300
// more blocks of its own), at several shard counts and on the locked baseline.
func BenchmarkFindMatches(b *testing.B) {
	for _, tc := range benchConfigs(1, 2, 4) {
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
			dst := timeQueries(b, e, q, 64)
			if len(dst) != 64 || dst[0].Score != 500 {
				b.Fatalf("unexpected answer %v", dst[:1])
			}
		})
	}
}

// BenchmarkEvents applies a store of a 32-block chain and its tail-first eviction, one
// removed event per block, as vLLM emits them, and reports events per second.
func BenchmarkEvents(b *testing.B) {
	for _, tc := range benchConfigs(1, 2) {
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
	for _, tc := range benchConfigs(1, 4) {
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

// BenchmarkQueryRoundTrip isolates what one hand-off to a shard goroutine costs a query:
// a one-block query (one probe, one round trip to its shard, nothing else) against an
// engine that holds it, at rest and while one goroutine streams store and remove events
// into the same engine, as a router's ingester does. chan-pingpong is the bare Go
// mechanism under the same load (the events then go to a separate engine): a goroutine
// that answers a channel send with a send back, polling before it parks as the shards
// do. The locked baseline answers on the caller's goroutine. Percentiles are reported
// in nanoseconds.
func BenchmarkQueryRoundTrip(b *testing.B) {
	for _, load := range []bool{false, true} {
		for _, tc := range append(benchConfigs(1, 2), benchConfig{"impl=chan-pingpong", engine.Config{Shards: 1}}) {
			b.Run(fmt.Sprintf("load=%v/%s", load, tc.name), func(b *testing.B) {
				e := newEngine(b, tc.cfg)
				if err := e.Store("q", []engine.Block{{Content: 1, Seq: 1}}); err != nil {
					b.Fatal(err)
				}
				if err := e.Barrier(ctx); err != nil {
					b.Fatal(err)
				}
				ask := func() {
					m, err := e.FindMatches(ctx, []uint64{1}, nil)
					if err != nil || len(m) != 1 {
						b.Fatalf("answer %v, %v", m, err)
					}
				}
				if tc.name == "impl=chan-pingpong" {
					ask = pingPong(b)
				}
				if load {
					stop := streamEvents(b, e)
					defer stop()
				}
				lat := make([]int64, b.N)
				b.ResetTimer()
				for i := range lat {
					t0 := time.Now()
					ask()
					lat[i] = time.Since(t0).Nanoseconds()
				}
				b.StopTimer()
				slices.Sort(lat)
				for _, q := range []struct {
					unit string
					at   float64
				}{{"p50-ns", 0.50}, {"p99-ns", 0.99}, {"p999-ns", 0.999}} {
					b.ReportMetric(float64(lat[min(int(q.at*float64(len(lat))), len(lat)-1)]), q.unit)
				}
			})
		}
	}
}

// pingPong starts a responder goroutine and returns one round trip to it.
func pingPong(b *testing.B) func() {
	req, resp := make(chan struct{}, 1), make(chan struct{}, 1)
	done := make(chan struct{})
	go func() {
		for {
			select {
			case <-req:
			case <-done:
				return
			}
			resp <- struct{}{}
		}
	}()
	b.Cleanup(func() { close(done) })
	return func() {
		req <- struct{}{}
		for spin := 0; spin < 64; spin++ {
			select {
			case <-resp:
				return
			default:
				runtime.Gosched()
			}
		}
		<-resp
	}
}

// streamEvents applies events to e from another goroutine until the returned function
// is called: 16 workers in turn store a 32-block chain and evict it tail first.
func streamEvents(b *testing.B, e *engine.Engine) (stop func()) {
	done := make(chan struct{})
	finished := make(chan error, 1)
	go func() {
		const workers, chain = 16, 32
		blocks := make([]engine.Block, chain)
		for i := 0; ; i++ {
			select {
			case <-done:
				finished <- nil
				return
			default:
			}
			w := fmt.Sprintf("load%d", i%workers)
			for j := range blocks {
				blocks[j] = engine.Block{Content: uint64(1000 + i%7*chain + j), Seq: uint64(j + 1)}
			}
			if err := e.Store(w, blocks); err != nil {
				finished <- err
				return
			}
			for j := chain; j > 0; j-- {
				if err := e.Remove(w, uint64(j)); err != nil {
					finished <- err
					return
				}
			}
		}
	}()
	return func() {
		close(done)
		if err := <-finished; err != nil {
			b.Error(err)
		}
	}
}

// BenchmarkFindMatchesGappy queries a 1,024-block chain that 256 workers hold, each with
// one block missing at its own depth (so every worker has a gap and is scanned position
// by position up to its first missed landing): the shape of a fleet whose engines evict
// blocks from the middle of shared prefixes.
func BenchmarkFindMatchesGappy(b *testing.B) {
	for _, tc := range benchConfigs(2) {
		b.Run(tc.name, func(b *testing.B) {
			e := newEngine(b, tc.cfg)
			const workers, chain = 256, 1024
			blocks := make([]engine.Block, chain)
			q := make([]uint64, chain)
			for i := range blocks {
				blocks[i] = engine.Block{Content: uint64(i + 1), Seq: uint64(i + 1)}
				q[i] = uint64(i + 1)
			}
			for w := 0; w < workers; w++ {
				name := fmt.Sprintf("w%03d", w)
				if err := e.Store(name, blocks); err != nil {
					b.Fatal(err)
				}
				if err := e.Remove(name, uint64(17+3*w)); err != nil { // position 16 + 3w
					b.Fatal(err)
				}
			}
			dst := timeQueries(b, e, q, workers)
			if len(dst) != workers || dst[0].Score != 16+3*(workers-1) {
				b.Fatalf("unexpected answer: %d matches, best %v", len(dst), dst[0])
			}
		})
	}
}

// BenchmarkFindMatchesLongQuery asks a 65,536-block query of an index whose one worker
// holds the first 8 blocks: the query's work should end where the matches end, not grow
// with the query's length.
func BenchmarkFindMatchesLongQuery(b *testing.B) {
	for _, tc := range benchConfigs(2) {
		b.Run(tc.name, func(b *testing.B) {
			e := newEngine(b, tc.cfg)
			q := make([]uint64, 1<<16)
			for i := range q {
				q[i] = uint64(i + 1)
			}
			blocks := make([]engine.Block, 8)
			for i := range blocks {
				blocks[i] = engine.Block{Content: q[i], Seq: uint64(i + 1)}
			}
			if err := e.Store("w", blocks); err != nil {
				b.Fatal(err)
			}
			dst := timeQueries(b, e, q, 1)
			if len(dst) != 1 || dst[0].Score != 8 {
				b.Fatalf("unexpected answer %v", dst)
			}
		})
	}
}

// BenchmarkFindMatchesTiers is BenchmarkFindMatches's fleet with a host tier: each of 64
// workers holds the shared 500 blocks on the device and a host copy of them plus its
// 300-block tail (an offload), so every match folds two components. With gap=true every
// worker's device tier misses block 100, which sends the worker down the fallback that
// reads its own tables.
func BenchmarkFindMatchesTiers(b *testing.B) {
	for _, gap := range []bool{false, true} {
		for _, tc := range benchConfigs(1, 2) {
			b.Run(fmt.Sprintf("gap=%v/%s", gap, tc.name), func(b *testing.B) {
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
					chain := append([]engine.Block(nil), shared...)
					for i := range 300 {
						chain = append(chain, engine.Block{Content: uint64(w*10_000 + i), Seq: uint64(1000 + i)})
					}
					host := engine.Event{Kind: engine.EventStored, Worker: name, Tier: engine.TierHost, Blocks: chain}
					if err := e.Store(name, shared); err != nil {
						b.Fatal(err)
					}
					if err := e.Apply(&host); err != nil {
						b.Fatal(err)
					}
					if gap {
						if err := e.Remove(name, 101); err != nil {
							b.Fatal(err)
						}
					}
				}
				dst := timeQueries(b, e, q, 64)
				want := [3]int{500, 500, 500}
				if gap {
					want[0] = 100
				}
				if len(dst) != 64 || dst[0].Tiers != want {
					b.Fatalf("unexpected answer %v", dst[:1])
				}
			})
		}
	}
}
