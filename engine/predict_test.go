package engine_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvindex/kvindex/engine"
	"github.com/kvindex/kvindex/internal/testsize"
	"github.com/stretchr/testify/require"
)

// fakeClock is an injectable Config.Clock.
type fakeClock struct{ ns atomic.Int64 }

func (c *fakeClock) now() time.Time          { return time.Unix(0, c.ns.Load()) }
func (c *fakeClock) advance(d time.Duration) { c.ns.Add(int64(d)) }

func newPredEngine(t *testing.T, cfg engine.Config) (*engine.Engine, *fakeClock) {
	c := &fakeClock{}
	c.ns.Store(int64(time.Hour))
	cfg.Clock = c.now
	return newEngine(t, cfg), c
}

func match(t *testing.T, e *engine.Engine, ns string, q ...uint64) []engine.Match {
	t.Helper()
	require.NoError(t, e.Barrier(ctx))
	got, err := e.FindMatchesIn(ctx, ns, q, nil)
	require.NoError(t, err)
	return got
}

func chain(seq0 uint64, content ...uint64) []engine.Block {
	b := make([]engine.Block, len(content))
	for i, c := range content {
		b[i] = engine.Block{Content: c, Seq: seq0 + uint64(i)}
	}
	return b
}

func TestPredictThenConfirm(t *testing.T) {
	e, _ := newPredEngine(t, engine.Config{Shards: 2})
	require.NoError(t, e.Predict(ctx, "w1", "", []uint64{1, 2, 3}, time.Second))
	// Known only through its prediction: size 0, all of the score predicted.
	require.Equal(t, []engine.Match{{Worker: "w1", Score: 3, Predicted: 3, Tiers: [3]int{3, 3, 3}}}, match(t, e, "", 1, 2, 3, 4))
	require.Equal(t, []engine.Match{{Worker: "w1", Score: 2, Predicted: 2, Tiers: [3]int{2, 2, 2}}}, match(t, e, "", 1, 2, 9))
	require.Empty(t, match(t, e, "", 2, 3))
	// Part of it arrives: the confirmed part is exact, the rest is predicted.
	require.NoError(t, e.Store("w1", chain(10, 1, 2)))
	require.Equal(t, []engine.Match{{Worker: "w1", Score: 3, Size: 2, Predicted: 1, Tiers: [3]int{3, 3, 3}}}, match(t, e, "", 1, 2, 3))
	require.Equal(t, 1, e.PredictionStats().Predictions)
	// The rest arrives: confirmed, the prediction ends.
	require.NoError(t, e.StoreUnder("w1", 11, chain(12, 3)))
	require.Equal(t, []engine.Match{{Worker: "w1", Score: 3, Size: 3, Tiers: [3]int{3, 3, 3}}}, match(t, e, "", 1, 2, 3))
	require.Equal(t, engine.PredictionStats{}, e.PredictionStats())
	// Ended, not merely covered: when a block of it moves away the prediction does not
	// come back.
	require.NoError(t, e.Store("w1", []engine.Block{{Content: 7, Seq: 11}}))
	require.Equal(t, []engine.Match{{Worker: "w1", Score: 1, Size: 3, Tiers: [3]int{1, 1, 1}}}, match(t, e, "", 1, 2, 3))
}

func TestPredictExpiresAndRefreshes(t *testing.T) {
	e, clock := newPredEngine(t, engine.Config{Shards: 1, PredictionTTL: 50 * time.Millisecond})
	require.NoError(t, e.Predict(ctx, "w", "", []uint64{1, 2}, 0)) // the default TTL
	clock.advance(49 * time.Millisecond)
	require.Len(t, match(t, e, "", 1, 2), 1)
	require.NoError(t, e.Predict(ctx, "w", "", []uint64{1, 2}, 0)) // a refresh
	require.Equal(t, 1, e.PredictionStats().Predictions)
	clock.advance(49 * time.Millisecond)
	require.Len(t, match(t, e, "", 1, 2), 1)
	clock.advance(time.Millisecond)
	require.Empty(t, match(t, e, "", 1, 2))
	// The next Predict frees it.
	require.NoError(t, e.Predict(ctx, "v", "", []uint64{5}, time.Second))
	require.Equal(t, engine.PredictionStats{Predictions: 1, Blocks: 1, Workers: 1}, e.PredictionStats())
}

