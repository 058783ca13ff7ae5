package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"runtime"

	"github.com/kvindex/kvindex/sim/report"
)

// runSimValidate is `kvindex sim validate`: every row of the validation table
// (sim/VALIDATION.md), published figures beside the simulated ones.
func runSimValidate(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("kvindex sim validate", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "usage: kvindex sim validate [flags]\n\n"+
			"Runs every published benchmark of sim/VALIDATION.md with its workload, engine and ramp, and\n"+
			"prints the published figures beside the simulated ones: the direction each claim wants, the\n"+
			"ratio, and which hold.\n\nflags:\n")
		fs.PrintDefaults()
	}
	scale := fs.Float64("scale", 1, "multiply every ramp stage's length (and the all-at-once rows' users) by X in (0, 1]: 0.1 is make test's short validation")
	jobs := fs.Int("jobs", 0, "simulations run at once (0 = the CPUs)")
	if code, ok := parseFlags(fs, args, stdout); !ok {
		return code
	}
	err := func() error {
		if !(*scale > 0 && *scale <= 1) {
			return usageErr("--scale %g: want (0, 1]", *scale)
		}
		if *jobs < 0 || *jobs > 256 {
			return usageErr("--jobs %d: want 0..256", *jobs)
		}
		if *jobs == 0 {
			*jobs = runtime.GOMAXPROCS(0)
		}
		rows, err := report.Validate(context.Background(), report.ValidateConfig{Scale: *scale, Parallel: *jobs,
			Progress: func(name string) { fmt.Fprintf(stderr, "simulated %s\n", name) }})
		if err != nil {
			return err
		}
		report.PrintValidation(stdout, rows)
		return nil
	}()
	return exitCode(stderr, "sim validate", err)
}
