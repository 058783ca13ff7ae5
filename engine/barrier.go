package engine

import (
	"context"
	"runtime"

	"github.com/kvindex/kvindex/shard"
)

// spinPolls bounds the polling a querier (gather) does before it parks. Waking a parked
// goroutine costs the OS a thread wake-up (tens of microseconds on a busy 2-core
// machine), which would dominate a query's latency; a short poll catches the next probe
// batch while still on the CPU.
const spinPolls = 64

// barrierPolls bounds the polling a Barrier (caughtUp) does before it sends its tokens
// and parks. A barrier waits for the shards' backlog rather than for one probe batch:
// in the ordered replay of the conversation log (a barrier before each of its 750
// checked queries, two shards) 64 polls ran out on 25-35% of the barriers, and each
// such barrier paid a token round trip and two wake-ups; 256 polls (a few tens of
// microseconds, yielding to the shards at each poll) run out on 1-3%.
const barrierPolls = 256

// Barrier returns once every event whose call returned before Barrier was called has
// been applied by every shard: a query that starts after Barrier returns sees all of
// them. It returns ctx.Err() if ctx ends first, or ErrClosed.
func (e *Engine) Barrier(ctx context.Context) error {
	if e.closed.Load() {
		return e.err()
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	if e.cfg.LockedIndex {
		return nil // events are applied before their calls return
	}
	if e.caughtUp() {
		return nil
	}
	b, _ := e.barriers.Get().(*shard.Barrier)
	if b == nil {
		b = &shard.Barrier{Ack: make(chan struct{}, len(e.shards))}
	}
	id := e.bars.Add(b, len(e.shards))
	for _, s := range e.shards {
		if err := s.Ring().Push(shard.NewDelta(shard.OpBarrier, 0, id)); err != nil {
			e.bars.Drop(id) // b is abandoned: a shard that has its token finds no barrier
			return e.err()
		}
	}
	for range e.shards {
		select {
		case <-b.Ack:
		case <-ctx.Done():
			return ctx.Err() // b is abandoned: late acks land in its buffer
		case <-e.done:
			return e.err()
		}
	}
	e.barriers.Put(b)
	return nil
}

// caughtUp reports whether every shard has applied every item its ring held when
// caughtUp was called, polling briefly (as the shards do before they park). It is the
// barrier's fast path: when the shards keep up with the producers, a Barrier costs a
// few atomic loads instead of a token's round trip through every shard and the
// wake-ups of a parked caller. A push that returned before the call reserved a position
// below the ring's Pushes count, and positions are applied in order, so a shard whose
// applied count reaches that target has applied the push.
func (e *Engine) caughtUp() bool {
	var target [MaxShards]uint64
	for i, s := range e.shards {
		target[i] = s.Ring().Stats().Pushes
	}
	for spin := 0; ; spin++ {
		done := true
		for i, s := range e.shards {
			if s.Applied() < target[i] {
				done = false
				break
			}
		}
		if done {
			return true
		}
		if spin == barrierPolls {
			return false
		}
		runtime.Gosched()
	}
}
