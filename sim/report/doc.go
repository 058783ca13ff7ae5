// Package report runs the simulator's experiments and writes what a person reads:
// the validation against published benchmarks (Validate, PrintValidation).
//
// It owns no goroutine beyond the simulations it runs at once (Validate's Parallel),
// each on its own workload copy-free (a sim.Workload is read-only), all finished
// before it returns. `kvindex sim validate` is its command; its tests run the short
// validation in `make test` and the full one in `make test-long`.
//
// The numbers it prints beside the simulated ones are published figures, each row
// naming its source; sim/VALIDATION.md gives the full table and why each difference
// exists.
package report
