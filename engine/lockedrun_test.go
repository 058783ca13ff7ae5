package engine_test

import (
	"context"
	"sync"
	"testing"

	"github.com/kvindex/kvindex/engine"
	"github.com/stretchr/testify/require"
)

// TestLockedRunsAndSingleEvents: on the locked index a single event owns its worker by
// the write lock alone, and a run of events (ApplyBatch) lets the write lock go to
// queries every few hundred block changes while it keeps the worker (its mutex, and the
// worker marked busy). Here one goroutine applies runs that store and evict a
// 300-block chain of worker w (each run lets the write lock go a few times), another
// applies single events that store and evict another chain of w, and readers take
// digests, positions and answers meanwhile. A single event that slipped into a run
// while it let the write lock go would take the run's scratch (its outbox) from under
// it; the worker's tables are checked at the end, and both chains must be held whole.
func TestLockedRunsAndSingleEvents(t *testing.T) {
	e := newEngine(t, engine.Config{LockedIndex: true})
	chain := func(base uint64, n int) []engine.Block {
		b := make([]engine.Block, n)
		for i := range b {
			b[i] = engine.Block{Content: base + uint64(i), Seq: base + uint64(i)}
		}
		return b
	}
	a, b := chain(1_000_000, 300), chain(2_000_000, 20)
	run := make([]engine.Event, 0, 1+len(a))
	run = append(run, engine.Event{Kind: engine.EventStored, Worker: "w", Blocks: a})
	for i := len(a) - 1; i >= 0; i-- {
		run = append(run, engine.Event{Kind: engine.EventRemoved, Worker: "w", Seqs: []uint64{a[i].Seq}})
	}
	const rounds = 60
	var wg sync.WaitGroup
	done := make(chan struct{})
	wg.Go(func() { // runs
		var errs []error
		for range rounds {
			errs = e.ApplyBatch(run, errs[:0])
			for _, err := range errs {
				if err != nil {
					t.Error(err)
					return
				}
			}
		}
		errs = e.ApplyBatch(run[:1], errs[:0]) // end with chain a held
		if errs[0] != nil {
			t.Error(errs[0]) // (not require: this is not the test's goroutine)
		}
	})
	wg.Go(func() { // single events
		for range rounds * 4 {
			if err := e.Store("w", b); err != nil {
				t.Error(err)
				return
			}
			for i := len(b) - 1; i >= 0; i-- {
				if err := e.Remove("w", b[i].Seq); err != nil {
					t.Error(err)
					return
				}
			}
		}
		if err := e.Store("w", b); err != nil { // end with chain b held
			t.Error(err)
		}
	})
	var rwg sync.WaitGroup
	rwg.Go(func() { // readers outside events and queries
		q := []uint64{a[0].Content, a[1].Content, a[2].Content}
		for {
			select {
			case <-done:
				return
			default:
			}
			if _, ok := e.Digest("w"); !ok {
				continue // (not known yet)
			}
			_ = e.Positions()
			if _, err := e.FindMatches(context.Background(), q, nil); err != nil {
				t.Error(err)
				return
			}
		}
	})
	wg.Wait()
	close(done)
	rwg.Wait()
	require.NoError(t, engine.CheckWorkers(e))
	for _, c := range [][]engine.Block{a, b} {
		q := make([]uint64, len(c))
		for i := range c {
			q[i] = c[i].Content
		}
		m, err := e.FindMatches(context.Background(), q, nil)
		require.NoError(t, err)
		require.Len(t, m, 1)
		require.Equal(t, len(c), m[0].Score)
		require.Equal(t, len(a)+len(b), m[0].Size)
	}
}
