//go:build !linux

package fleet

import (
	"testing"
	"time"
)

// epollFloor needs Linux's epoll: elsewhere the level is not measured.
func epollFloor(*testing.B, int, int, time.Duration, int) floorResult { return floorResult{} }
