//go:build race

package engine_test

// The race detector makes sync.Pool drop items at random, so allocation counts are only
// meaningful without it.
const raceEnabled = true
