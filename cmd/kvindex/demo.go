package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"time"

	"github.com/kvindex/kvindex/internal/fakevllm"
	"github.com/kvindex/kvindex/server"
)

func init() {
	register("demo", command{
		summary:  "try serve locally: simulated vLLM engines publishing into a serve, and three curl lines to ask it",
		synopsis: "[--engines N] [--listen ADDR] [--engines-only] [flags]",
		about: "Starts N simulated vLLM engines on 127.0.0.1 (each a real ZMTP PUB socket and replay\n" +
			"ROUTER publishing msgpack KV-event batches, package internal/fakevllm) and a serve following\n" +
			"them, then prints the serve command line it runs and three curl lines: the workers,\n" +
			"a match for a prompt some engines hold, the metrics. Nothing but this binary is\n" +
			"needed. With --engines-only it starts the engines alone and prints the serve command\n" +
			"to run in another terminal. SIGTERM or SIGINT stops it.",
		run: untilSignal(demoMain),
	})
}

// demoBlockSize and demoSystemBlocks keep the demo's prompts short enough to print: a
// system prompt is 4 blocks of 4 tokens.
const (
	demoBlockSize    = 4
	demoSystemBlocks = 4
)

// demoMain is `kvindex demo`. It exits 2 for bad flags, 1 when the engines or serve
// cannot start (an address in use), 0 when a signal stops it.
func demoMain(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := newFlags("demo", stderr)
	engines := fs.Int("engines", 4, "simulated engines (1..64)")
	rate := fs.Float64("batch-rate", 20, "event batches per second over all engines (each one request's removals and stores)")
	listen := fs.String("listen", "", "serve's HTTP API address (default "+server.DefaultListen+")")
	enginesOnly := fs.Bool("engines-only", false, "start the engines only and print the serve command that follows them")
	seed := fs.Uint64("seed", 1, "seed of the workload")
	logLevel := fs.String("log-level", "info", logLevelHelp)
	if code, ok := parseFlags(fs, args, stdout); !ok {
		return code
	}
	fail := func(code int, format string, a ...any) int {
		fmt.Fprintf(stderr, "kvindex demo: "+format+"\n", a...)
		return code
	}
	level, err := parseLogLevel(*logLevel)
	switch {
	case *engines < 1 || *engines > 64:
		return fail(2, "--engines %d: want 1..64", *engines)
	case !(*rate > 0 && *rate <= 10000):
		return fail(2, "--batch-rate %v: want (0, 10000] batches/s", *rate)
	case err != nil:
		return fail(2, "--log-level: %v", err)
	}
	addr := *listen
	if addr == "" {
		addr = server.DefaultListen
	}
	// Four system prompts, two per engine: with a few engines each prompt is cached on
	// some of them and (almost always) not all.
	fl, err := fakevllm.NewFleet(fakevllm.FleetConfig{Engines: *engines, Drivers: 1, Seed: *seed, Workload: fakevllm.Workload{
		BlockSize: demoBlockSize, SystemBlocks: demoSystemBlocks, SystemPrompts: 4, SystemsPerEngine: 2}})
	if err != nil {
		return fail(1, "%v", err)
	}
	defer fl.Close()
	cfg := demoConfig(fl, addr)
	fmt.Fprintf(stdout, "kvindex demo: %d simulated vLLM engines on 127.0.0.1 publish %g batches/s of model %q (block size %d)\n",
		*engines, *rate, fakevllm.Model, demoBlockSize)

	stopDriving := fl.DriveInBackground(ctx, *rate) // publish until the demo ends
	defer stopDriving()

	if *enginesOnly {
		fmt.Fprintf(stdout, "kvindex demo: run serve in another terminal:\n\n  %s\n\nkvindex demo: waiting for serve at %s\n", serveCommand(cfg), addr)
		if prompt, err := demoPrompt(ctx, fl, addr, 0); err == nil {
			printCurls(stdout, addr, prompt)
		}
		<-ctx.Done()
		fmt.Fprintln(stdout, "kvindex demo: stopped")
		return 0
	}

	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level}))
	s, err := server.New(cfg, server.Options{Logger: log})
	if err != nil {
		return fail(1, "%v", err)
	}
	if err := s.Start(); err != nil {
		_ = s.Shutdown(context.Background())
		return fail(1, "%v", err)
	}
	defer func() {
		sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = s.Shutdown(sctx)
	}()
	addr = s.Addr()
	cfg.Listen = addr
	fmt.Fprintf(stdout, "kvindex demo: serve listening on %s, following them as\n\n  %s\n\n", addr, serveCommand(cfg))
	prompt, err := demoPrompt(ctx, fl, addr, 30*time.Second)
	if err != nil {
		if ctx.Err() != nil {
			return 0
		}
		return fail(1, "%v", err)
	}
	printCurls(stdout, addr, prompt)
	select {
	case <-ctx.Done():
	case err := <-s.Errors():
		return fail(1, "serve: %v", err)
	}
	fmt.Fprintln(stdout, "kvindex demo: stopped")
	return 0
}

