package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/kvindex/kvindex/bench/fleet"
	"github.com/kvindex/kvindex/internal/fakevllm"
)

// loadtestMain is `kvindex loadtest`: a simulated fleet of engines publishing into one
// serve (this binary's serve subcommand, or an in-process server) at increasing rates,
// with match queries and apply-lag probes, checking after each level that nothing was
// lost. It exits 0 when at least one level held (the table says up to which rate), 1
// when none did or the run failed, 2 for bad flags.
func loadtestMain(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if fleet.IsQueryChild() {
		// Started by a load test's --query-process: its match clients, at serve's
		// priority, talking to the generator over stdin and stdout.
		if err := fleet.QueryChild(os.Stdin, stdout); err != nil {
			return exitCode(stderr, "loadtest", err)
		}
		return 0
	}
	fs := newFlags("loadtest", stderr)
	engines := fs.Int("engines", 64, "simulated engines, each a ZMTP PUB and ROUTER on 127.0.0.1 (1.."+strconv.Itoa(fakevllm.MaxEngines)+")")
	rates := fs.String("rates", "1000,2000,4000,8000", "levels: batches per second over the whole fleet, comma-separated, run in order (stops at the first not held unless --keep-going)")
	levelDur := fs.Duration("level-duration", 10*time.Second, "publishing time of each level")
	warmupRate := fs.Float64("warmup-rate", 0, "batches/s of the warm-up that fills every engine's cache before the first level (0: the first level's rate)")
	warmupMax := fs.Duration("warmup-max", 2*time.Minute, "longest warm-up")
	noWarmup := fs.Bool("no-warmup", false, "start the levels with empty caches")
	drain := fs.Duration("drain", 30*time.Second, "longest wait, after a level, for serve to apply everything")
	queries := fs.Float64("queries", 200, "match queries per second during each level (0: none)")
	apis := fs.String("apis", "http,grpc", "query APIs, taken in turn: http (POST /v1/match), grpc (Index.Match)")
	clients := fs.Int("query-clients", 8, "query clients at once (open loop: a query waits for a free client and its wait counts)")
	probes := fs.Float64("probes", 20, "apply-lag probes per second: a batch just published, polled on /v1/match every --probe-poll until visible")
	probePoll := fs.Duration("probe-poll", time.Millisecond, "poll interval of a lag probe")
	maxLag := fs.Duration("max-lag", time.Second, "a level holds only with apply lag p99 at most this")
	stall := fs.Duration("stall", 0, "stop every engine's PUB writes this long in the middle of each level (queues fill and drop; the gaps must be replayed)")
	stallServer := fs.Bool("stall-server", false, "with --stall: stop the serve process instead (SIGSTOP/SIGCONT)")
	keepGoing := fs.Bool("keep-going", false, "run every level even after one is not held")
	serverMode := fs.String("server", fleet.ServerExec, "exec (run this binary's serve as a child process: its RSS, CPU, fds and goroutines are serve's own) or inproc (a server.Server in this process)")
	shards := fs.Int("shards", 0, shardsHelp)
	blockSize := fs.Int("block-size", 0, "tokens per block (default 16)")
	cacheBlocks := fs.Int("cache-blocks", 0, "each engine's KV cache in blocks (default 1024)")
	perEngine := fs.Int("sessions-per-engine", 0, "open conversations per engine (default 8)")
	bufferSteps := fs.Int("buffer-steps", 0, "each engine's replay buffer in batches (vLLM's buffer_steps; default vLLM's 10000 up to 52 engines, then about 512 MiB over the fleet, at least 256)")
	hwm := fs.Int("hwm-bytes", 0, "each PUB connection's send queue in bytes; past it live messages drop (default 256 MiB over the fleet, 1 to 16 MiB a connection)")
	encoding := fs.String("encoding", fakevllm.EncodingMap, "event encoding: map (vLLM v0.26.0) or array (earlier vLLM)")
	connect := fs.Bool("connect", false, "the engines' PUB sockets connect to serve, which binds one endpoint per engine (bind=true; vLLM connects when its endpoint names a host)")
	replayTimeout := fs.Duration("replay-timeout", 0, "serve's replay_timeout (default 5s)")
	maxReplays := fs.Int("max-concurrent-replays", 0, "serve's max_concurrent_replays (default 32)")
	loadgenNice := fs.Int("loadgen-nice", 10, "with --server exec, lower this process's priority (engines, probes, and the queries without --query-process) by this much once serve has started, so that serve gets the cores first (Linux; 0: off)")
	queryProcess := fs.Bool("query-process", true, "with --server exec, run the match clients in a child process at serve's priority (fed the fleet's recent request chains), so that their latency is serve's and the loopback's, not the load generator's; false: in the load generator")
	profile := fs.String("serve-cpuprofile", "", "with --server exec, serve writes a CPU profile of its whole run to this file (go tool pprof)")
	seed := fs.Uint64("seed", 1, "seed of the workload")
	out := fs.String("out", "", "also write the Markdown table to this file")
	if code, ok := parseFlags(fs, args, stdout); !ok {
		return code
	}
	cfg := fleet.Config{
		Fleet: fakevllm.FleetConfig{
			Engines: *engines, BufferSteps: *bufferSteps, HWMBytes: *hwm, Encoding: *encoding, Seed: *seed, Connect: *connect,
			Workload: fakevllm.Workload{BlockSize: *blockSize, Capacity: *cacheBlocks, Sessions: *perEngine},
		},
		Server: *serverMode, Shards: *shards, ReplayTimeout: *replayTimeout, MaxConcurrentReplays: *maxReplays,
		Duration: *levelDur, WarmupRate: *warmupRate, WarmupMax: *warmupMax, NoWarmup: *noWarmup, Drain: *drain,
		QueryRate: *queries, NoQueries: *queries == 0, APIs: strings.Split(*apis, ","), QueryClients: *clients,
		ProbeRate: *probes, ProbePoll: *probePoll, MaxLag: *maxLag, Stall: *stall, StallServer: *stallServer,
		KeepGoing: *keepGoing, LoadgenNice: *loadgenNice, ServeCPUProfile: *profile, Log: stderr,
	}
	for _, r := range strings.Split(*rates, ",") {
		v, err := strconv.ParseFloat(strings.TrimSpace(r), 64)
		if err != nil {
			return exitCode(stderr, "loadtest", usageErr("--rates: %q is not a number", r))
		}
		cfg.Rates = append(cfg.Rates, v)
	}
	if *serverMode == fleet.ServerExec {
		exe, err := os.Executable()
		if err != nil {
			return exitCode(stderr, "loadtest", fmt.Errorf("--server exec: %w", err))
		}
		cfg.ServeCommand = []string{exe, "serve"}
		if *queryProcess {
			cfg.QueryCommand = []string{exe, "loadtest"}
		}
	}
	if err := cfg.Validate(); err != nil {
		return exitCode(stderr, "loadtest", usageErr("%v", err))
	}
	rep, err := fleet.Run(ctx, cfg)
	if rep != nil {
		var b strings.Builder
		rep.Markdown(&b, "kvindex loadtest "+strings.Join(args, " "))
		fmt.Fprint(stdout, b.String())
		if *out != "" {
			if werr := os.WriteFile(*out, []byte(b.String()), 0o644); werr != nil && err == nil {
				err = werr
			}
		}
		fmt.Fprintf(stdout, "highest rate held with zero loss: %.0f batches/s at %d engines\n", rep.Best(), *engines)
	}
	if err != nil {
		return exitCode(stderr, "loadtest", err)
	}
	if rep.Best() == 0 {
		return 1
	}
	return 0
}
