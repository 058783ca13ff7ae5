//go:build !(linux || darwin || freebsd || netbsd || openbsd || dragonfly)

package cputime

import "time"

// Process reports that this platform's process CPU time is not measured here.
func Process() (time.Duration, bool) { return 0, false }
