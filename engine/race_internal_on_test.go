//go:build race

package engine

// underRace makes the slowest internal tests smaller under the race detector.
const underRace = true