func TestPredictContradicted(t *testing.T) {
	e, _ := newPredEngine(t, engine.Config{Shards: 2})
	require.NoError(t, e.Store("w", chain(10, 1, 2)))
	require.NoError(t, e.Predict(ctx, "w", "", []uint64{1, 2, 3, 4}, time.Second))
	require.Equal(t, []engine.Match{{Worker: "w", Score: 4, Size: 2, Predicted: 2, Tiers: [3]int{4, 4, 4}}}, match(t, e, "", 1, 2, 3, 4))
	require.NoError(t, e.Remove("w", 99)) // not held: nothing contradicted
	require.Equal(t, 4, match(t, e, "", 1, 2, 3, 4)[0].Score)
	require.NoError(t, e.Remove("w", 11)) // a confirmed block of it evicted
	require.Equal(t, []engine.Match{{Worker: "w", Score: 1, Size: 1, Tiers: [3]int{1, 1, 1}}}, match(t, e, "", 1, 2, 3, 4))
	require.Zero(t, e.PredictionStats().Predictions)
}

func TestPredictEndsWithClearAndRemoval(t *testing.T) {
	e, _ := newPredEngine(t, engine.Config{Shards: 2})
	for _, w := range []string{"a", "b", "c", "d"} {
		require.NoError(t, e.Predict(ctx, w, "", []uint64{1, 2}, time.Second))
	}
	require.NoError(t, e.Store("c", chain(1, 5)))
	require.NoError(t, e.Store("d", chain(1, 5)))
	require.NoError(t, e.Clear("a"))        // known only through predictions
	require.NoError(t, e.RemoveWorker("b")) // likewise
	require.NoError(t, e.Clear("c"))
	require.NoError(t, e.RemoveWorker("d"))
	require.Empty(t, match(t, e, "", 1, 2))
	require.Equal(t, engine.PredictionStats{}, e.PredictionStats())
}

func TestPredictBounds(t *testing.T) {
	e, _ := newPredEngine(t, engine.Config{Shards: 1, PredictionsPerWorker: 2, PredictedBlocks: 5})
	require.NoError(t, e.Predict(ctx, "w", "", []uint64{1}, time.Second))
	require.NoError(t, e.Predict(ctx, "w", "", []uint64{2}, time.Second))
	require.NoError(t, e.Predict(ctx, "w", "", []uint64{3}, time.Second)) // ends {1}
	require.Empty(t, match(t, e, "", 1))
	require.Len(t, match(t, e, "", 2), 1)
	require.NoError(t, e.Predict(ctx, "v", "", []uint64{4, 4, 4}, time.Second)) // 5 blocks
	require.NoError(t, e.Predict(ctx, "v", "", []uint64{5}, time.Second))       // ends {2}, the oldest
	require.Empty(t, match(t, e, "", 2))
	require.Len(t, match(t, e, "", 3), 1)
	require.Equal(t, engine.PredictionStats{Predictions: 3, Blocks: 5, Workers: 2}, e.PredictionStats())
	err := e.Predict(ctx, "v", "", []uint64{1, 2, 3, 4, 5, 6}, time.Second)
	require.ErrorIs(t, err, engine.ErrInvalidEvent)
}

func TestPredictRejections(t *testing.T) {
	e, _ := newPredEngine(t, engine.Config{Shards: 1, MaxEventBlocks: 4})
	for _, tc := range []struct {
		worker  string
		content []uint64
		ttl     time.Duration
	}{
		{"", []uint64{1}, time.Second},
		{"w", []uint64{1}, -time.Second},
		{"w", []uint64{1}, engine.MaxPredictionTTL + 1},
		{"w", []uint64{1, 2, 3, 4, 5}, time.Second},
	} {
		err := e.Predict(ctx, tc.worker, "", tc.content, tc.ttl)
		require.ErrorIs(t, err, engine.ErrInvalidEvent, "%+v", tc)
		require.True(t, engine.IsRejection(err))
	}
	require.NoError(t, e.Predict(ctx, "w", "", nil, time.Second)) // a no-op
	require.Equal(t, engine.PredictionStats{}, e.PredictionStats())
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	require.ErrorIs(t, e.Predict(cctx, "w", "", []uint64{1}, time.Second), cctx.Err())
	require.NoError(t, e.Close())
	require.ErrorIs(t, e.Predict(ctx, "w", "", []uint64{1}, time.Second), engine.ErrClosed)
}

