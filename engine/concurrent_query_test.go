package engine_test

import (
	"context"
	"fmt"
	"sync"
	"testing"

	"github.com/kvindex/kvindex/engine"
	"github.com/kvindex/kvindex/internal/refmodel"
	"github.com/kvindex/kvindex/internal/testsize"
	"github.com/stretchr/testify/require"
)

// TestConcurrentGappyQueries holds concurrent queries to the model at rest in every
// mode: three workers hold one 64-block chain, each with one block removed near
// position 40, so each is gappy past the locked walk's limit and round 2 scans all
// three in one cluster. Eight goroutines then ask for the whole chain at once. A scan
// whose scratch belonged to the shard (not to the query's batch) mixed the goroutines'
// member lists in locked mode and answered {w0 64} {w1 64} {w2 41}; -race reports it.
func TestConcurrentGappyQueries(t *testing.T) {
	const n = 64
	h := newChainHistory(n, 0x5eed)
	for i, w := range []string{"w0", "w1", "w2"} {
		h.store(w, h.content)
		h.remove(w, 39+i)
	}
	m := refmodel.New()
	for i := range h.ops {
		require.NoError(t, m.Apply(&h.ops[i]))
	}
	want := m.Query(h.content)
	require.Len(t, want, 3)
	modes := []struct {
		name string
		cfg  engine.Config
	}{
		{"locked", engine.Config{LockedIndex: true}},
		{"shards=1", engine.Config{Shards: 1}},
		{"shards=2", engine.Config{Shards: 2}},
		{"shards=4", engine.Config{Shards: 4}},
	}
	for _, mode := range modes {
		t.Run(mode.name, func(t *testing.T) {
			e := newEngine(t, mode.cfg)
			for i := range h.ops {
				require.NoError(t, applyOp(e, &h.ops[i]))
			}
			ctx := context.Background()
			require.NoError(t, e.Barrier(ctx))
			goroutines, calls := 8, testsize.Sized(2000, 1000, 100)
			var wg sync.WaitGroup
			errs := make(chan error, goroutines)
			for g := 0; g < goroutines; g++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					var got []engine.Match
					for i := 0; i < calls; i++ {
						var err error
						if got, err = e.FindMatches(ctx, h.content, got[:0]); err != nil {
							errs <- err
							return
						}
						if err := sameAnswer(want, got); err != nil {
							errs <- fmt.Errorf("call %d: %w", i, err)
							return
						}
					}
				}()
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				require.NoError(t, err)
			}
		})
	}
}

// sameAnswer reports how got differs from the model's answer want.
func sameAnswer(want []refmodel.Answer, got []engine.Match) error {
	if len(want) != len(got) {
		return fmt.Errorf("want %v, got %v", want, got)
	}
	for j := range want {
		if a := refmodel.Answer(got[j]); a != want[j] {
			return fmt.Errorf("want %v, got %v", want, got)
		}
	}
	return nil
}
