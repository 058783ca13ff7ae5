// Package testsize sizes the project's slow tests. `make test` (what CI runs) runs the
// race detector over every package on a 2-core machine, where the detector makes
// sequential replays 5-10x slower and adds nothing to them; there a test runs at a
// size that still exercises every code path and every goroutine interleaving it is
// about. `make test-long` sets KVINDEX_TEST_LONG=1 and runs every test at its full size
// under the detector, as `make test` did before the split.
//
// Only tests import it. It owns no goroutine and no mutable state.
package testsize

import "os"

// Race reports whether the binary was built with -race.
const Race = raceEnabled

// LongEnv is the environment variable `make test-long` sets.
const LongEnv = "KVINDEX_TEST_LONG"

// Long reports whether LongEnv is set: every test at its full size.
func Long() bool { return os.Getenv(LongEnv) != "" }

// Full reports whether a test runs at its full size: without the race detector, or in
// `make test-long`.
func Full() bool { return !Race || Long() }

// Pick returns full when Full() and reduced otherwise.
func Pick[T any](full, reduced T) T {
	if Full() {
		return full
	}
	return reduced
}
