package subscriber

import (
	"testing"

	"github.com/kvindex/kvindex/engine"
	"github.com/kvindex/kvindex/internal/cputime"
)

// ingestBatches records n batches of the shape `kvindex loadtest`'s engines publish:
// each stores 13 blocks of 16 tokens that extend one of a few conversations (a root
// every 8th batch), and once the engine holds 4,096 blocks it first removes the 13 it
// stored longest ago. The payloads are encoded once, before anything is timed.
func ingestBatches(n int) [][]byte {
	const per, bs, hold = 13, 16, 4096
	var out [][]byte
	var held []uint64 // in store order: the oldest first
	next := uint64(1)
	last := uint64(0) // the last block stored: the next store's parent
	for b := range n {
		var evs []ev
		if len(held) >= hold {
			evs = append(evs, ev{kind: "removed", seqs: append([]uint64(nil), held[:per]...)})
			held = held[per:]
		}
		st := ev{kind: "stored", bs: bs}
		if b%8 != 0 && last != 0 {
			st.parent, st.hasParent = last, true
		}
		for range per {
			seq := next*0x9e3779b97f4a7c15 | 1
			st.seqs = append(st.seqs, seq)
			for t := range bs {
				st.tokens = append(st.tokens, uint32((next*31+uint64(t))%150000))
			}
			held = append(held, seq)
			next++
		}
		last = st.seqs[len(st.seqs)-1] // held: removals take the oldest blocks
		evs = append(evs, st)
		out = append(out, batch(evs...))
	}
	return out
}

// BenchmarkIngest is the subscriber's ingest path from a batch's payload to the index:
// decode, checks, diagnosis, one Apply per event. The batches come from memory
// (ingestBatches), so no socket, ZMTP framing or scheduling is measured; "nop" applies
// to an index that does nothing (the subscriber's own cost), "locked" and "sharded" to
// a fresh engine (Config.LockedIndex, and the default shards). Reported: wall ns per
// batch and batches per second, the process's CPU time per batch (every thread's: a
// sharded engine's shard goroutines count; other jobs on the machine do not), and
// allocations per batch.
//
//	go test -run '^$' -bench Ingest -benchtime 20000x -count 3 ./subscriber/
func BenchmarkIngest(b *testing.B) {
	payloads := ingestBatches(8192)
	for _, mode := range []string{"nop", "locked", "sharded"} {
		b.Run(mode, func(b *testing.B) {
			var idx Index = nopIdx{}
			if mode != "nop" {
				e, err := engine.New(engine.Config{LockedIndex: mode == "locked"})
				if err != nil {
					b.Fatal(err)
				}
				defer e.Close()
				idx = e
			}
			s, err := New(Config{Endpoint: "tcp://127.0.0.1:1", Worker: "w", Index: idx, BlockSize: 16})
			if err != nil {
				b.Fatal(err)
			}
			b.ReportAllocs()
			seq := uint64(0)
			c0, cpuOK := cputime.Process()
			for b.Loop() {
				if err := s.applyBatch(seq, payloads[seq%uint64(len(payloads))]); err != nil {
					b.Fatal(err)
				}
				seq++
				if seq%uint64(len(payloads)) == 0 {
					b.StopTimer() // a new round of the same batches: start from an empty worker
					if err := idx.Apply(&engine.Event{Kind: engine.EventCleared, Worker: "w"}); err != nil {
						b.Fatal(err)
					}
					b.StartTimer()
				}
			}
			b.StopTimer()
			if c1, ok := cputime.Process(); ok && cpuOK {
				// (the clears between rounds count too: one per 8,192 batches)
				b.ReportMetric(float64((c1-c0).Nanoseconds())/float64(b.N), "cpu-ns/batch")
			}
			if r := s.local.Rejected; r != ([NumReasons]uint64{}) {
				b.Fatalf("rejections %v", r)
			}
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "batches/s")
		})
	}
}
