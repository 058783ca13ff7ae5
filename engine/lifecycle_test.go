package engine

import (
	"bytes"
	"context"
	"errors"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/kvindex/kvindex/shard"
	"github.com/stretchr/testify/require"
)

// stall blocks shard s until the returned function is called: the shard is handed a
// barrier token whose acknowledgement nobody receives yet. It returns once the shard has
// taken the token from its ring, so the shard answers nothing from then on, and has
// queued one more item behind it (a token nobody waits for), so that the stalled shard
// is behind its ring and a Barrier cannot take its fast path.
func stall(t *testing.T, e *Engine, s int) (release func()) {
	b := &shard.Barrier{Ack: make(chan struct{})}
	require.NoError(t, e.shards[s].Ring().Push(shard.NewDelta(shard.OpBarrier, 0, e.bars.Add(b, 1))))
	deadline := time.Now().Add(10 * time.Second)
	for e.shards[s].Ring().Len() > 0 {
		require.True(t, time.Now().Before(deadline), "shard %d never took the stall token", s)
		runtime.Gosched()
	}
	filler := e.bars.Add(&shard.Barrier{Ack: make(chan struct{}, 1)}, 1)
	e.bars.Drop(filler)
	require.NoError(t, e.shards[s].Ring().Push(shard.NewDelta(shard.OpBarrier, 0, filler)))
	return func() { <-b.Ack }
}

func TestCancelWhileShardIsBusy(t *testing.T) {
	e, err := New(Config{Shards: 1})
	require.NoError(t, err)
	defer e.Close()
	require.NoError(t, e.Store("w", []Block{{Content: 1, Seq: 1}}))
	require.NoError(t, e.Barrier(context.Background()))
	release := sync.OnceFunc(stall(t, e, 0))
	defer release() // before Close (deferred earlier), even when a check below fails

	// The stalled shard cannot answer: the query and the barrier end with their context.
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	_, err = e.FindMatches(ctx, []uint64{1}, nil)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.ErrorIs(t, e.Barrier(ctx), context.DeadlineExceeded)
	require.Equal(t, uint64(1), e.Stats().Abandoned)

	// A context that is already done never reaches a shard.
	done, cancelNow := context.WithCancel(context.Background())
	cancelNow()
	_, err = e.FindMatches(done, []uint64{1}, nil)
	require.ErrorIs(t, err, context.Canceled)
	require.ErrorIs(t, e.Barrier(done), context.Canceled)

	release()
	require.NoError(t, e.Barrier(context.Background()))
	got, err := e.FindMatches(context.Background(), []uint64{1}, nil)
	require.NoError(t, err)
	require.Len(t, got, 1)
}

func TestCloseFailsPendingCalls(t *testing.T) {
	e, err := New(Config{Shards: 2, QueueSize: 2})
	require.NoError(t, err)
	release := stall(t, e, 0)
	produced := make(chan error, 1)
	go func() {
		// Enough deltas to fill the stalled shard's two-slot ring: this producer parks,
		// and stays parked, since the shard cannot pop.
		var err error
		for i := uint64(0); i < 64 && err == nil; i++ {
			err = e.Store("w", []Block{{Content: i, Seq: i}})
		}
		produced <- err
	}()
	others := make(chan error, 2)
	go func() {
		_, err := e.FindMatches(context.Background(), []uint64{1, 2, 3, 4, 5, 6, 7, 8}, nil)
		others <- err
	}()
	go func() { others <- e.Barrier(context.Background()) }()
	deadline := time.Now().Add(10 * time.Second)
	for e.Stats().ProducerWaits == 0 {
		require.True(t, time.Now().Before(deadline), "the producer never parked on the full ring")
		runtime.Gosched()
	}
	// Release the shard only once Close has begun, so that it can drain and exit.
	go func() { <-e.done; release() }()
	require.NoError(t, e.Close())
	require.ErrorIs(t, <-produced, ErrClosed, "a producer parked on a full ring fails with ErrClosed")
	for i := 0; i < 2; i++ {
		// The query and the barrier race Close: either the drained shard answered them
		// first, or they fail with ErrClosed; nothing else, and they must return.
		if err := <-others; err != nil {
			require.ErrorIs(t, err, ErrClosed)
		}
	}
	require.ErrorIs(t, e.Store("w", []Block{{Content: 1, Seq: 1}}), ErrClosed)
}

