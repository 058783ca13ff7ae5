package testsize

import (
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestPick: the full size without the race detector or with KVINDEX_TEST_LONG, the
// reduced one otherwise.
func TestPick(t *testing.T) {
	t.Setenv(LongEnv, "")
	if got, want := Pick(10, 1), map[bool]int{false: 10, true: 1}[Race]; got != want {
		t.Fatalf("race %v, not long: Pick(10, 1) = %d, want %d", Race, got, want)
	}
	t.Setenv(LongEnv, "1")
	if !Long() || !Full() || Pick(10, 1) != 10 {
		t.Fatalf("long: Long %v, Full %v, Pick %d", Long(), Full(), Pick(10, 1))
	}
}
