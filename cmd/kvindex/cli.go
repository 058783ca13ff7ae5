package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	iofs "io/fs"
	"log/slog"
	"strings"

	"github.com/kvindex/kvindex/internal/buildinfo"
	"github.com/kvindex/kvindex/server"
)

// The command line convention every subcommand follows (cli_test.go walks them all):
//
//   - `kvindex COMMAND -h` prints the usage to stdout and exits 0;
//   - a usage error (unknown flag, bad value, missing or extra argument, a configuration
//     that does not validate) prints one line naming the flag on stderr (and, for a flag
//     that does not parse, a line pointing to -h, not the whole usage) and exits 2;
//   - a runtime failure (a file that cannot be read or written, a server that cannot
//     listen, a replay with wrong answers) exits 1;
//   - a flag that several commands share (--shards, --jump, --block-size, --engine,
//     --nats, --stream, --grace, --log-level, --seed, --requests, ...) has one type, one
//     default and one meaning everywhere (sharedFlagExceptions in cli_test.go lists the
//     deliberate differences and why).
//
// The table below is the one place a subcommand is named and described: `kvindex -h`,
// `kvindex COMMAND -h` and the package documentation (doc.go, checked by a test) all
// show these lines.
func init() {
	register("sim", command{
		summary:  "simulate a routed vLLM fleet under load: TTFT, throughput and hit rate per routing policy",
		synopsis: "[flags]",
		about: "Replays a workload (built in, llm-d's shared-context shape, or a Mooncake trace) against a\n" +
			"simulated fleet of vLLM engines (continuous batching, chunked prefill, decode,\n" +
			"preemption, in simulated time) behind router replicas, once per routing policy, and\n" +
			"reports time to first token, inter-token latency, throughput, goodput, KV use, queues\n" +
			"and hit rates, and the index's throughput, latency and memory. --sweep reruns every\n" +
			"policy at several loads (or router counts, capacities, event delays) and charts p90\n" +
			"TTFT and throughput. --zero-time runs the zero-time model (hit rates only).",
		run: runSim,
	})
	register("gen-ops", command{
		summary:  "write the simulated fleet's event stream as an op log (input of replay and bench)",
		synopsis: "--out FILE [flags]",
		about: "Writes the stream `kvindex sim` produces under one policy as an op log (JSON Lines,\n" +
			"see docs/oplog.md): a query before each request, then the stored/removed events of the\n" +
			"engine that served it.",
		run: runGenOps,
	})
	register("replay", command{
		summary:  "apply an op log and check every query's expected answer",
		synopsis: "--ops FILE [flags]",
		about: "Applies an op log (JSON Lines, see docs/oplog.md) to a fresh engine and checks each\n" +
			"query's expected answer; reports throughput, find-matches latency and memory per\n" +
			"membership. Exits 1 when an answer is wrong or a line is malformed.",
		run: runReplay,
	})
	register("bench", command{
		summary:  "measure the engine against its baselines (and, with --peers, SMG's indexes) on an op log",
		synopsis: "[--ops FILE] [flags]",
		about: "Measures, in one process and on the same op stream, the sharded engine at each shard\n" +
			"count, the engine's locked index (Config.LockedIndex) and a mutex-guarded radix tree: event\n" +
			"throughput (1..P producers), find-matches latency under event load and at rest,\n" +
			"allocations per op and bytes per membership. Every implementation is first checked\n" +
			"against the stream's expected answers.\n\n" +
			"With --peers DIR it prints one table instead: the implementations and the peer replay\n" +
			"drivers in DIR (SMG's ChainIndex and PositionalIndexer, built by make bench-peers),\n" +
			"in alternating rounds, one producer: block ops/s, find-matches p50/p99 at rest and under\n" +
			"events, bytes per membership and answers passed.",
		run: runBench,
	})
	register("serve", command{
		summary:  "follow engines' KV events (ZeroMQ or NATS) and answer routing queries over HTTP and gRPC",
		synopsis: "[--config FILE] [--engine SPEC]... [flags]",
		about: "Follows vLLM/SGLang KV-cache events over ZeroMQ (or a kvindex relay's NATS stream)\n" +
			"and serves POST /v1/match, GET /v1/workers, /healthz, /readyz and /metrics over HTTP;\n" +
			"with --grpc, the same over gRPC (api/kvindexv1/kvindex.proto). SIGTERM or SIGINT\n" +
			"drains in-flight requests and exits 0.",
		run: untilSignal(serveMain),
	})
	register("relay", command{
		summary:  "follow engines' KV events (or an op log) and publish them to NATS JetStream",
		synopsis: "--nats URL (--ops FILE [--model NAME] | --engine SPEC...) [flags]",
		about: "Follows engines' KV events over ZeroMQ, as serve does, and publishes each one once to\n" +
			"a JetStream stream that any number of `kvindex serve --nats` replicas apply. With\n" +
			"--ops it publishes an op log's events instead and exits. SIGTERM or SIGINT stops it.",
		run: untilSignal(relayMain),
	})
	register("loadtest", command{
		summary:  "load-test serve with a simulated fleet of engines: ingest rate held with nothing lost",
		synopsis: "[--engines N] [--rates R1,R2,...] [flags]",
		about: "Starts N simulated vLLM engines (each a real ZMTP PUB and replay ROUTER on 127.0.0.1,\n" +
			"publishing msgpack KV-event batches from a block-pool model) and one serve following\n" +
			"them all (this binary's serve, or --server inproc), then publishes at each rate in turn\n" +
			"while clients query /v1/match and gRPC. After each level it checks that every worker\n" +
			"applied every batch and holds exactly its engine's blocks, and reports batches and\n" +
			"blocks applied per second, loss, gaps, replays, apply lag and match latency, and\n" +
			"serve's RSS, goroutines, fds and CPU. Exits 0 when at least one level held.",
		run: untilSignal(loadtestMain),
	})
	register("version", command{
		summary:  "print the version, VCS revision and Go toolchain of this binary",
		synopsis: "[flags]",
		about: "Prints one line: the module version (vX.Y.Z for a release or `go install ...@vX.Y.Z`,\n" +
			"devel for a build from a checkout), the VCS revision where the build recorded one, and\n" +
			"the Go toolchain. `kvindex --version` prints the same. serve exports it as\n" +
			"kvindex_build_info on /metrics.",
		run: runVersion,
	})
}

