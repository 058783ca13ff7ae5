package engine_test

import (
	"fmt"
	"math/rand/v2"
	"os"
	"runtime"
	"sync"
	"testing"

	"github.com/kvindex/kvindex/engine"
	"github.com/kvindex/kvindex/internal/oplog"
	"github.com/kvindex/kvindex/internal/refmodel"
	"github.com/kvindex/kvindex/internal/testsize"
	"github.com/stretchr/testify/require"
)

// TestStress runs many producer goroutines (each owning some workers, so per-worker
// order holds) against many query goroutines, on rings of capacity 2 so backpressure
// always engages, at every shard count and jump size, with a random GOMAXPROCS. After a
// barrier the engine must equal the reference model on every query of the history.
// KVINDEX_STRESS=long (make stress) makes it much longer. make test runs it under the
// detector with the invariant checks: histories of 300 ops, on half the pairs of shard
// count and jump (each shard count and each jump in some); make test-long runs 1,500
// on every pair.
func TestStress(t *testing.T) {
	ops, rounds := testsize.Sized(1500, 700, 300), 1
	if os.Getenv("KVINDEX_STRESS") == "long" {
		ops, rounds = 20000, 3
	} else if testing.Short() && ops > 600 {
		ops = 600
	}
	seed := uint64(os.Getpid())
	t.Logf("seed %d", seed)
	r := rand.New(rand.NewPCG(seed, 1))
	for round := 0; round < rounds; round++ {
		for si, shards := range []int{0, 1, 2, 3, 4, 8} { // 0: the locked index
			for ji, jump := range []int{1, 4, 64} {
				if !testsize.Full() && (si+ji)%2 == 1 {
					continue // reduced sizes: half the pairs, every shard count and jump still
				}
				procs := 1 + r.IntN(4)
				hist := refmodel.RandomOps(rand.New(rand.NewPCG(seed, uint64(round*100+shards*10+jump))), ops,
					refmodel.RandomOptions{Workers: 12, Alphabet: 3, MaxChain: 100, Tiers: jump == 4}) // tiers: a third of the runs
				cfg := engine.Config{Shards: shards, JumpSize: jump, QueueSize: 2, QueryQueue: 1}
				mode := fmt.Sprintf("shards=%d", shards)
				if shards == 0 {
					cfg, mode = engine.Config{LockedIndex: true, JumpSize: jump}, "locked"
				}
				name := fmt.Sprintf("round=%d/%s/jump=%d/procs=%d", round, mode, jump, procs)
				t.Run(name, func(t *testing.T) {
					defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(procs))
					stress(t, cfg, hist, 4, 4)
				})
			}
		}
	}
}

// TestStressLocked is TestStress on the locked index alone, run by make test without
// the race detector (its plain-index phase): a race build's locked index takes a
// sync.RWMutex (package internal/rwlock), so this is where the engine's producers and
// queriers meet the lock it runs in production.
func TestStressLocked(t *testing.T) {
	ops := testsize.Sized(3000, 1500, 600)
	seed := uint64(os.Getpid())
	t.Logf("seed %d", seed)
	for _, jump := range []int{1, 4, 64} {
		for _, procs := range []int{1, 2, 4} {
			hist := refmodel.RandomOps(rand.New(rand.NewPCG(seed, uint64(jump*10+procs))), ops,
				refmodel.RandomOptions{Workers: 12, Alphabet: 3, MaxChain: 100, Tiers: jump == 4})
			t.Run(fmt.Sprintf("jump=%d/procs=%d", jump, procs), func(t *testing.T) {
				defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(procs))
				stress(t, engine.Config{LockedIndex: true, JumpSize: jump}, hist, 4, 4)
			})
		}
	}
}

func stress(t *testing.T, cfg engine.Config, hist []oplog.Op, producers, readers int) {
	e := newEngine(t, cfg)
	// Split events by worker; producer p owns workers whose index % producers == p.
	byWorker := map[string][]oplog.Op{}
	var names []string
	var queries [][]uint64
	m := refmodel.New()
	for i := range hist {
		op := &hist[i]
		if op.Kind == oplog.Query {
			queries = append(queries, op.Content)
			continue
		}
		if _, ok := byWorker[op.Worker]; !ok {
			names = append(names, op.Worker)
		}
		byWorker[op.Worker] = append(byWorker[op.Worker], *op)
		_ = m.Apply(op)
	}
	var wg sync.WaitGroup
	errs := make(chan error, producers+readers)
	stop := make(chan struct{})
	for p := 0; p < producers; p++ {
		wg.Add(1)
		go func(p int) {
			defer wg.Done()
			for i, n := range names {
				if i%producers != p {
					continue
				}
				for j := range byWorker[n] {
					err := applyOp(e, &byWorker[n][j])
					if err != nil && !engine.IsRejection(err) {
						errs <- fmt.Errorf("producer %d: %w", p, err)
						return
					}
				}
			}
		}(p)
	}
	var rwg sync.WaitGroup
	for q := 0; q < readers; q++ {
		rwg.Add(1)
		go func(q int) {
			defer rwg.Done()
			var dst []engine.Match
			for i := q; ; i = (i + readers) % max(len(queries), 1) {
				select {
				case <-stop:
					return
				default:
				}
				if len(queries) == 0 {
					return
				}
				var err error
				if dst, err = e.FindMatches(ctx, queries[i], dst[:0]); err != nil {
					errs <- fmt.Errorf("reader %d: %w", q, err)
					return
				}
				if i%7 == 0 {
					if err := e.Barrier(ctx); err != nil {
						errs <- err
						return
					}
				}
			}
		}(q)
	}
	wg.Wait()
	close(stop)
	rwg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	require.NoError(t, e.Barrier(ctx))
	// At rest, the readers ask again, all at once, and each checks every answer against
	// the model: concurrent queries must not disturb each other's answers.
	want := make([][]refmodel.Answer, len(queries))
	for i, q := range queries {
		want[i] = m.Query(q)
	}
	errs = make(chan error, readers)
	for q := 0; q < readers; q++ {
		rwg.Add(1)
		go func(q int) {
			defer rwg.Done()
			var got []engine.Match
			for i := q; i < len(queries); i += readers {
				var err error
				if got, err = e.FindMatches(ctx, queries[i], got[:0]); err != nil {
					errs <- fmt.Errorf("reader %d: %w", q, err)
					return
				}
				if err := sameAnswer(want[i], got); err != nil {
					errs <- fmt.Errorf("reader %d, query %v: %w", q, queries[i], err)
					return
				}
			}
		}(q)
	}
	rwg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	st := e.Stats()
	require.Equal(t, int64(m.Blocks()), st.Blocks)
	t.Logf("producer waits %d (%d ns), events %d", st.ProducerWaits, st.ProducerWaitNanos, st.Events)
}
