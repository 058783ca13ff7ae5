package cputime

import "time"

// PerOp returns the process CPU time used since start (a Process reading), in
// nanoseconds per each of n operations: a benchmark's cpu-ns/op. It is 0 where the
// platform does not tell.
func PerOp(start time.Duration, n int) float64 {
	now, ok := Process()
	if !ok || n <= 0 {
		return 0
	}
	return float64((now - start).Nanoseconds()) / float64(n)
}