// runVersion is `kvindex version`.
func runVersion(args []string, stdout, stderr io.Writer) int {
	fs := newFlags("version", stderr)
	if code, ok := parseFlags(fs, args, stdout); !ok {
		return code
	}
	fmt.Fprintln(stdout, buildinfo.Read())
	return 0
}

// register adds c to the commands table under name.
func register(name string, c command) {
	if _, dup := commands[name]; dup {
		panic("kvindex: command " + name + " registered twice")
	}
	commands[name] = c
}

// Help texts of the flags several commands share, so that they read the same everywhere.
const (
	shardsHelp   = "index shard goroutines (0 = default: the locked index at GOMAXPROCS <= 2, else GOMAXPROCS shards, at most 8)"
	jumpHelp     = "index jump-search stride in blocks (0 = default 64)"
	engineHelp   = "an engine to follow (repeatable; worker=ID,model=NAME without endpoint: an engine without events, served from predictions): endpoint=tcp://HOST:PORT[,replay=tcp://HOST:PORT][,worker=ID][,model=NAME][,block_size=N][,dp_ranks=N][,dp_rank_start=N|,dp_rank=R (this rank only, on endpoint itself)][,topic=T][,bind=true][,allowed_peers=10.0.0.0/16|10.1.2.3 (with bind: the only peers that may connect)][,media=GPU|CPU (only these media, |-separated)][,hash_seed=PYTHONHASHSEED][,hash_algo=sha256 or sha256_cbor][,hash_sample=N][,kv_groups=0|2 (only these group indexes, |-separated)][,kv_group_kinds=full_attention (|-separated)][,kv_hybrid=true (every group under its reuse rule, learned from the events)][,kv_group_specs=full:16|sliding_window:16:4096|mamba:64 (a hybrid model's groups in group_idx order: KIND:BLOCK_SIZE[:WINDOW], |-separated)]"
	natsHelp     = "NATS server URL(s), comma-separated"
	graceHelp    = "remove an engine unreachable this long (default 60s; negative: never)"
	logLevelHelp = "debug, info, warn or error"
	// maxMessageHelp: --max-message-bytes of serve and relay (subscriber.Config.MaxMessageBytes).
	maxMessageHelp = "largest ZeroMQ message accepted from an engine; a peer declaring more is refused before any allocation (default 16 MiB)"
	streamHelp     = "JetStream stream name"
)