func TestPredictNamespaces(t *testing.T) {
	e, _ := newPredEngine(t, engine.Config{Shards: 2})
	require.NoError(t, e.Predict(ctx, "w", "model-a", []uint64{1, 2}, time.Second))
	require.Empty(t, match(t, e, "", 1, 2))
	require.Empty(t, match(t, e, "model-b", 1, 2))
	require.Equal(t, []engine.Match{{Worker: "w", Score: 2, Predicted: 2, Tiers: [3]int{2, 2, 2}}}, match(t, e, "model-a", 1, 2))
	// A store in another namespace confirms nothing.
	require.NoError(t, e.Store("w", chain(1, 1, 2)))
	require.Equal(t, 1, e.PredictionStats().Predictions)
	require.NoError(t, e.Apply(&engine.Event{Kind: engine.EventStored, Worker: "w", Namespace: "model-a", Blocks: chain(5, 1, 2)}))
	require.Zero(t, e.PredictionStats().Predictions)
}

func TestFindMatchesZeroAllocsWithPredictions(t *testing.T) {
	testsize.SkipAllocs(t)
	e, _ := newPredEngine(t, engine.Config{Shards: 2, JumpSize: 8})
	q := make([]uint64, 100)
	for i := range q {
		q[i] = uint64(i)
	}
	for w := 0; w < 8; w++ {
		require.NoError(t, e.Store(fmt.Sprintf("w%d", w), chain(1000, q[:10+5*w]...)))
		require.NoError(t, e.Predict(ctx, fmt.Sprintf("w%d", w), "", q[:20+10*w], time.Minute))
		require.NoError(t, e.Predict(ctx, fmt.Sprintf("p%d", w), "", q[:5+w], time.Minute))
	}
	require.NoError(t, e.Barrier(ctx))
	dst := make([]engine.Match, 0, 32)
	allocs := testing.AllocsPerRun(200, func() {
		var err error
		dst, err = e.FindMatches(ctx, q, dst[:0])
		if err != nil {
			t.Fatal(err)
		}
	})
	require.Len(t, dst, 16)
	require.Equal(t, engine.Match{Worker: "w7", Score: 90, Size: 45, Predicted: 45, Tiers: [3]int{90, 90, 90}}, dst[0])
	require.Zero(t, allocs)
}

// TestPredictConcurrent runs predictions, events and queries of the same workers from
// several goroutines (for -race) and checks the table drains once everything expires,
// on a sharded engine and on the locked index.
func TestPredictConcurrent(t *testing.T) {
	for _, cfg := range []engine.Config{{Shards: 3}, {LockedIndex: true}} {
		t.Run(fmt.Sprintf("locked=%v", cfg.LockedIndex), func(t *testing.T) {
			cfg.PredictionsPerWorker, cfg.PredictedBlocks = 4, 200
			testPredictConcurrent(t, cfg)
		})
	}
}

func testPredictConcurrent(t *testing.T, cfg engine.Config) {
	e, clock := newPredEngine(t, cfg)
	var wg sync.WaitGroup
	for g := 0; g < 4; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			w := fmt.Sprintf("w%d", g%2)
			var dst []engine.Match
			for i := 0; i < 500; i++ {
				var err error
				c := []uint64{1, uint64(i % 7), uint64(i % 5), uint64(g)}
				switch i % 4 {
				case 0:
					err = e.Predict(ctx, w, "", c, time.Duration(1+i%9)*time.Millisecond)
				case 1:
					err = e.Store(w, chain(uint64(g*1000+i), c...))
				case 2:
					err = e.Remove(w, uint64(g*1000+i-1), uint64(g*1000+i-3))
				default:
					dst, err = e.FindMatches(ctx, c, dst[:0])
					for _, m := range dst {
						if m.Score < m.Predicted {
							err = fmt.Errorf("%s: score %d below its %d predicted blocks", m.Worker, m.Score, m.Predicted)
						}
					}
				}
				if err != nil { // (require's FailNow must not run off the test's goroutine)
					t.Errorf("goroutine %d, step %d: %v", g, i, err)
					return
				}
				clock.advance(time.Millisecond / 4)
			}
		}(g)
	}
	wg.Wait()
	clock.advance(time.Second)
	require.NoError(t, e.Predict(ctx, "x", "", []uint64{9}, time.Second)) // frees the expired
	require.Equal(t, engine.PredictionStats{Predictions: 1, Blocks: 1, Workers: 1}, e.PredictionStats())
}

