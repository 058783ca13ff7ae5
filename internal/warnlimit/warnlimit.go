// Package warnlimit rate-limits warnings that a peer can make one per message (a hostile
// replay socket, a stream of undecodable batches or fabric messages), so that it cannot
// flood the log: up to Burst warnings pass at once, then one per Every; the next warning
// that passes says how many were suppressed. The subscribers and the fabric replica use
// it.
package warnlimit

import (
	"sync"
	"time"
)

// The bucket's size and refill.
const (
	Burst = 20
	Every = time.Second
)

// Limiter is a token bucket; its zero value is ready and full, and it is safe for
// concurrent use.
type Limiter struct {
	mu         sync.Mutex
	tokens     float64
	last       time.Time
	suppressed uint64
}

// Allow takes a token at now; it returns whether to log and how many warnings were
// suppressed since the last one logged.
func (l *Limiter) Allow(now time.Time) (bool, uint64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.last.IsZero() {
		l.tokens = Burst
	} else if d := now.Sub(l.last); d > 0 {
		l.tokens = min(Burst, l.tokens+float64(d)/float64(Every))
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
