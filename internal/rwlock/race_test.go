//go:build race

package rwlock

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain: under the race detector RWMutex is sync.RWMutex (rwlock_race.go) and this
// package has nothing of its own to test; make test runs its tests without the
// detector (the plain phase).
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
