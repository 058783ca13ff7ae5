package subscriber

import (
	"syscall"
	"time"
)

// processCPU returns the process's CPU time so far (every thread's, user and system),
// for benchmarks that report CPU time beside wall time on a shared machine.
func processCPU() (time.Duration, bool) {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0, false
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()), true
}
