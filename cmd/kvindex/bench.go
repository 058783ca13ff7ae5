package main

import (
	"context"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"github.com/kvindex/kvindex/bench"
	"github.com/kvindex/kvindex/engine"
)

func runBench(args []string, stdout, stderr io.Writer) int {
	fs := newFlags("bench", stderr)
	file := fs.String("ops", "", "op log to replay (JSON Lines, e.g. ../shared/conformance/trace_conversation.jsonl); default: a built-in refmodel.RandomOps workload")
	gen := fs.Int("gen", 60000, "built-in workload: number of ops")
	seed := fs.Uint64("seed", 1, "built-in workload: seed")
	shardList := fs.String("shards", "1,2,4,8", "engine shard counts, comma-separated")
	implList := fs.String("impls", "engine,locked,radix", "implementations, comma-separated: engine, locked, locked-spec (the locked index on SPEC's XXH3 prefix chain), radix")
	producerList := fs.String("producers", "1,2,4", "producer goroutine counts for event throughput, comma-separated")
	queriers := fs.Int("queriers", 2, "query goroutines under load")
	duration := fs.Duration("duration", 400*time.Millisecond, "time budget of each timed measurement")
	markdown := fs.Bool("markdown", false, "print markdown tables")
	noVerify := fs.Bool("no-verify", false, "skip the correctness replay")
	peersDir := fs.String("peers", "", "folder `DIR` of the peer replay drivers (smg-chain, smg-positional: built by make bench-peers); prints one table of every implementation and peer, in alternating rounds, one producer; needs --ops")
	rounds := fs.Int("rounds", 3, "with --peers: alternating rounds")
	if code, ok := parseFlags(fs, args, stdout); !ok {
		return code
	}
	bad := func(format string, a ...any) int {
		fmt.Fprintf(stderr, "kvindex bench: "+format+"\n", a...)
		return 2
	}
	shards, err := benchInts(*shardList, 1, engine.MaxShards)
	if err != nil {
		return bad("--shards: %v", err)
	}
	producers, err := benchInts(*producerList, 1, 1024)
	if err != nil {
		return bad("--producers: %v", err)
	}
	switch {
	case *queriers < 1:
		return bad("--queriers %d: want >= 1", *queriers)
	case *duration <= 0:
		return bad("--duration %v: want > 0", *duration)
	case *file == "" && *gen < 1:
		return bad("--gen %d: want >= 1", *gen)
	case *peersDir != "" && *file == "":
		return bad("--peers needs --ops (the peers read the op log themselves)")
	case *rounds < 1 || *rounds > 100:
		return bad("--rounds %d: want 1..100", *rounds)
	}
	var impls []bench.Impl
	for _, name := range strings.Split(*implList, ",") {
		switch strings.TrimSpace(name) {
		case "engine":
			for _, s := range shards {
				impls = append(impls, bench.EngineImpl(s))
			}
		case "locked":
			impls = append(impls, bench.LockedImpl())
		case "locked-spec":
			impls = append(impls, bench.LockedSpecImpl())
		case "radix":
			impls = append(impls, bench.RadixImpl())
		default:
			return bad("--impls: unknown implementation %q (want engine, locked, locked-spec, radix)", name)
		}
	}

	var w *bench.Workload
	if *file != "" {
		if w, err = bench.ReadWorkload(*file); err != nil {
			fmt.Fprintf(stderr, "kvindex bench: %v\n", err)
			return 1
		}
	} else {
		w = bench.Builtin(*seed, *gen)
	}
	opt := bench.Options{Duration: *duration, Producers: producers, Queriers: *queriers, SkipVerify: *noVerify}
	if *peersDir != "" {
		return benchPeers(*peersDir, *file, *rounds, w, impls, opt, *markdown, args, stdout, stderr)
	}
	var results []bench.Result
	failed := false
	for _, impl := range impls {
		start := time.Now()
		r, err := bench.Run(impl, w, opt)
		if err != nil {
			fmt.Fprintf(stderr, "kvindex bench: %v\n", err)
			return 1
		}
		fmt.Fprintf(stderr, "kvindex bench: %s done in %.1f s\n", impl.Name, time.Since(start).Seconds())
		failed = failed || r.Verify.Failed > 0
		results = append(results, r)
	}
	h := bench.Header{Command: benchCommandLine(args), Workload: w, Options: opt}
	if err := bench.WriteReport(stdout, h, results, *markdown); err != nil {
		fmt.Fprintf(stderr, "kvindex bench: %v\n", err)
		return 1
	}
	if failed {
		fmt.Fprintln(stderr, "kvindex bench: some implementation gave wrong answers (see the table)")
		return 1
	}
	return 0
}

// peerJump is the jump size the peers get: the engine's default JumpSize, which the
// engine implementations of the table use.
const peerJump = 64

// benchPeers is `kvindex bench --peers DIR`: the implementations and the peer drivers
// found in dir, in alternating rounds, as one table.
func benchPeers(dir, file string, rounds int, w *bench.Workload, impls []bench.Impl, opt bench.Options, markdown bool, args []string, stdout, stderr io.Writer) int {
	peers, missing := bench.FindPeers(dir)
	for _, m := range missing {
		fmt.Fprintf(stderr, "kvindex bench: peer %s not found in %s (build it with make bench-peers SMG_SRC=DIR); left out\n", m, dir)
	}
	sums, err := bench.CompareRounds(context.Background(), w, file, peerJump, impls, peers, opt, rounds, stderr)
	if err != nil {
		fmt.Fprintf(stderr, "kvindex bench: %v\n", err)
		return 1
	}
	h := bench.Header{Command: benchCommandLine(args), Workload: w, Options: opt}
	if err := bench.WritePeerTable(stdout, h, sums, rounds, markdown); err != nil {
		fmt.Fprintf(stderr, "kvindex bench: %v\n", err)
		return 1
	}
	for _, s := range sums {
		// A peer that is not exact under this project's contract is a finding, not a
		// failure of the run; one of ours is a failure.
		if s.Failed() && !isPeer(s.Impl, peers) {
			fmt.Fprintln(stderr, "kvindex bench: some implementation gave wrong answers (see the table)")
			return 1
		}
	}
	return 0
}

func isPeer(name string, peers []bench.Peer) bool {
	for _, p := range peers {
		if p.Name == name {
			return true
		}
	}
	return false
}

// benchInts parses a comma-separated list of integers in [lo, hi].
func benchInts(s string, lo, hi int) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < lo || n > hi {
			return nil, fmt.Errorf("%q: want integers in %d..%d", s, lo, hi)
		}
		out = append(out, n)
	}
	return out, nil
}

// benchCommandLine reconstructs the command line, quoting what a shell would split.
func benchCommandLine(args []string) string {
	parts := []string{"kvindex", "bench"}
	for _, a := range args {
		if a == "" || strings.ContainsAny(a, " \t\n'\"\\$`|&;<>()*?[]#~") {
			a = "'" + strings.ReplaceAll(a, "'", `'\''`) + "'"
		}
		parts = append(parts, a)
	}
	return strings.Join(parts, " ")
}
