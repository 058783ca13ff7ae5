package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"runtime/pprof"
	"sort"

	"github.com/kvindex/kvindex/engine"
	"github.com/kvindex/kvindex/internal/oplog"
	"github.com/kvindex/kvindex/internal/replay"
)

type replayJSON struct {
	File               string  `json:"file"`
	Shards             int     `json:"shards"`
	Jump               int     `json:"jump"`
	Locked             bool    `json:"locked,omitempty"`
	SpecChain          bool    `json:"spec_chain,omitempty"`
	Passed             int     `json:"passed"`
	Failed             int     `json:"failed"`
	Ops                int     `json:"ops"`
	BlockOps           int     `json:"block_ops"`
	Seconds            float64 `json:"seconds"`
	CPUSeconds         float64 `json:"cpu_seconds,omitempty"`
	OpsPerS            float64 `json:"ops_per_s"`
	BlockOpsPerS       float64 `json:"block_ops_per_s"`
	QueryP50           int64   `json:"query_p50_ns"`
	QueryP99           int64   `json:"query_p99_ns"`
	Rejected           int     `json:"rejected"`
	Memberships        int64   `json:"memberships"`
	BytesPerMembership float64 `json:"bytes_per_membership"`
	// Per query, on a sharded engine: round trips waited for and positions probed
	// (engine.Stats.QueryRounds, QueryProbes); absent for the locked index.
	RoundsPerQuery float64 `json:"rounds_per_query,omitempty"`
	ProbesPerQuery float64 `json:"probes_per_query,omitempty"`
}

func runReplay(args []string, stdout, stderr io.Writer) int {
	fs := newFlags("replay", stderr)
	file := fs.String("ops", "", "op log to replay (JSON Lines, see docs/oplog.md); required")
	shards := fs.Int("shards", 0, shardsHelp)
	jump := fs.Int("jump", 0, jumpHelp)
	asJSON := fs.Bool("json", false, "end with one JSON object instead of the text summary")
	cpuprofile := fs.String("cpuprofile", "", "write a CPU profile of the replay (parsing excluded) to this file")
	repeat := fs.Int("repeat", 1, "replay the log this many times on fresh engines and report the median run")
	locked := fs.Bool("locked", false, "replay on the locked index (Config.LockedIndex: one RWMutex-guarded index, no shard goroutines) instead")
	specChain := fs.Bool("spec-chain", false, "name positions by SPEC's XXH3 prefix chain instead of the engine's keyed chain (Config.SpecChain): same answers, slower deep queries")
	batch := fs.Bool("batch", true, "apply the events between two queries with one ApplyBatch call, as an ingester does with an engine's event batch (false: one call per event)")
	if code, ok := parseFlags(fs, args, stdout); !ok {
		return code
	}
	cfg := engine.Config{Shards: *shards, JumpSize: *jump, LockedIndex: *locked, SpecChain: *specChain}
	switch err := cfg.Validate(); {
	case *file == "":
		fmt.Fprintln(stderr, "kvindex replay: --ops FILE is required")
		return 2
	case err != nil:
		fmt.Fprintf(stderr, "kvindex replay: --shards %d --jump %d: %v\n", *shards, *jump, err)
		return 2
	case *repeat < 1:
		fmt.Fprintln(stderr, "kvindex replay: --repeat must be >= 1")
		return 2
	}
	f, err := os.Open(*file)
	if err != nil {
		fmt.Fprintf(stderr, "kvindex replay: %v\n", err)
		return 1
	}
	ops, err := oplog.ReadAll(f)
	f.Close()
	if err != nil {
		// Malformed lines are reported as file:line with the reason.
		var le *oplog.LineError
		if errors.As(err, &le) {
			fmt.Fprintf(stderr, "%s:%d: malformed line: %s\n", *file, le.Line, le.Reason)
		} else {
			fmt.Fprintf(stderr, "%s: %v\n", *file, err)
		}
		fmt.Fprintln(stdout, "0 passed, 1 failed")
		return 1
	}
	if *cpuprofile != "" {
		pf, err := os.Create(*cpuprofile)
		if err != nil {
			fmt.Fprintf(stderr, "kvindex replay: %v\n", err)
			return 1
		}
		defer pf.Close()
		if err := pprof.StartCPUProfile(pf); err != nil {
			fmt.Fprintf(stderr, "kvindex replay: %v\n", err)
			return 1
		}
		defer pprof.StopCPUProfile()
	}
	var runs []replay.Result
	for i := 0; i < *repeat; i++ {
		r, err := replay.Run(context.Background(), ops, replay.Options{Config: cfg, MeasureMemory: true, Batch: *batch})
		if err != nil {
			fmt.Fprintf(stderr, "kvindex replay: %s: %v\n", *file, err)
			return 1
		}
		runs = append(runs, r)
	}
	sort.Slice(runs, func(i, j int) bool { return runs[i].Seconds < runs[j].Seconds })
	res := runs[len(runs)/2]
	for _, m := range res.Mismatches {
		fmt.Fprintf(stdout, "MISMATCH %s:%s\n", *file, m)
	}
	eff := cfg.WithDefaults()
	out := replayJSON{
		File: *file, Shards: eff.Shards, Jump: eff.JumpSize, Locked: eff.LockedIndex, SpecChain: eff.SpecChain,
		Passed: res.Passed, Failed: res.Failed, Ops: res.Ops, BlockOps: res.BlockOps,
		Seconds: res.Seconds, CPUSeconds: res.CPUSeconds, QueryP50: res.QueryP50, QueryP99: res.QueryP99,
		Rejected: res.Rejected, Memberships: res.Memberships, BytesPerMembership: res.BytesPerMembership,
	}
	if q := res.Stats.Queries; q > 0 && !eff.LockedIndex {
		out.RoundsPerQuery = float64(res.Stats.QueryRounds) / float64(q)
		out.ProbesPerQuery = float64(res.Stats.QueryProbes) / float64(q)
	}
	if res.Seconds > 0 {
		out.OpsPerS = float64(res.Ops) / res.Seconds
		out.BlockOpsPerS = float64(res.BlockOps) / res.Seconds
	}
	if *asJSON {
		b, _ := json.Marshal(out)
		fmt.Fprintln(stdout, string(b))
	} else {
		impl := fmt.Sprintf("shards=%d", out.Shards)
		if out.Locked {
			impl = "locked index"
		}
		if out.SpecChain {
			impl += ", SPEC's prefix chain"
		}
		fmt.Fprintf(stdout, "%s: %s jump=%d\n", *file, impl, out.Jump)
		fmt.Fprintf(stdout, "  ops %d (%.0f/s), block ops %d (%.2fM/s), %.3f s (CPU %.3f s)\n", out.Ops, out.OpsPerS, out.BlockOps, out.BlockOpsPerS/1e6, out.Seconds, out.CPUSeconds)
		fmt.Fprintf(stdout, "  find-matches p50 %d ns, p99 %d ns; rejected stores %d\n", out.QueryP50, out.QueryP99, out.Rejected)
		if !out.Locked {
			fmt.Fprintf(stdout, "  per query: %.3f round trips to the shards, %.1f probes\n", out.RoundsPerQuery, out.ProbesPerQuery)
		}
		fmt.Fprintf(stdout, "  memberships %d, %.1f bytes per membership\n", out.Memberships, out.BytesPerMembership)
		fmt.Fprintf(stdout, "%d passed, %d failed\n", out.Passed, out.Failed)
	}
	if res.Failed > 0 {
		return 1
	}
	return 0
}
