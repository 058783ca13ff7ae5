package testsize

import (
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestPick: the full size in the plain build or with KVINDEX_TEST_LONG, the reduced one
// under the race detector or the invariant checks.
func TestPick(t *testing.T) {
	t.Setenv(LongEnv, "")
	plain := !Race && !Invariants
	if got, want := Pick(10, 1), map[bool]int{true: 10, false: 1}[plain]; got != want {
		t.Fatalf("race %v, invariants %v, not long: Pick(10, 1) = %d, want %d", Race, Invariants, got, want)
	}
	t.Setenv(LongEnv, "1")
	if !Long() || !Full() || Pick(10, 1) != 10 {
		t.Fatalf("long: Long %v, Full %v, Pick %d", Long(), Full(), Pick(10, 1))
	}
}

// TestSkipAllocs: the plain build measures allocations; the others skip, and say so.
func TestSkipAllocs(t *testing.T) {
	var skipped bool
	t.Run("probe", func(t *testing.T) {
		defer func() { skipped = t.Skipped() }()
		SkipAllocs(t)
	})
	if skipped == AllocsMeasured {
		t.Fatalf("race %v, invariants %v: SkipAllocs skipped = %v", Race, Invariants, skipped)
	}
}
