package main

import (
	"context"
	"fmt"
	"io"
	"os"

	"github.com/kvindex/kvindex/sim"
	"github.com/kvindex/kvindex/sim/report"
)

// genOpsRequests is gen-ops' default request count: the built-in workload is prefix-
// stable, so its log is the stream of the first requests of the default `kvindex sim`.
const genOpsRequests = 5000

func runGenOps(args []string, stdout, stderr io.Writer) int {
	fs := newFlags("gen-ops", stderr)
	var f simFlags
	f.register(fs, fmt.Sprintf("requests to simulate (0 = %d for the built-in workload, every line of a trace)", genOpsRequests),
		sim.DefaultCapacity, "KV cache blocks per worker")
	out := fs.String("out", "", "op log to write ('-' for stdout); required")
	every := fs.Int("expect-every", 0, "give every Nth query its exact answer (expect/sizes from the reference model); 0 = none")
	policy := fs.String("policy", "longest-prefix/exact", "zero-time routing policy: longest-prefix/exact, random, round-robin or least-loaded; kvindex sim -h lists the others")
	if code, ok := parseFlags(fs, args, stdout); !ok {
		return code
	}
	err := func() error {
		if err := f.validate(fs); err != nil {
			return err
		}
		if *out == "" {
			return usageErr("--out FILE is required")
		}
		if *every < 0 {
			return usageErr("--expect-every %d: want >= 0", *every)
		}
		p, err := sim.ParsePolicy(*policy)
		if err != nil {
			return usageErr("--policy %q: want longest-prefix/exact, random, round-robin or least-loaded", *policy)
		}
		w, _, err := f.workload(genOpsRequests, false)
		if err != nil {
			return err
		}
		if f.capacity < w.MaxBlocks {
			return usageErr("--capacity %d blocks per worker cannot hold the longest request (%d blocks of %d tokens)",
				f.capacity, w.MaxBlocks, w.BlockSize)
		}
		dst := stdout
		var fh *os.File
		if *out != "-" {
			if fh, err = os.Create(*out); err != nil {
				return err
			}
			dst = fh
		}
		res, err := sim.WriteOps(context.Background(), dst, w, p, f.config(), *every)
		if fh != nil {
			if cerr := fh.Close(); err == nil {
				err = cerr
			}
		}
		if err != nil {
			return err
		}
		msg := stdout
		if *out == "-" {
			msg = stderr
		}
		fmt.Fprintf(msg, "wrote %s: %d ops (%d queries, %d with expect/sizes; %d stored; %d removed), %.1f MB\n",
			*out, res.Ops, res.Queries, res.Expectations, res.Stored, res.Removed, float64(res.Bytes)/1e6)
		fmt.Fprintf(msg, "  %s, %s, %d requests, block hit rate %s\n",
			w.Name, res.Sim.Policy, res.Sim.Requests, report.Pct(res.Sim.BlockHitRate()))
		return nil
	}()
	return exitCode(stderr, "gen-ops", err)
}
