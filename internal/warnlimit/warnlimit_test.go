package warnlimit

import (
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestLimiter: Burst warnings pass at once, then one per Every, and the one that passes
// says how many were suppressed.
func TestLimiter(t *testing.T) {
	var l Limiter
	now := time.Unix(100, 0)
	for i := range Burst {
		if ok, _ := l.Allow(now); !ok {
			t.Fatalf("warning %d of the burst suppressed", i)
		}
	}
	for range 3 {
		if ok, _ := l.Allow(now); ok {
			t.Fatal("a warning past the burst passed")
		}
	}
	if ok, n := l.Allow(now.Add(Every)); !ok || n != 3 {
		t.Fatalf("after %v: ok %v, suppressed %d; want true, 3", Every, ok, n)
	}
}
