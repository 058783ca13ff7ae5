//go:build !race

package subscriber_test

const raceEnabled = false