func TestShardPanicFailsCallersInsteadOfWedging(t *testing.T) {
	e, err := New(Config{Shards: 2})
	require.NoError(t, err)
	defer e.Close()
	// Break the shard's invariant on purpose: remove a membership it never had.
	require.NoError(t, e.shards[1].Ring().Push(shard.NewDelta(shard.OpRemove, 42, 3)))
	err = e.Barrier(context.Background())
	require.ErrorIs(t, err, ErrShardFailed)
	_, err = e.FindMatches(context.Background(), []uint64{1}, nil)
	require.True(t, errors.Is(err, ErrShardFailed), "got %v", err)
	require.ErrorIs(t, e.Store("w", []Block{{Content: 1, Seq: 1}}), ErrShardFailed)
}

// TestSnapshotWritesUsedNamespaces: a snapshot names the namespaces its blocks use,
// numbered in name order, and no other (a namespace whose blocks are gone, whether or
// not a sweep dropped it yet); each restores into its own namespace.
func TestSnapshotWritesUsedNamespaces(t *testing.T) {
	e, err := New(Config{Shards: 1})
	require.NoError(t, err)
	defer e.Close()
	for i, ns := range []string{"lora-c", "lora-a", "lora-gone", "lora-b"} {
		require.NoError(t, e.Apply(&Event{Kind: EventStored, Worker: "w", Namespace: ns, Blocks: []Block{{Content: uint64(i + 1), Seq: uint64(i + 1)}}}))
	}
	require.NoError(t, e.Remove("w", 3))
	names, _, _ := e.captureWorkers()
	require.Equal(t, []string{"lora-a", "lora-b", "lora-c"}, names)

	var buf bytes.Buffer
	require.NoError(t, e.WriteSnapshot(&buf))
	r, err := Restore(Config{Shards: 1}, &buf, 1<<20)
	require.NoError(t, err)
	defer r.Close()
	require.Equal(t, int64(3), r.Stats().Namespaces)
	for i, ns := range []string{"lora-c", "lora-a", "lora-gone", "lora-b", ""} {
		got, err := r.FindMatchesIn(context.Background(), ns, []uint64{uint64(i + 1)}, nil)
		require.NoError(t, err)
		require.Len(t, got, map[bool]int{true: 1, false: 0}[i != 2 && i != 4], ns)
	}
}

// TestWorkerIDReusedOnlyAfterRemovalApplied: a removed worker's id goes to a new worker
// only once every shard has applied the removal; before that, a query would credit the
// old worker's memberships to the new one.
func TestWorkerIDReusedOnlyAfterRemovalApplied(t *testing.T) {
	e, err := New(Config{Shards: 2})
	require.NoError(t, err)
	defer e.Close()
	require.NoError(t, e.Store("a", []Block{{Content: 1, Seq: 1}, {Content: 2, Seq: 2}}))
	old := e.lookup("a").ID()
	release := sync.OnceFunc(stall(t, e, 0))
	defer release()
	require.NoError(t, e.RemoveWorker("a"))
	require.NoError(t, e.Store("b", []Block{{Content: 9, Seq: 9}}))
	require.NotEqual(t, old, e.lookup("b").ID(), "id reused while a shard still holds its removal")
	release()
	require.NoError(t, e.Barrier(context.Background()))
	require.NoError(t, e.Store("c", []Block{{Content: 9, Seq: 9}}))
	require.Equal(t, old, e.lookup("c").ID(), "a retired id is reused")
}

// TestQueryDropsWorkerReplacedMidQuery: a worker removed while a query runs, whose id a
// new worker takes, is not named in the answer with the new worker's blocks. a holds a
// chain deeper than the first wave; once round 1 has made a a candidate, a leaves and b,
// taking a's id, stores the same chain, so the second wave's answers credit the id with
// the whole chain. Without collect's check that the id still names the candidate's
// worker, the answer would give a the whole chain.
func TestQueryDropsWorkerReplacedMidQuery(t *testing.T) {
	e, err := New(Config{Shards: 2})
	require.NoError(t, err)
	defer e.Close()
	SetSpeculation(e, false) // the second wave goes out after the hook, not before
	ctx := context.Background()
	const n = 2 * firstWave
	chain := make([]Block, n)
	content := make([]uint64, n)
	for i := range chain {
		chain[i] = Block{Content: uint64(i + 1), Seq: uint64(i + 1)}
		content[i] = chain[i].Content
	}
	require.NoError(t, e.Store("a", chain))
	require.NoError(t, e.Barrier(ctx))
	calls := 0
	e.hooks.admitted = func() {
		if calls++; calls > 1 {
			return
		}
		require.NoError(t, e.RemoveWorker("a"))
		require.NoError(t, e.Barrier(ctx))
		require.NoError(t, e.Store("b", chain))
		require.NoError(t, e.Barrier(ctx))
	}
	got, err := e.FindMatches(ctx, content, nil)
	require.NoError(t, err)
	require.Equal(t, 1, calls, "the query admitted its candidates once")
	require.Equal(t, uint32(0), e.lookup("b").ID(), "b must have taken a's id for this test to mean anything")
	for _, m := range got {
		require.NotEqual(t, "a", m.Worker, "a left before the second wave: %v", got)
	}
}

