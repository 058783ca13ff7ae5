package subscriber

import (
	"context"
	"fmt"
	"sync/atomic"
)

// MaxReplayLimit bounds NewReplayLimiter's n.
const MaxReplayLimit = 1 << 16

// ReplayLimiter bounds the replays that run at once across the Subscribers that share
// it (Config.Replays). After a stall of the process (a GC pause, a SIGSTOP, a network
// partition) every subscriber of a fleet finds a gap in the same instant, and each
// replay dials a connection, starts zmq4's goroutines and holds a reply buffer: at
// 2,048 engines that was 2,048 connections and about 8,000 goroutines opened at once,
// competing with the live streams for the CPU until replays ran out of ReplayTimeout
// and their workers were invalidated (bench/fleet, kvindex loadtest --stall). A
// replay waits for a slot before it dials, and its ReplayTimeout runs from then: the
// wait is for this process, the timeout for the engine. Safe for concurrent use.
type ReplayLimiter struct {
	slots   chan struct{}
	waiting atomic.Int64
	waited  atomic.Uint64
}

// NewReplayLimiter returns a limiter of n replays at once (1..MaxReplayLimit).
func NewReplayLimiter(n int) (*ReplayLimiter, error) {
	if n < 1 || n > MaxReplayLimit {
		return nil, fmt.Errorf("%w: replay limit %d (want 1..%d)", ErrConfig, n, MaxReplayLimit)
	}
	return &ReplayLimiter{slots: make(chan struct{}, n)}, nil
}

// acquire waits for a slot (or ctx); release gives it back.
func (l *ReplayLimiter) acquire(ctx context.Context) error {
	select {
	case l.slots <- struct{}{}:
		return nil
	default:
	}
	l.waited.Add(1)
	l.waiting.Add(1)
	defer l.waiting.Add(-1)
	select {
	case l.slots <- struct{}{}:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (l *ReplayLimiter) release() { <-l.slots }

// ReplayLimiterStats are a limiter's counters.
type ReplayLimiterStats struct {
	Limit   int    // replays at once
	Running int    // replays holding a slot now
	Waiting int    // replays waiting for one now
	Waited  uint64 // replays that had to wait, since the start
}

// Stats returns the limiter's counters.
func (l *ReplayLimiter) Stats() ReplayLimiterStats {
	return ReplayLimiterStats{Limit: cap(l.slots), Running: len(l.slots), Waiting: int(l.waiting.Load()), Waited: l.waited.Load()}
}
