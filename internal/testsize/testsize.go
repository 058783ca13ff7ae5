// Package testsize sizes the project's slow tests. `make test` (what CI runs) runs the
// race detector over every package on a 2-core machine, where the detector makes
// sequential replays 5-10x slower and adds nothing to them, and runs the index's
// packages once more with their invariants checked after every mutation (-tags
// invariants), where each event recounts the structures it touched, so that a history
// of n events costs O(n^2). In either build a test runs at a size that still exercises
// every code path and every goroutine interleaving it is about. `make test-long` sets
// KVINDEX_TEST_LONG=1 and runs every test at its full size.
//
// Allocation assertions (testing.AllocsPerRun) hold only in the plain build: the race
// detector's instrumentation and the invariant checks allocate by design. SkipAllocs
// skips such a test, visibly, in the other builds, so that `go test -race`,
// `go test -tags invariants` and both together pass in any combination.
//
// Only tests import it. It owns no goroutine and no mutable state.
package testsize

import (
	"os"
	"testing"

	"github.com/kvindex/kvindex/internal/invariants"
)

// Race reports whether the binary was built with -race.
const Race = raceEnabled

// Invariants reports whether the binary was built with -tags invariants.
const Invariants = invariants.Enabled

// LongEnv is the environment variable `make test-long` sets.
const LongEnv = "KVINDEX_TEST_LONG"

// Long reports whether LongEnv is set: every test at its full size.
func Long() bool { return os.Getenv(LongEnv) != "" }

// Full reports whether a test runs at its full size: in the plain build (neither the
// race detector nor the invariant checks), or in `make test-long`.
func Full() bool { return (!Race && !Invariants) || Long() }

// Pick returns full when Full() and reduced otherwise.
func Pick[T any](full, reduced T) T {
	if Full() {
		return full
	}
	return reduced
}

// Sized returns full in the plain build or in `make test-long`, checked under the
// invariant checks (with or without the race detector: the checks' O(n^2) dominates),
// and race under the race detector alone.
func Sized[T any](full, race, checked T) T {
	switch {
	case Long() || (!Race && !Invariants):
		return full
	case Invariants:
		return checked
	default:
		return race
	}
}

// AllocsMeasured reports whether allocation counts mean what they say in this build:
// neither the race detector nor the invariant checks, both of which allocate.
const AllocsMeasured = !Race && !Invariants

// SkipAllocs skips t, saying why, where this build allocates by design (the race
// detector or the invariant checks); a zero-allocation assertion runs in the plain build
// only, which `make test` runs for every package.
func SkipAllocs(t testing.TB) {
	t.Helper()
	switch {
	case Race:
		t.Skip("allocation counts are measured without the race detector, which allocates")
	case Invariants:
		t.Skip("allocation counts are measured without -tags invariants, whose checks allocate")
	}
}
