//go:build unix

package chattemplate

import (
	"syscall"
	"time"
)

// cpuTime is the process's user plus system CPU time: on a shared machine it moves far
// less with other jobs' load than wall time (it includes the GC's other threads).
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
