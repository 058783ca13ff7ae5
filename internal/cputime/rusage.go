//go:build darwin || freebsd || netbsd || openbsd || dragonfly

package cputime

import (
	"syscall"
	"time"
)

// Process returns the CPU time (user and system) the process has used so far: every
// thread's, so that a sharded engine's shard goroutines and the garbage collector count
// with the caller's. Neighbours' load on the machine does not inflate it as it does the
// wall clock. ok is false where the platform does not tell.
func Process() (d time.Duration, ok bool) {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0, false
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()), true
}
