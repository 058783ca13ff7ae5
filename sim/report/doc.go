// Package report runs the simulator's experiments and writes what a person reads:
// `kvindex sim`'s timed experiment (RunTimed: every routing policy on one workload,
// once or at each point of a sweep, its JSON, tables and chart), the zero-time one
// (RunZeroTime: `kvindex sim --zero-time`, hit rates and the host tier's prefill work,
// once or at each capacity, event delay or host capacity), the validation against
// published benchmarks (Validate, PrintValidation), and the progress bar they show. The
// command only parses flags and builds the workload and config.
//
// It runs several simulations at once (Timed.Parallel, ValidateConfig.Parallel) on the
// workers of package internal/parallel, all finished before it returns, and starts no
// goroutine of its own; each simulation writes only its own job's result, read once
// the pool has returned, and a sim.Workload is read-only, so they share it. The run that measures the index runs first and alone, so that its
// timings are its own. RunZeroTime runs one simulation at a time, on its caller's
// goroutine.
//
// The numbers the validation prints beside the simulated ones are published figures,
// each row naming its source; sim/VALIDATION.md gives the full table and why each
// difference exists.
package report
