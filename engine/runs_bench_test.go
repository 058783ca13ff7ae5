package engine_test

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/kvindex/kvindex/engine"
	"github.com/kvindex/kvindex/internal/cputime"
)

// BenchmarkEventRuns measures the steady state the trace logs are made of: each of 8
// workers holds 64 chains of 64 blocks (32,768 memberships, the size of the
// conversation log's index; 512k: 1,024 chains each, an index past the caches), and
// each iteration evicts one worker's oldest chain tail
// first (leaf before parent, as vLLM evicts) and stores a new one in its place, all in
// one ApplyBatch. cpu-ns/blockop is the process's CPU time per block op (every
// thread's: the shard goroutines' too), which neighbours' load does not inflate as it
// does the wall clock. per-event sends one removed event per block (what the logs hold);
// coalesced merges the run into one removed event of 64 seqs. Block ops are the stored
// blocks plus the removed seqs.
func BenchmarkEventRuns(b *testing.B) {
	const workers, chain = 8, 64
	for _, tc := range benchConfigs(1) {
		for _, sz := range []struct {
			name   string
			chains int
		}{{"32k", 64}, {"512k", 1024}} {
			for _, coalesced := range []bool{false, true} {
				chains := sz.chains
				b.Run(fmt.Sprintf("%s/memberships=%s/coalesced=%v", tc.name, sz.name, coalesced), func(b *testing.B) {
					e := newEngine(b, tc.cfg)
					r := rand.New(rand.NewPCG(3, 3))
					names := make([]string, workers)
					for i := range names {
						names[i] = fmt.Sprintf("w%d", i)
					}
					next := uint64(1) // the next engine hash
					newChain := func(w string) engine.Event {
						blocks := make([]engine.Block, chain)
						for j := range blocks {
							blocks[j] = engine.Block{Content: r.Uint64(), Seq: next}
							next++
						}
						return engine.Event{Kind: engine.EventStored, Worker: w, Blocks: blocks}
					}
					// held[w] lists the worker's chains, oldest first, by their first seq.
					held := make([][]uint64, workers)
					var evs []engine.Event
					for c := 0; c < chains; c++ {
						for w, name := range names {
							ev := newChain(name)
							held[w] = append(held[w], ev.Blocks[0].Seq)
							evs = append(evs, ev)
						}
					}
					errs := e.ApplyBatch(evs, nil)
					for _, err := range errs {
						if err != nil {
							b.Fatal(err)
						}
					}
					// One iteration's batch, rebuilt in place: the eviction, then the store.
					batch := make([]engine.Event, 0, chain+1)
					seqs := make([]uint64, chain)
					stored := make([]engine.Block, chain)
					b.ReportAllocs()
					b.ResetTimer()
					cpu0, _ := cputime.Process()
					for i := 0; i < b.N; i++ {
						w := i % workers
						first := held[w][0]
						held[w] = append(held[w][1:], next)
						batch = batch[:0]
						for j := range seqs {
							seqs[j] = first + uint64(chain-1-j)
						}
						if coalesced {
							batch = append(batch, engine.Event{Kind: engine.EventRemoved, Worker: names[w], Seqs: seqs})
						} else {
							for j := range seqs {
								batch = append(batch, engine.Event{Kind: engine.EventRemoved, Worker: names[w], Seqs: seqs[j : j+1]})
							}
						}
						for j := range stored {
							stored[j] = engine.Block{Content: r.Uint64(), Seq: next}
							next++
						}
						batch = append(batch, engine.Event{Kind: engine.EventStored, Worker: names[w], Blocks: stored})
						errs = e.ApplyBatch(batch, errs[:0])
						for _, err := range errs {
							if err != nil {
								b.Fatal(err)
							}
						}
					}
					if err := e.Barrier(ctx); err != nil {
						b.Fatal(err)
					}
					cpu1, ok := cputime.Process()
					ops := float64(2 * chain * b.N)
					b.ReportMetric(ops/b.Elapsed().Seconds()/1e6, "Mblockops/s")
					if ok {
						b.ReportMetric(float64((cpu1-cpu0).Nanoseconds())/ops, "cpu-ns/blockop")
					}
				})
			}
		}
	}
}
