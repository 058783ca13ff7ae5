// Package cputime reads the process's CPU time (user and system, every thread's), the
// clock kvindex's benchmarks and `kvindex replay` report beside the wall clock: on a
// machine shared with other work, neighbours' load stretches the wall clock of a run but
// not the CPU time it used. Any goroutine may call it; it holds no state.
package cputime