// demoConfig is serve's configuration for the fleet's engines.
func demoConfig(fl *fakevllm.Fleet, listen string) server.Config {
	cfg := server.Config{Listen: listen, BlockSize: demoBlockSize}
	for i := range fl.Engines() {
		pub, rep := fl.Endpoints(i)
		cfg.Engines = append(cfg.Engines, server.EngineConfig{Endpoint: pub, ReplayEndpoint: rep, Worker: fakevllm.WorkerName(i), Model: fakevllm.Model})
	}
	return cfg
}

// serveCommand is the kvindex serve command line that cfg describes.
func serveCommand(cfg server.Config) string {
	var b strings.Builder
	fmt.Fprintf(&b, "kvindex serve --listen %s --block-size %d", cfg.Listen, cfg.BlockSize)
	for _, e := range cfg.Engines {
		fmt.Fprintf(&b, " \\\n      --engine endpoint=%s,replay=%s,worker=%s,model=%s", e.Endpoint, e.ReplayEndpoint, e.Worker, e.Model)
	}
	return b.String()
}

// matchBody is the /v1/match request for prompt.
func matchBody(prompt []uint32) string {
	b, _ := json.Marshal(struct {
		Model  string   `json:"model"`
		Tokens []uint32 `json:"tokens"`
	}{fakevllm.Model, prompt})
	return string(b)
}

// printCurls prints the three lines a newcomer tries first.
func printCurls(w io.Writer, addr string, prompt []uint32) {
	fmt.Fprintf(w, "Try:\n\n  curl -s http://%s/v1/workers\n  curl -s http://%s/v1/match -d '%s'\n  curl -s http://%s/metrics | grep -E '^kvindex_(blocks|events_applied_total\\{kind=\"stored\")'\n\nCtrl-C stops it.\n",
		addr, addr, matchBody(prompt), addr)
}

// demoPrompt waits (at most timeout, 0: until ctx ends) until serve at addr answers from
// the engines' events and returns the system prompt matched by the fewest engines (but
// some): a match that shows which engines hold it and which not.
func demoPrompt(ctx context.Context, fl *fakevllm.Fleet, addr string, timeout time.Duration) ([]uint32, error) {
	hc := &http.Client{Timeout: 5 * time.Second}
	defer hc.CloseIdleConnections()
	if timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, timeout)
		defer cancel()
	}
	for wait := 10 * time.Millisecond; ; wait = min(2*wait, 250*time.Millisecond) {
		best, bestN := -1, 0
		for i := range fl.SystemPrompts() {
			n, err := demoMatches(ctx, hc, addr, fl.SystemPrompt(i))
			if err != nil {
				break
			}
			if n > 0 && (best < 0 || n < bestN) {
				best, bestN = i, n
			}
		}
		if best >= 0 {
			return fl.SystemPrompt(best), nil
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, fmt.Errorf("no engine's events reached serve at %s: %w", addr, ctx.Err())
		case <-t.C:
		}
	}
}

// demoMatches asks serve how many workers hold prompt's blocks.
func demoMatches(ctx context.Context, hc *http.Client, addr string, prompt []uint32) (int, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+addr+"/v1/match", bytes.NewReader([]byte(matchBody(prompt))))
	if err != nil {
		return 0, err
	}
	resp, err := hc.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	var mr server.MatchResponse
	if err := json.NewDecoder(resp.Body).Decode(&mr); err != nil || resp.StatusCode != http.StatusOK {
		return 0, fmt.Errorf("match: status %d: %v", resp.StatusCode, err)
	}
	return len(mr.Matches), nil
}
