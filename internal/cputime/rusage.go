//go:build darwin || freebsd || netbsd || openbsd || dragonfly

package cputime

import (
	"syscall"
	"time"
)

// Process is clock_linux.go's Process on the BSDs and macOS, from getrusage: the user and
// system time of every thread, as the scheduler has accounted it so far.
func Process() (d time.Duration, ok bool) {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0, false
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()), true
}