// TestPredictNamespaceChurn: a client naming a new namespace in every prediction (a new
// cache salt per request) never exhausts the namespace table: expired predictions'
// namespaces are dropped by the sweeps, so after 200,000 distinct namespaces (three
// times the 65,536 that once closed the table to predictions for good) every call is
// still accepted and the table holds only the live ones' names.
func TestPredictNamespaceChurn(t *testing.T) {
	e, clock := newPredEngine(t, engine.Config{Shards: 1, NamespaceBytes: 1 << 20})
	require.NoError(t, e.Store("w", chain(1, 1)))
	calls := testsize.Sized(200000, 50000, 20000) // the table turns over many times at each size
	for i := range calls {
		require.NoError(t, e.Predict(ctx, "w", fmt.Sprintf("salt=%d", i), []uint64{1}, 100*time.Millisecond), "call %d", i)
		clock.advance(time.Millisecond)
	}
	st := e.Stats()
	require.Greater(t, st.NamespacesDropped, uint64(calls)*9/10) // about 1,550 namespaces fit in half the budget
	require.LessOrEqual(t, st.NamespaceBytes, int64(1<<20)/2)
	require.Zero(t, st.NamespacesRefused)
}

// TestPredictNamespaceBound: live predictions may fill half the namespace table; a
// prediction in a new namespace past that is refused, known namespaces stay open to
// predictions, and events may still intern theirs in the other half.
func TestPredictNamespaceBound(t *testing.T) {
	e, _ := newPredEngine(t, engine.Config{Shards: 1, NamespaceBytes: 64 << 10, PredictionsPerWorker: engine.MaxPredictionsPerWorker})
	require.NoError(t, e.Store("w", chain(1, 1)))
	n := 0
	for ; ; n++ {
		err := e.Predict(ctx, "w", fmt.Sprintf("salt=%05d", n), []uint64{1}, time.Minute)
		if err != nil {
			require.ErrorIs(t, err, engine.ErrInvalidEvent)
			break
		}
	}
	per := int64(len("salt=00000") + 128)
	require.Equal(t, int64(32<<10)/per, int64(n), "half the table, in names")
	require.NoError(t, e.Predict(ctx, "w", "salt=00007", []uint64{1, 2}, time.Second))
	require.NoError(t, e.Apply(&engine.Event{Kind: engine.EventStored, Worker: "w", Namespace: "salt=from-event", Blocks: chain(5, 3)}))
	require.NoError(t, e.Predict(ctx, "w", "salt=from-event", []uint64{3, 4}, time.Second))
	require.Equal(t, uint64(1), e.Stats().NamespacesRefused)
}

