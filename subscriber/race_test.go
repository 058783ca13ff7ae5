//go:build race

package subscriber_test

// raceEnabled: the race detector's shadow memory dominates RSS and is not returned.
const raceEnabled = true
