//go:build linux

package cputime

import (
	"time"

	"golang.org/x/sys/unix"
)

// Process returns the CPU time (user and system) the process has used so far: every
// thread's, so that a sharded engine's shard goroutines and the garbage collector count
// with the caller's. Neighbours' load on the machine does not inflate it as it does the
// wall clock. ok is false where the platform does not tell.
//
// On Linux it reads CLOCK_PROCESS_CPUTIME_ID, the clock the peers' Rust drivers read
// (bench/peers), so that both sides of kvindex bench's CPU-time ratios count the same
// way: each thread's run time to the nanosecond, the running thread's included, where
// getrusage adds up what the scheduler has accounted so far (for a running thread, up
// to a tick behind).
func Process() (d time.Duration, ok bool) {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_PROCESS_CPUTIME_ID, &ts); err != nil {
		return 0, false
	}
	return time.Duration(ts.Nano()), true
}
