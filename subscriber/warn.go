package subscriber

import (
	"sync"
	"time"
)

// Warning rate limit: a peer that makes every message a warning (a hostile replay
// socket, a stream of undecodable batches) must not flood the log. Up to warnBurst
// warnings pass at once, then one per warnEvery; the next warning that passes says how
// many were suppressed.
const (
	warnBurst = 20
	warnEvery = time.Second
)

// warnLimiter is a token bucket; safe for concurrent use (the guard reports refusals
// from zmq4's goroutines).
type warnLimiter struct {
	mu         sync.Mutex
	tokens     float64
	last       time.Time
	suppressed uint64
}

// allow takes a token at now; it returns whether to log and how many warnings were
// suppressed since the last one logged.
func (l *warnLimiter) allow(now time.Time) (bool, uint64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.last.IsZero() {
		l.tokens = warnBurst
	} else if d := now.Sub(l.last); d > 0 {
		l.tokens = min(warnBurst, l.tokens+float64(d)/float64(warnEvery))
	}
	l.last = now
	if l.tokens < 1 {
		l.suppressed++
		return false, 0
	}
	l.tokens--
	n := l.suppressed
	l.suppressed = 0
	return true, n
}

// warn logs a warning about this worker, rate-limited.
func (s *Subscriber) warn(msg string, args ...any) {
	ok, suppressed := s.warns.allow(time.Now())
	if !ok {
		return
	}
	args = append([]any{"worker", s.cfg.Worker}, args...)
	if suppressed > 0 {
		args = append(args, "suppressed", suppressed)
	}
	s.cfg.Logger.Warn(msg, args...)
}
