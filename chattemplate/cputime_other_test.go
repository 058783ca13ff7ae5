//go:build !unix

package chattemplate

import "time"

// cpuTime is not measured here; the benchmark's cpu-ns/render reads 0.
func cpuTime() time.Duration { return 0 }
