//go:build race

package testsize

const raceEnabled = true
