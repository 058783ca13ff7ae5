//go:build race

package server_test

// raceEnabled says the race detector is on: memory figures mean nothing under it.
const raceEnabled = true
