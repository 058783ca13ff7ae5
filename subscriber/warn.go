package subscriber

import (
	"time"

	"github.com/kvindex/kvindex/internal/warnlimit"
)

// Warning rate limit (internal/warnlimit): a peer that makes every message a warning
// must not flood the log.
const (
	warnBurst = warnlimit.Burst
	warnEvery = warnlimit.Every
)

// warnLimiter is a worker's warning bucket.
type warnLimiter struct{ warnlimit.Limiter }

func (l *warnLimiter) allow(now time.Time) (bool, uint64) { return l.Allow(now) }

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
