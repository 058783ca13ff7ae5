package engine_test

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kvindex/kvindex/engine"
	"github.com/kvindex/kvindex/internal/oplog"
	"github.com/kvindex/kvindex/internal/refmodel"
	"github.com/kvindex/kvindex/internal/replay"
	"github.com/kvindex/kvindex/internal/testsize"
)

// TestNamespacesDropped: once no block uses a namespace, a sweep drops its name (and
// its accounted bytes); a namespace still held, or named by a query since the sweep
// began, stays; a dropped name interned again works as before.
func TestNamespacesDropped(t *testing.T) {
	e := newEngine(t, engine.Config{Shards: 2})
	for i := range 100 {
		require.NoError(t, e.Apply(&engine.Event{Kind: engine.EventStored, Worker: "w", Namespace: fmt.Sprintf("salt=%03d", i),
			Blocks: []engine.Block{{Content: 1, Seq: uint64(i + 1)}}}))
	}
	st := e.Stats()
	require.Equal(t, int64(100), st.Namespaces)
	require.Equal(t, int64(100*(len("salt=000")+128)), st.NamespaceBytes)
	for i := range 99 {
		require.NoError(t, e.Remove("w", uint64(i+1)))
	}
	require.True(t, engine.SweepNamespaces(e))
	st = e.Stats()
	require.Equal(t, int64(1), st.Namespaces, "salt=099 still holds a block")
	require.Equal(t, int64(len("salt=000")+128), st.NamespaceBytes)
	require.Equal(t, uint64(99), st.NamespacesDropped)
	require.Len(t, match(t, e, "salt=099", 1), 1)
	require.Empty(t, match(t, e, "salt=000", 1))

	// Dropped names come back with ids the last sweep freed, and answer in their own
	// namespace only.
	for round := range 3 {
		for i := range 50 {
			require.NoError(t, e.Apply(&engine.Event{Kind: engine.EventStored, Worker: fmt.Sprintf("v%d", round), Namespace: fmt.Sprintf("salt=%03d", i),
				Blocks: []engine.Block{{Content: uint64(10 + i), Seq: uint64(i + 1)}}}))
		}
		for i := range 50 {
			require.Equal(t, []string{fmt.Sprintf("v%d", round)}, workers(match(t, e, fmt.Sprintf("salt=%03d", i), uint64(10+i))), "round %d, salt %d", round, i)
			require.Empty(t, match(t, e, fmt.Sprintf("salt=%03d", i), uint64(10+(i+1)%50)))
		}
		require.NoError(t, e.Apply(&engine.Event{Kind: engine.EventCleared, Worker: fmt.Sprintf("v%d", round)}))
		require.True(t, engine.SweepNamespaces(e))
		require.Equal(t, int64(1), e.Stats().Namespaces)
	}
}

func workers(ms []engine.Match) []string {
	var out []string
	for _, m := range ms {
		out = append(out, m.Worker)
	}
	return out
}

// TestNamespaceBoundEvents: a stored event that would intern a name past
// Config.NamespaceBytes is rejected and counted, the others go on; once the names are
// unused, the next sweep (which the refusal asks for) makes room again.
func TestNamespaceBoundEvents(t *testing.T) {
	clock := &fakeClock{}
	e := newEngine(t, engine.Config{Shards: 1, NamespaceBytes: 4 << 10, Clock: clock.now})
	per := len("salt=00") + 128
	fit := (4 << 10) / per
	for i := range fit {
		require.NoError(t, e.Apply(&engine.Event{Kind: engine.EventStored, Worker: "w", Namespace: fmt.Sprintf("salt=%02d", i),
			Blocks: []engine.Block{{Content: 1, Seq: uint64(i + 1)}}}))
	}
	full := &engine.Event{Kind: engine.EventStored, Worker: "w", Namespace: "salt=xx", Blocks: []engine.Block{{Content: 1, Seq: 999}}}
	require.ErrorIs(t, e.Apply(full), engine.ErrInvalidEvent)
	require.NoError(t, e.Store("w", []engine.Block{{Content: 1, Seq: 1000}}), "the default namespace needs no name")
	st := e.Stats()
	require.Equal(t, uint64(1), st.NamespacesRefused)
	require.LessOrEqual(t, st.NamespaceBytes, int64(4<<10))
	require.Empty(t, match(t, e, "salt=xx", 1))
	require.NoError(t, e.Apply(&engine.Event{Kind: engine.EventCleared, Worker: "w"}))
	// The names are unused now. The event that meets the full table is refused, and the
	// sweep it asks for runs once the call is done (a second after the last sweep).
	clock.advance(2 * time.Second)
	require.ErrorIs(t, e.Apply(full), engine.ErrInvalidEvent)
	require.NoError(t, e.Apply(full))
	require.Equal(t, int64(1), e.Stats().Namespaces)
	require.Len(t, match(t, e, "salt=xx", 1), 1)

	// A snapshot whose names do not fit a restoring engine's bound is refused.
	var snap bytes.Buffer
	require.NoError(t, e.WriteSnapshot(&snap))
	r, err := engine.RestoreBytes(engine.Config{Shards: 1, NamespaceBytes: 1 << 10}, snap.Bytes())
	require.NoError(t, err)
	r.Close()
	big := newEngine(t, engine.Config{Shards: 1})
	for i := range 20 {
		require.NoError(t, big.Apply(&engine.Event{Kind: engine.EventStored, Worker: "w", Namespace: fmt.Sprintf("salt=%02d", i),
			Blocks: []engine.Block{{Content: 1, Seq: uint64(i + 1)}}}))
	}
	snap.Reset()
	require.NoError(t, big.WriteSnapshot(&snap))
	_, err = engine.RestoreBytes(engine.Config{Shards: 1, NamespaceBytes: 1 << 10}, snap.Bytes())
	require.ErrorIs(t, err, engine.ErrSnapshot)
	require.ErrorContains(t, err, "NamespaceBytes")
}

