//go:build !(linux || darwin || freebsd || netbsd || openbsd || dragonfly)

package bench

import "time"

// processCPU reports that this platform's process CPU time is not measured here.
func processCPU() (time.Duration, bool) { return 0, false }
