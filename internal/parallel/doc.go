// Package parallel is the worker pool of the simulator's reports (package sim/report):
// `kvindex sim --timed` runs every routing policy, and `kvindex sim --validate` every
// published claim's simulations, several at once on a multi-core machine, each
// simulation sequential and independent of the others. It is the one place those
// packages start goroutines, so that the race detector checks the pool here, in a
// small test binary, and the reports and the CLI that print them run once, in make
// test's plain build (Makefile, "race and plain").
//
// # What it owns
//
//	Each(n, workers, do, done)
//	  caller: hands i = 0, 1, ... n-1 to the workers in order, then waits for them
//	  workers (goroutines, min(workers, n), at least 1): do(i), then done(i) under the
//	           pool's lock, one at a time
//	Beside(a, b)
//	  a goroutine runs a; the caller runs b; returns when both have
//	Serialize(f)
//	  f behind a lock: the calls of the simulations' shared progress bar, one at a time
//
// The pool owns its goroutines and the lock that serialises done (Serialize's function
// its own lock); it returns only when every goroutine it started has returned. The
// callers own the data do(i) writes: each call writes only its own slot (the i-th job
// or result), so the workers share nothing but the pool's channel and lock, and the
// caller reads every slot after Each returns (the WaitGroup orders those reads after
// the writes). With Each, Beside and Serialize here, package sim/report and the CLI
// import neither sync nor sync/atomic.
//
// # Who may call it
//
// Anyone, from any goroutine; do and done must not call back into the same Each.
// Each does not stop early: an error is do's to record in its slot, and the caller's
// to pick after the pool has returned (the reports return the first in job order, so
// the error does not depend on the schedule).
//
// # Why a pool of long-lived workers
//
// Each simulation builds and holds its own fleet model while it runs: workers =
// GOMAXPROCS (the reports' default) keeps every core busy while holding no more models
// in memory at once than there are workers, where one goroutine per job would start
// them all together.
package parallel
