//go:build !linux

package fleet

import (
	"testing"
	"time"
)

// epollFloor needs Linux's epoll: elsewhere the level is not measured.
func epollFloor(*testing.B, int, int, time.Duration, int, time.Duration) floorResult {
	return floorResult{}
}

// uringFloor needs Linux's io_uring: elsewhere the level is not measured.
func uringFloor(*testing.B, int, int, time.Duration, int, time.Duration, uint32) floorResult {
	return floorResult{}
}

// uringModes: none elsewhere.
var uringModes []struct {
	name  string
	flags uint32
}

// sleepWakes needs Linux's nanosleep from a locked thread: elsewhere not measured.
func sleepWakes(time.Duration, time.Duration) (int, time.Duration, bool) { return 0, 0, false }