// BenchmarkFindMatchesPredictions measures a query's cost with n predictions sharing its
// first block (8 workers, events for all of them), against none.
func BenchmarkFindMatchesPredictions(b *testing.B) {
	q := make([]uint64, 64)
	for i := range q {
		q[i] = uint64(i)
	}
	for _, n := range []int{0, 64, 512, 4096} {
		b.Run(fmt.Sprintf("predictions=%d", n), func(b *testing.B) {
			e, err := engine.New(engine.Config{Shards: 2, PredictionsPerWorker: engine.MaxPredictionsPerWorker})
			require.NoError(b, err)
			defer e.Close()
			for w := 0; w < 8; w++ {
				require.NoError(b, e.Store(fmt.Sprintf("w%d", w), chain(1000, q[:8+4*w]...)))
			}
			p := make([]uint64, 64)
			copy(p, q)
			for i := 0; i < n; i++ {
				p[32+i%32] = uint64(1000 + i) // distinct predictions sharing 32 blocks
				require.NoError(b, e.Predict(ctx, fmt.Sprintf("w%d", i%8), "", p, time.Minute))
			}
			require.NoError(b, e.Barrier(ctx))
			dst := make([]engine.Match, 0, 16)
			b.ResetTimer()
			for b.Loop() {
				dst, err = e.FindMatches(ctx, q, dst[:0])
				if err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// TestEventZeroAllocsWithPredictions: events of a worker with predictions (checked for
// confirmation and contradiction on every store and removal) and of a worker without
// allocate nothing in steady state.
func TestEventZeroAllocsWithPredictions(t *testing.T) {
	testsize.SkipAllocs(t)
	e, _ := newPredEngine(t, engine.Config{Shards: 2})
	blocks := make([]engine.Block, 32)
	seqs := make([]uint64, 32)
	for i := range blocks {
		blocks[i] = engine.Block{Content: uint64(i % 5), Seq: uint64(7 + i)}
		seqs[i] = uint64(7 + i)
	}
	resident := make([]engine.Block, 64)
	for i := range resident {
		resident[i] = engine.Block{Content: uint64(100 + i), Seq: uint64(5000 + i)}
	}
	for _, w := range []string{"w", "v"} {
		require.NoError(t, e.Store(w, resident))
	}
	// Predictions the events neither confirm nor contradict (they share 8 blocks).
	p := make([]uint64, 12)
	for i := range p {
		p[i] = uint64(i % 5)
	}
	p[10] = 99
	for i := 0; i < 4; i++ {
		p[11] = uint64(i)
		require.NoError(t, e.Predict(ctx, "w", "", p, time.Minute))
	}
	allocs := testing.AllocsPerRun(200, func() {
		for _, w := range []string{"w", "v"} {
			if err := e.Store(w, blocks); err != nil {
				t.Fatal(err)
			}
			for _, s := range seqs[20:] {
				if err := e.Remove(w, s); err != nil {
					t.Fatal(err)
				}
			}
		}
	})
	require.Zero(t, allocs)
	require.Equal(t, 4, e.PredictionStats().Predictions)
}

// TestPredictedIn: a worker's predicted length for a query, whatever its confirmed
// score (FindMatches reports only the part of a prediction beyond the confirmed
// blocks), in the query's namespace, live predictions only, without allocating.
func TestPredictedIn(t *testing.T) {
	e, clock := newPredEngine(t, engine.Config{Shards: 2})
	sorted := func(ps []engine.WorkerPrediction) []engine.WorkerPrediction {
		slices.SortFunc(ps, func(a, b engine.WorkerPrediction) int { return strings.Compare(a.Worker, b.Worker) })
		return ps
	}
	require.Empty(t, e.PredictedIn("", []uint64{1, 2}, nil)) // no prediction at all
	// a: 4 confirmed blocks and a 2-block prediction; b: a prediction only, of 3 blocks
	// of which the query shares 2; c: two predictions, the longer shared one counts;
	// d: another namespace; x: another first block.
	require.NoError(t, e.Store("a", chain(10, 1, 2, 3, 4)))
	require.NoError(t, e.Predict(ctx, "a", "", []uint64{1, 2}, time.Second))
	require.NoError(t, e.Predict(ctx, "b", "", []uint64{1, 2, 7}, time.Second))
	require.NoError(t, e.Predict(ctx, "c", "", []uint64{1, 9}, time.Second))
	require.NoError(t, e.Predict(ctx, "c", "", []uint64{1, 2, 3, 8}, 2*time.Second))
	require.NoError(t, e.Predict(ctx, "d", "ns", []uint64{1, 2, 3, 4}, time.Second))
	require.NoError(t, e.Predict(ctx, "x", "", []uint64{5, 2, 3}, time.Second))
	q := []uint64{1, 2, 3, 4, 5}
	require.Equal(t, []engine.WorkerPrediction{{Worker: "a", Blocks: 2}, {Worker: "b", Blocks: 2}, {Worker: "c", Blocks: 3}},
		sorted(e.PredictedIn("", q, nil)))
	// FindMatches merges: a's confirmed 4 hide its prediction.
	require.Equal(t, engine.Match{Worker: "a", Score: 4, Size: 4, Tiers: [3]int{4, 4, 4}}, match(t, e, "", q...)[0])
	require.Equal(t, []engine.WorkerPrediction{{Worker: "d", Blocks: 4}}, e.PredictedIn("ns", q, nil))
	require.Empty(t, e.PredictedIn("nowhere", q, nil))
	require.Empty(t, e.PredictedIn("", nil, nil))
	// dst is appended to.
	got := e.PredictedIn("ns", q, []engine.WorkerPrediction{{Worker: "keep", Blocks: 9}})
	require.Equal(t, []engine.WorkerPrediction{{Worker: "keep", Blocks: 9}, {Worker: "d", Blocks: 4}}, got)
	// Expired predictions do not count: c's longer one outlives the others.
	clock.advance(time.Second)
	require.Equal(t, []engine.WorkerPrediction{{Worker: "c", Blocks: 3}}, e.PredictedIn("", q, nil))
	if testsize.AllocsMeasured {
		dst := make([]engine.WorkerPrediction, 0, 8)
		require.Zero(t, testing.AllocsPerRun(100, func() { dst = e.PredictedIn("", q, dst[:0]) }))
	}
}
