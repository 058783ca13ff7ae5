// Package report runs the simulator's experiments and writes what a person reads:
// `kvindex sim`'s timed experiment (RunTimed: every routing policy on one workload,
// once or at each point of a sweep, its JSON, tables and chart) and the validation
// against published benchmarks (Validate, PrintValidation). The command only parses
// flags and builds the workload and config.
//
// It owns the goroutines of the simulations it runs at once (Timed.Parallel,
// ValidateConfig.Parallel), all finished before it returns; a sim.Workload is read-only,
// so they share it. The run that measures the index runs first and alone, so that its
// timings are its own.
//
// The numbers the validation prints beside the simulated ones are published figures,
// each row naming its source; sim/VALIDATION.md gives the full table and why each
// difference exists. The zero-time model's report (`kvindex sim --zero-time`) is still
// printed by the command.
package report