// parseLogLevel parses a --log-level value; its error names the values logLevelHelp
// lists (slog's own says only "unknown name").
func parseLogLevel(s string) (slog.Level, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(s)); err != nil {
		return 0, fmt.Errorf("%q: want %s", s, logLevelHelp)
	}
	return l, nil
}

// newFlags returns the flag set of command name. Its Usage prints the command's synopsis,
// description and flags to the flag set's output.
func newFlags(name string, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet("kvindex "+name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() { printCommandUsage(fs.Output(), name, fs) }
	return fs
}

func printCommandUsage(w io.Writer, name string, fs *flag.FlagSet) {
	c := commands[name]
	fmt.Fprintf(w, "usage: kvindex %s %s\n\n%s\n\nflags:\n", name, c.synopsis, c.about)
	out := fs.Output()
	fs.SetOutput(w)
	fs.PrintDefaults()
	fs.SetOutput(out)
}

// parseFlags parses args into fs under the convention above. When it returns ok false
// the command is over and must return code: 0 after -h (usage on stdout), 2 after a
// usage error (the error and a pointer to -h on stderr). No subcommand takes positional
// arguments, so any is a usage error.
func parseFlags(fs *flag.FlagSet, args []string, stdout io.Writer) (code int, ok bool) {
	if parseOnly != nil {
		args = parseOnly(fs, args)
	}
	usage := fs.Usage
	// The flag package calls Usage itself, on the error stream, for -h as for an error;
	// silence it and print the usage once, where it belongs.
	fs.Usage = func() {}
	err := fs.Parse(args)
	fs.Usage = usage
	switch {
	case errors.Is(err, flag.ErrHelp):
		errOut := fs.Output()
		fs.SetOutput(stdout)
		usage()
		fs.SetOutput(errOut)
		return 0, false
	case err != nil: // the flag package has printed the error; one line points to -h
		fmt.Fprintf(fs.Output(), "run '%s -h' for the flags\n", fs.Name())
		return 2, false
	case fs.NArg() > 0:
		fmt.Fprintf(fs.Output(), "%s: unexpected argument %q (flags only; see -h)\n", fs.Name(), fs.Arg(0))
		return 2, false
	case parseOnly != nil:
		return 0, false
	}
	return 0, true
}

// parseOnly, when set (by TestDocCommandsParse only), makes every command stop after
// parsing its flags, exit status 0 when they parse: the documented command lines are
// checked without running them. It may rewrite the arguments first (a placeholder value
// such as N or LOG becomes the flag's default).
var parseOnly func(fs *flag.FlagSet, args []string) []string

// errUsage marks a flag problem: exitCode prints it and returns 2.
var errUsage = errors.New("usage")

func usageErr(format string, args ...any) error {
	return fmt.Errorf("%w: %s", errUsage, fmt.Sprintf(format, args...))
}

// exitCode reports err on stderr for command name and returns the exit status: 0 for
// none, 2 for a usage error (see usageErr), 1 for any other.
func exitCode(stderr io.Writer, name string, err error) int {
	switch {
	case err == nil:
		return 0
	case errors.Is(err, errUsage):
		fmt.Fprintf(stderr, "kvindex %s: %s\n", name, strings.TrimPrefix(err.Error(), "usage: "))
		return 2
	default:
		fmt.Fprintf(stderr, "kvindex %s: %v\n", name, err)
		return 1
	}
}

// readConfigFlag reads the --config file of command name ("" gives the zero Config).
// When ok is false the command is over and must return code: 1 when the file cannot be
// read (a runtime failure), 2 when it does not parse (a usage error).
func readConfigFlag(name, path string, stderr io.Writer) (cfg server.Config, code int, ok bool) {
	if path == "" {
		return server.Config{}, 0, true
	}
	cfg, err := server.ReadConfig(path)
	if err != nil {
		fmt.Fprintf(stderr, "kvindex %s: %v\n", name, err)
		var pe *iofs.PathError
		if errors.As(err, &pe) {
			return cfg, 1, false
		}
		return cfg, 2, false
	}
	return cfg, 0, true
}
