package fleet

import (
	"fmt"
	"os"
	"strconv"
	"syscall"
)

// lowerPriority adds inc to the nice value of every thread of this process (the load
// generator), so that serve, a child started at the caller's priority, runs first when
// both want a core: the figures are then serve's, not the generator's. Linux keeps a
// nice value per thread and a new thread takes its creator's, so renicing the threads
// there are now covers those the Go runtime starts later.
func lowerPriority(inc int) error {
	if inc <= 0 {
		return nil
	}
	tasks, err := os.ReadDir("/proc/self/task")
	if err != nil {
		return fmt.Errorf("fleet: lower the load generator's priority: %w", err)
	}
	for _, t := range tasks {
		tid, err := strconv.Atoi(t.Name())
		if err != nil {
			continue
		}
		prio, err := syscall.Getpriority(syscall.PRIO_PROCESS, tid)
		if err != nil {
			continue // the thread exited
		}
		// The raw syscall returns 20-nice.
		nice := min(20-prio+inc, 19)
		if err := syscall.Setpriority(syscall.PRIO_PROCESS, tid, nice); err != nil {
			return fmt.Errorf("fleet: renice thread %d to %d: %w", tid, nice, err)
		}
	}
	return nil
}
