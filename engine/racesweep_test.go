package engine

import (
	"os"
	"sync"
	"testing"

	"github.com/kvindex/kvindex/shard"
)

// The deliberately racy half of TestOwnersRace (owners_race_test.go), run only in the
// child processes it starts (raceSweepChild set), under the race detector: each subtest has two
// goroutines that are not the owner of one piece of state (package doc, "Ownership
// rules") touch it at once, which the detector must report; "control" does the same
// work as the owner (under the worker's mutex), which it must not.

// racePair runs f(0) and f(1) on two goroutines at once, with nothing ordering them.
func racePair(f func(i int)) {
	var wg sync.WaitGroup
	for i := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			f(i)
		}()
	}
	wg.Wait()
}

func TestRaceSweep(t *testing.T) {
	if os.Getenv(raceSweepChild) == "" {
		t.Skip("run by TestOwnersRace in a child process, under the race detector")
	}
	newEngine := func(t *testing.T, cfg Config) *Engine {
		e, err := New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { e.Close() })
		if err := e.Store("w", []Block{{Content: 1, Seq: 1}}); err != nil {
			t.Fatal(err)
		}
		return e
	}
	store := func(i int) Event {
		return Event{Kind: EventStored, Worker: "w", Blocks: []Block{{Content: uint64(100 + i), Seq: uint64(100 + i)}}}
	}
	// unstore removes the block newEngine stored, which a query of content 1 reads
	// (HeldRun): the removal writes what the query reads whichever goes first (a store
	// of another root wrote key-index slots the query may not read, and the detector
	// missed a quarter of the sweeps).
	unstore := func() Event { return Event{Kind: EventRemoved, Worker: "w", Seqs: []uint64{1}} }
	// A worker's bookkeeping belongs to the holder of its mutex: two event appliers
	// without it.
	t.Run("worker", func(t *testing.T) {
		e := newEngine(t, Config{Shards: 1})
		w := e.lookup("w")
		w.SetOutbox(e.getOutbox())
		racePair(func(i int) {
			ev := store(i)
			_, _ = e.applyLocked(w, &ev)
		})
	})
	// The same two appliers, each holding the worker's mutex: no race.
	t.Run("control", func(t *testing.T) {
		e := newEngine(t, Config{Shards: 1})
		racePair(func(i int) {
			ev := store(i)
			w := e.lockLive("w", false, nil, e.getOutbox())
			_, _ = e.applyLocked(w, &ev)
			_ = e.flush(w)
			e.unlock(w)
		})
		// On the locked index: an applier (write lock) beside a query reading the
		// worker's tables under the read lock.
		e = newEngine(t, Config{LockedIndex: true})
		racePair(func(i int) {
			if i == 1 {
				e.locked.RLock()
				_ = e.lookup("w").HeldRun(&e.env, 0, 0, []uint64{1}, false)
				e.locked.RUnlock()
				return
			}
			ev := unstore()
			w := e.lockLive("w", false, nil, e.getOutbox())
			_, _ = e.applyLocked(w, &ev)
			_ = e.flush(w)
			e.unlock(w)
		})
	})
	// A shard's table belongs to the holder of its token: two writers without it.
	t.Run("shard-table", func(t *testing.T) {
		x := shard.New(16)
		racePair(func(i int) { x.Add(uint64(i+1)<<40, uint32(i)) })
	})
	// On the locked index a worker's tables belong to the holder of its mutex and the
	// index's write lock, which a query's read lock excludes: an applier with the
	// worker's mutex alone beside a query reading them (walkSparse).
	t.Run("locked-tables", func(t *testing.T) {
		e := newEngine(t, Config{LockedIndex: true})
		w := e.lookup("w")
		racePair(func(i int) {
			if i == 1 {
				e.locked.RLock()
				_ = w.HeldRun(&e.env, 0, 0, []uint64{1}, false)
				e.locked.RUnlock()
				return
			}
			w.Lock()
			w.SetOutbox(e.getOutbox())
			ev := unstore()
			_, _ = e.applyLocked(w, &ev)
			w.Unlock()
		})
	})
	// The prediction table belongs to the holder of its mutex: two writers without it.
	t.Run("predictions", func(t *testing.T) {
		e := newEngine(t, Config{Shards: 1})
		racePair(func(i int) {
			c := []uint64{uint64(i + 1)}
			e.preds.Insert("w", 0, c, c, uint64(i+1), 0, 1<<62, 16, 1<<10)
		})
	})
	// The worker registry's ids belong to the holder of regMu: two allocators without it.
	t.Run("registry", func(t *testing.T) {
		e := newEngine(t, Config{Shards: 1})
		racePair(func(int) { e.allocIDLocked() })
	})
}