// TestSweepDifferential: an engine swept after every event answers every query in
// every namespace as one never swept, and snapshots to the same bytes, on random
// histories whose workers move to a new namespace at each clear (so names fall out of
// use, are dropped, and their ids go to others).
func TestSweepDifferential(t *testing.T) {
	for seed := uint64(1); seed <= 3; seed++ {
		ops := refmodel.RandomOps(rand.New(rand.NewPCG(seed, 23)), testsize.Sized(2500, 1200, 600), refmodel.RandomOptions{MaxChain: 40, Tiers: seed == 2})
		cfg := engine.Config{Shards: 2, JumpSize: 4, SpecChain: true}
		swept, plain := newEngine(t, cfg), newEngine(t, cfg)
		gen := map[string]int{}
		nsOf := func(w string) string {
			if gen[w]%3 == 2 {
				return "" // the default namespace now and then
			}
			return fmt.Sprintf("salt=%s-%d", w, gen[w])
		}
		seen := map[string]bool{"": true}
		for i := range ops {
			op := &ops[i]
			if op.Kind == oplog.Query {
				for ns := range seen {
					a, err := swept.FindMatchesIn(ctx, ns, op.Content, nil)
					require.NoError(t, err)
					b, err := plain.FindMatchesIn(ctx, ns, op.Content, nil)
					require.NoError(t, err)
					require.Equal(t, b, a, "seed %d, op %d, namespace %q", seed, i, ns)
				}
				continue
			}
			ev := replay.Event(op)
			ev.Namespace = nsOf(op.Worker)
			seen[ev.Namespace] = true
			ea, eb := ev, ev
			errA, errB := swept.Apply(&ea), plain.Apply(&eb)
			require.Equal(t, errB == nil, errA == nil, "seed %d, op %d: %v / %v", seed, i, errA, errB)
			if op.Kind == oplog.Cleared || op.Kind == oplog.RemoveWorker {
				gen[op.Worker]++
			}
			require.NoError(t, swept.Barrier(ctx))
			require.NoError(t, plain.Barrier(ctx))
			engine.SweepNamespaces(swept)
		}
		var a, b bytes.Buffer
		require.NoError(t, swept.WriteSnapshot(&a))
		require.NoError(t, plain.WriteSnapshot(&b))
		require.Equal(t, b.Bytes(), a.Bytes(), "seed %d", seed)
		require.Less(t, swept.Stats().Namespaces, plain.Stats().Namespaces)
	}
}

// TestSweepRacesEvents: producers store every block in a namespace of its own while
// sweeps run back to back and queries name random namespaces; no block is ever lost to
// a dropped name: at the end every block answers in its namespace and the table holds
// exactly their names. Run with -race.
func TestSweepRacesEvents(t *testing.T) {
	e := newEngine(t, engine.Config{Shards: 2})
	const producers, per = 3, 400
	stop := make(chan struct{})
	var bg sync.WaitGroup
	bg.Go(func() {
		for {
			select {
			case <-stop:
				return
			default:
				engine.SweepNamespaces(e)
			}
		}
	})
	bg.Go(func() {
		r := rand.New(rand.NewPCG(1, 2))
		for {
			select {
			case <-stop:
				return
			default:
				_, _ = e.FindMatchesIn(ctx, fmt.Sprintf("salt=%d-%d", r.IntN(producers), r.IntN(per)), []uint64{1}, nil)
			}
		}
	})
	var wg sync.WaitGroup
	for p := range producers {
		wg.Go(func() {
			for i := range per {
				ev := engine.Event{Kind: engine.EventStored, Worker: fmt.Sprintf("w%d", p), Namespace: fmt.Sprintf("salt=%d-%d", p, i),
					Blocks: []engine.Block{{Content: uint64(i + 1), Seq: uint64(i + 1)}}}
				if err := e.Apply(&ev); err != nil {
					panic(err)
				}
				if i%2 == 1 { // every other block goes again: its name falls out of use
					if err := e.Remove(ev.Worker, uint64(i+1)); err != nil {
						panic(err)
					}
				}
			}
		})
	}
	wg.Wait()
	close(stop)
	bg.Wait()
	require.True(t, engine.SweepNamespaces(e))
	for p := range producers {
		for i := 0; i < per; i += 2 {
			require.Equal(t, []string{fmt.Sprintf("w%d", p)}, workers(match(t, e, fmt.Sprintf("salt=%d-%d", p, i), uint64(i+1))), "salt=%d-%d", p, i)
		}
	}
	require.Equal(t, int64(producers*per/2), e.Stats().Namespaces)
}
