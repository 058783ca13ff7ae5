// Package report runs the simulator's experiments and writes what a person reads:
// `kvindex sim`'s timed experiment (RunTimed: every routing policy on one workload,
// once or at each point of a sweep, its JSON, tables and chart), the zero-time one
// (RunZeroTime: `kvindex sim --zero-time`, hit rates and the host tier's prefill work,
// once or at each capacity, event delay or host capacity), the validation against
// published benchmarks (Validate, PrintValidation), and the progress bar they show. The
// command only parses flags and builds the workload and config.
//
// It owns the goroutines of the simulations it runs at once (Timed.Parallel,
// ValidateConfig.Parallel), all finished before it returns; a sim.Workload is read-only,
// so they share it. The run that measures the index runs first and alone, so that its
// timings are its own. RunZeroTime runs one simulation at a time, on its caller's
// goroutine.
//
// The numbers the validation prints beside the simulated ones are published figures,
// each row naming its source; sim/VALIDATION.md gives the full table and why each
// difference exists.
package report