// TestBarrierTable: a barrier leaves the table with its last acknowledgement, an
// abandoned one (its context ended) once the shards reach its tokens, and a token whose
// barrier was dropped is acknowledged to nobody.
func TestBarrierTable(t *testing.T) {
	e, err := New(Config{Shards: 3})
	require.NoError(t, err)
	defer e.Close()
	for range 3 {
		// A barrier that takes the slow path (its token through every ring).
		b := &shard.Barrier{Ack: make(chan struct{}, 3)}
		id := e.bars.Add(b, 3)
		for _, s := range e.shards {
			require.NoError(t, s.Ring().Push(shard.NewDelta(shard.OpBarrier, 0, id)))
		}
		for range 3 {
			<-b.Ack
		}
	}
	release := sync.OnceFunc(stall(t, e, 1))
	defer release() // before Close (deferred earlier), even when a check below fails
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	require.ErrorIs(t, e.Barrier(ctx), context.DeadlineExceeded) // shard 1 is stalled
	release()
	require.NoError(t, e.Barrier(context.Background()))
	require.Zero(t, e.bars.Len(), "every token acknowledged, none left in the table")

	id := e.bars.Add(&shard.Barrier{Ack: make(chan struct{})}, 1)
	e.bars.Drop(id)
	require.Nil(t, e.bars.Ack(id))
}

// TestStaleWorkerHint applies events through an outbox whose Last names a worker that
// RemoveWorker has since forgotten (what another processor's pooled outbox may hold):
// the events must reach the live worker of that name, never the removed one.
func TestStaleWorkerHint(t *testing.T) {
	for _, cfg := range []Config{{Shards: 2}, {Shards: 1, LockedIndex: true}} {
		e, err := New(cfg)
		require.NoError(t, err)
		t.Cleanup(func() { _ = e.Close() }) // a failed require leaves no shard goroutine behind
		require.NoError(t, e.Store("w", []Block{{Content: 1, Seq: 1}, {Content: 2, Seq: 2}}))
		old := e.lookup("w")
		require.NotNil(t, old)
		require.NoError(t, e.RemoveWorker("w"))

		out := e.getOutbox()
		out.Last = old
		require.NoError(t, e.applyWith(out, &Event{Kind: EventStored, Worker: "w", Blocks: []Block{{Content: 1, Seq: 7}}}))
		live := e.lookup("w")
		require.NotNil(t, live)
		require.NotSame(t, old, live)
		require.Same(t, live, out.Last)

		out.Last = old
		errs := e.applyBatchWith(out, []Event{
			{Kind: EventStored, Worker: "w", Parent: 7, HasParent: true, Blocks: []Block{{Content: 2, Seq: 8}}},
			{Kind: EventRemoved, Worker: "w", Seqs: []uint64{8}},
			{Kind: EventStored, Worker: "w", Parent: 7, HasParent: true, Blocks: []Block{{Content: 2, Seq: 9}}},
		}, nil)
		require.Equal(t, []error{nil, nil, nil}, errs)
		require.Same(t, live, out.Last)
		e.outboxes.Put(out)

		require.NoError(t, e.Barrier(context.Background()))
		old.Lock()
		require.Zero(t, old.Len(), "the removed worker took an event")
		old.Unlock()
		st := e.Stats()
		require.Equal(t, 1, st.Workers)
		require.Equal(t, int64(2), st.Blocks)
		require.Equal(t, int64(2), st.Memberships)
		ms, err := e.FindMatches(context.Background(), []uint64{1, 2}, nil)
		require.NoError(t, err)
		require.Len(t, ms, 1)
		require.Equal(t, "w", ms[0].Worker)
		require.Equal(t, 2, ms[0].Score)
		require.Equal(t, 2, ms[0].Size)
		require.NoError(t, e.Close())
	}
}
