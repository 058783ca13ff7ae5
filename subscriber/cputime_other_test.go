//go:build !linux

package subscriber

import "time"

// processCPU reports that the process's CPU time is not measured on this platform.
func processCPU() (time.Duration, bool) { return 0, false }
