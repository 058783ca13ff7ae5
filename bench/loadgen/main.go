package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/kvindex/kvindex/api/kvindexv1"
	"github.com/kvindex/kvindex/client"
	"github.com/kvindex/kvindex/internal/replay"
	"github.com/kvindex/kvindex/server"
	"github.com/kvindex/kvindex/sim"
	"github.com/kvindex/kvindex/subscriber/pubtest"
)

// Options shape one run.
type Options struct {
	Trace            string        // Mooncake trace (JSON Lines)
	Ranks            int           // publisher data-parallel ranks (workers)
	BlockSize        int           // tokens per block
	Capacity         int           // blocks per rank (LRU)
	Burst            int           // trace records streamed unpaced before measuring
	EventRate        float64       // trace records/s streamed during the measurement
	Queries          int           // distinct prompts (the last records of the burst) the load cycles over
	Concurrency      []int         // levels
	Modes            []string      // "hashes", "tokens"
	APIs             []string      // "http", "grpc": measured level by level, alternating
	Duration         time.Duration // per level
	MaxRequests      int           // per level
	PublisherSeconds float64       // the publisher's own bound
}

// Result is one level's figures.
type Result struct {
	API           string // "http" or "grpc"
	Mode          string
	Concurrency   int
	Requests      int
	Errors        int
	Seconds       float64
	RPS           float64
	P50, P99, Max time.Duration
	MeanScore     float64 // mean best score / blocks of the answered queries
	EventsPerSec  float64 // index events applied per second during the level
}

// Report is a whole run.
type Report struct {
	Opts        Options
	Results     []Result
	Workers     int
	Blocks      int64
	Memberships int64
	Batches     uint64
	Gaps        uint64
	Recovered   uint64
}

func main() {
	var o Options
	var conc, modes, apis string
	fs := flag.NewFlagSet("loadgen", flag.ExitOnError)
	fs.StringVar(&o.Trace, "trace", "", "Mooncake trace (default: shared/traces/conversation_trace.jsonl found above the working directory)")
	fs.IntVar(&o.Ranks, "ranks", 4, "publisher data-parallel ranks (one worker each)")
	fs.IntVar(&o.BlockSize, "block-size", 16, "tokens per block")
	fs.IntVar(&o.Capacity, "capacity", 100000, "blocks per rank (LRU cache of the simulated engine)")
	fs.IntVar(&o.Burst, "burst", 2000, "trace records streamed unpaced before measuring")
	fs.Float64Var(&o.EventRate, "event-rate", 0, "trace records/s streamed while measuring (0: the rest of the trace spread over the levels, at most 200/s)")
	fs.IntVar(&o.Queries, "queries", 1000, "distinct prompts the load cycles over (the last records of the burst)")
	fs.StringVar(&conc, "concurrency", "1,4,16,64", "concurrency levels")
	fs.StringVar(&modes, "modes", "hashes,tokens", "request forms: hashes (content_hashes), tokens")
	fs.StringVar(&apis, "apis", "http,grpc", "APIs to measure, alternating at each level: http (POST /v1/match), grpc (Index.Match)")
	fs.DurationVar(&o.Duration, "duration", 5*time.Second, "time per level")
	fs.IntVar(&o.MaxRequests, "max-requests", 500000, "requests per level at most")
	fs.Float64Var(&o.PublisherSeconds, "publisher-seconds", 0, "publisher's own time bound (0: derived from the levels)")
	out := fs.String("out", "", "also write the Markdown report to this file")
	_ = fs.Parse(os.Args[1:])
	for _, c := range strings.Split(conc, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(c))
		if err != nil || n < 1 || n > 1024 {
			fmt.Fprintf(os.Stderr, "loadgen: bad concurrency %q\n", c)
			os.Exit(2)
		}
		o.Concurrency = append(o.Concurrency, n)
	}
	o.Modes = strings.Split(modes, ",")
	o.APIs = strings.Split(apis, ",")
	rep, err := Run(context.Background(), o, os.Stderr)
	if err != nil {
		fmt.Fprintf(os.Stderr, "loadgen: %v\n", err)
		os.Exit(1)
	}
	md := rep.Markdown(strings.Join(append([]string{"go run ./bench/loadgen"}, os.Args[1:]...), " "))
	fmt.Print(md)
	if *out != "" {
		if err := os.WriteFile(*out, []byte(md), 0o644); err != nil {
			fmt.Fprintf(os.Stderr, "loadgen: %v\n", err)
			os.Exit(1)
		}
	}
}

// FindTrace looks for shared/traces/conversation_trace.jsonl beside or above dir.
func FindTrace(dir string) (string, error) {
	for d := dir; ; d = filepath.Dir(d) {
		for _, p := range []string{filepath.Join(d, "shared", "traces", "conversation_trace.jsonl"),
			filepath.Join(d, "..", "shared", "traces", "conversation_trace.jsonl")} {
			if _, err := os.Stat(p); err == nil {
				return filepath.Clean(p), nil
			}
		}
		if filepath.Dir(d) == d {
			return "", errors.New("shared/traces/conversation_trace.jsonl not found; pass --trace")
		}
	}
}

// Run runs the whole measurement; progress goes to logw.
func Run(ctx context.Context, o Options, logw io.Writer) (*Report, error) {
	if o.Trace == "" {
		wd, _ := os.Getwd()
		t, err := FindTrace(wd)
		if err != nil {
			return nil, err
		}
		o.Trace = t
	}
	if _, err := pubtest.Python(); err != nil {
		return nil, err
	}
	f, err := os.Open(o.Trace)
	if err != nil {
		return nil, err
	}
	// The queries are the last Queries records of the burst: prompts the engines served
	// recently, which their LRU caches are most likely to still hold.
	recs, err := sim.ReadTrace(bufio.NewReader(f), max(o.Burst, o.Queries))
	f.Close()
	if err != nil {
		return nil, err
	}
	recs = recs[max(0, len(recs)-o.Queries):]
	wl, err := sim.FromTrace("trace", recs, o.BlockSize)
	if err != nil {
		return nil, err
	}
	if len(o.APIs) == 0 {
		o.APIs = []string{"http"}
	}
	for _, a := range o.APIs {
		if a != "http" && a != "grpc" {
			return nil, fmt.Errorf("unknown API %q (want http, grpc)", a)
		}
	}
	levels := len(o.Concurrency) * len(o.Modes) * len(o.APIs)
	if o.EventRate == 0 {
		// The stream must last the whole measurement, or the later levels run against an
		// index that no longer changes: spread what the burst leaves of the trace over
		// the levels, with a margin for the time between them.
		n, err := countLines(o.Trace)
		if err != nil {
			return nil, err
		}
		o.EventRate = min(200, float64(max(n-o.Burst, 1))/(float64(levels)*o.Duration.Seconds()*1.25))
	}
	if o.PublisherSeconds == 0 {
		o.PublisherSeconds = float64(levels)*o.Duration.Seconds()*1.5 + 120
	}

	pub, err := pubtest.StartArgs([]string{
		"--mode", "trace", "--trace", o.Trace, "--dp-ranks", strconv.Itoa(o.Ranks), "--consecutive-ports", "--bind",
		"--block-size", strconv.Itoa(o.BlockSize), "--capacity", strconv.Itoa(o.Capacity),
		"--burst", strconv.Itoa(o.Burst), "--rate", fmt.Sprint(o.EventRate),
		"--duration", fmt.Sprint(o.PublisherSeconds), "--linger", "5", "--wait-go", "--encoding", "mixed",
	})
	if err != nil {
		return nil, err
	}
	defer pub.Close()
	cfg := server.Config{
		Listen:       "127.0.0.1:0",
		MaxBodyBytes: 8 << 20,
		GRPC:         server.GRPCConfig{Listen: "127.0.0.1:0", MaxMessageBytes: 8 << 20},
		Engines: []server.EngineConfig{{
			Endpoint: pub.Ranks[0].Endpoint, ReplayEndpoint: pub.Ranks[0].ReplayEndpoint,
			Worker: "engine", Model: "trace", BlockSize: o.BlockSize, DPRanks: o.Ranks,
		}},
	}
	srv, err := server.New(cfg, server.Options{})
	if err != nil {
		return nil, err
	}
	defer func() {
		sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
	}()
	if err := srv.Start(); err != nil {
		return nil, err
	}
	base := "http://" + srv.Addr()
	tr := &http.Transport{MaxIdleConns: 2048, MaxIdleConnsPerHost: 2048, IdleConnTimeout: 30 * time.Second}
	defer tr.CloseIdleConnections()
	hc := &http.Client{Transport: tr, Timeout: 10 * time.Second}
	// One gRPC connection: HTTP/2 multiplexes the level's callers over it, as a router's
	// shared client would.
	gc, err := client.Dial(srv.GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(8<<20), grpc.MaxCallSendMsgSize(8<<20)))
	if err != nil {
		return nil, err
	}
	defer gc.Close()

	if err := waitUntil(ctx, 30*time.Second, func() bool {
		resp, err := hc.Get(base + "/readyz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == 200
	}); err != nil {
		return nil, fmt.Errorf("server never ready: %w", err)
	}
	// Start streaming; wait for the burst to be applied.
	if err := pub.WriteLine("go"); err != nil {
		return nil, err
	}
	var burst struct {
		BurstDone bool     `json:"burst_done"`
		Seqs      []uint64 `json:"seqs"`
	}
	if o.Burst > 0 {
		if err := pub.Next(&burst); err != nil || !burst.BurstDone {
			return nil, fmt.Errorf("publisher burst: %v", err)
		}
		subs := srv.Subscribers()
		if err := waitUntil(ctx, 120*time.Second, func() bool {
			for i, s := range subs {
				st := s.Status()
				if burst.Seqs[i] > 0 && (!st.HasSeq || st.LastSeq+1 < burst.Seqs[i]) {
					return false
				}
			}
			return true
		}); err != nil {
			return nil, fmt.Errorf("burst never applied: %w", err)
		}
	}
	fmt.Fprintf(logw, "loadgen: burst of %d trace records applied; %d blocks held\n", o.Burst, srv.Engine().Stats().Blocks)

	// Requests, built once: JSON bodies for HTTP, messages for gRPC, the same queries.
	bodies := map[string][][]byte{}
	msgs := map[string][]*kvindexv1.MatchRequest{}
	for _, mode := range o.Modes {
		for i, req := range wl.Requests {
			var v any
			m := &kvindexv1.MatchRequest{Model: "trace"}
			switch mode {
			case "hashes":
				v = map[string]any{"model": "trace", "content_hashes": req.Blocks}
				m.ContentHashes = req.Blocks
			case "tokens":
				toks := wholeBlocks(sim.TraceTokens(nil, recs[i]), o.BlockSize)
				v = map[string]any{"model": "trace", "tokens": toks}
				m.Tokens = toks
			default:
				return nil, fmt.Errorf("unknown mode %q", mode)
			}
			b, _ := json.Marshal(v)
			bodies[mode] = append(bodies[mode], b)
			msgs[mode] = append(msgs[mode], m)
		}
	}
	rep := &Report{Opts: o}
	for _, mode := range o.Modes {
		for _, c := range o.Concurrency {
			for _, api := range o.APIs {
				call := httpCall(hc, base, bodies[mode])
				if api == "grpc" {
					call = grpcCall(gc, msgs[mode])
				}
				r, err := level(ctx, srv, call, c, o)
				if err != nil {
					return nil, fmt.Errorf("%s %s c=%d: %w", api, mode, c, err)
				}
				r.API, r.Mode = api, mode
				fmt.Fprintf(logw, "loadgen: %-4s %-6s c=%-3d %8.0f req/s p50 %v p99 %v errors %d\n", api, mode, c, r.RPS, r.P50, r.P99, r.Errors)
				rep.Results = append(rep.Results, r)
			}
		}
	}
	es := srv.Engine().Stats()
	rep.Workers, rep.Blocks, rep.Memberships = es.Workers, es.Blocks, es.Memberships
	for _, s := range srv.Subscribers() {
		st := s.Status()
		rep.Batches += st.Batches
		rep.Gaps += st.GapsDetected
		rep.Recovered += st.GapsRecovered
	}
	return rep, nil
}

// countLines counts the records of a JSON Lines file.
func countLines(path string) (int, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	return bytes.Count(b, []byte{'\n'}), nil
}

// wholeBlocks drops a trailing partial block, as the server would.
func wholeBlocks(toks []uint32, bs int) []uint32 { return toks[:len(toks)/bs*bs] }

func waitUntil(ctx context.Context, timeout time.Duration, cond func() bool) error {
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			return errors.New("timed out")
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(10 * time.Millisecond): // bounded poll of a condition
		}
	}
	return nil
}

// call sends request i (modulo the request set) and returns the best score over the
// query's blocks, or an error. Calls run concurrently.
type call func(ctx context.Context, i int) (score float64, err error)

// httpCall posts the JSON bodies to /v1/match.
func httpCall(hc *http.Client, base string, bodies [][]byte) call {
	return func(ctx context.Context, i int) (float64, error) {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/match", bytes.NewReader(bodies[i%len(bodies)]))
		if err != nil {
			return 0, err
		}
		req.Header.Set("Content-Type", "application/json")
		r, err := hc.Do(req)
		if err != nil {
			return 0, err
		}
		var resp server.MatchResponse
		derr := json.NewDecoder(r.Body).Decode(&resp)
		r.Body.Close()
		if r.StatusCode != 200 || derr != nil {
			return 0, fmt.Errorf("status %d, %v", r.StatusCode, derr)
		}
		if len(resp.Matches) > 0 && resp.Blocks > 0 {
			return float64(resp.Matches[0].Score) / float64(resp.Blocks), nil
		}
		return 0, nil
	}
}

// grpcCall sends the messages to Index.Match.
func grpcCall(gc *client.Client, msgs []*kvindexv1.MatchRequest) call {
	return func(ctx context.Context, i int) (float64, error) {
		resp, err := gc.Match(ctx, msgs[i%len(msgs)])
		if err != nil {
			return 0, err
		}
		if len(resp.Matches) > 0 && resp.Blocks > 0 {
			return float64(resp.Matches[0].Score) / float64(resp.Blocks), nil
		}
		return 0, nil
	}
}

func level(ctx context.Context, srv *server.Server, send call, c int, o Options) (Result, error) {
	ctx, cancel := context.WithTimeout(ctx, o.Duration)
	defer cancel()
	var next atomic.Int64
	var errs atomic.Int64
	lat := make([][]time.Duration, c)
	scores := make([]float64, c)
	events0 := srv.Engine().Stats().Events
	start := time.Now()
	var wg sync.WaitGroup
	for g := 0; g < c; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			// Each call gets a context of its own: the level's deadline ends the loop,
			// never a call in flight (whose latency would then be cut short).
			for ctx.Err() == nil {
				i := next.Add(1) - 1
				if i >= int64(o.MaxRequests) {
					return
				}
				t0 := time.Now()
				cctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				score, err := send(cctx, int(i))
				cancel()
				d := time.Since(t0)
				if err != nil {
					errs.Add(1)
					continue
				}
				lat[g] = append(lat[g], d)
				scores[g] += score
			}
		}()
	}
	wg.Wait()
	el := time.Since(start).Seconds()
	var all []time.Duration
	var sc float64
	for g := range lat {
		all = append(all, lat[g]...)
		sc += scores[g]
	}
	r := Result{Concurrency: c, Requests: len(all), Errors: int(errs.Load()), Seconds: el}
	if len(all) == 0 {
		return r, errors.New("no request succeeded")
	}
	r.RPS = float64(len(all)) / el
	r.P50 = replay.Percentile(all, 0.50)
	r.P99 = replay.Percentile(all, 0.99)
	r.Max = replay.Percentile(all, 1)
	r.MeanScore = sc / float64(len(all))
	r.EventsPerSec = float64(srv.Engine().Stats().Events-events0) / el
	return r, nil
}

// Markdown renders the report.
func (r *Report) Markdown(command string) string {
	var b strings.Builder
	o := r.Opts
	fmt.Fprintf(&b, "# kvindex serve under load (bench/loadgen)\n\n")
	fmt.Fprintf(&b, "Command: `%s`\n\n", command)
	fmt.Fprintf(&b, "Machine: %d CPUs (GOMAXPROCS %d), %s/%s, %s. Client, server and publisher share the machine over 127.0.0.1.\n\n",
		runtime.NumCPU(), runtime.GOMAXPROCS(0), runtime.GOOS, runtime.GOARCH, runtime.Version())
	fmt.Fprintf(&b, "Setup: the Python test publisher (real libzmq, vLLM's wire protocol, mixed array/map events) streams the Mooncake trace "+
		"`%s` over %d data-parallel ranks (LRU capacity %d blocks each, block size %d): %d records unpaced first, then %.1f records/s "+
		"during the measurement. The load generator cycles over the last %d prompts of the burst; each level runs %v (at most %d requests). "+
		"\"hashes\" sends `content_hashes` (client-side hashing), \"tokens\" sends the token ids (server-side hashing; bodies of up to ~60 KB). "+
		"API \"http\" is POST /v1/match with JSON over pooled HTTP/1.1 connections, \"grpc\" is Index.Match with protobuf over one HTTP/2 connection "+
		"(package client); at each level the APIs run one after the other, on the same server, index and event stream.\n\n",
		filepath.Base(o.Trace), o.Ranks, o.Capacity, o.BlockSize, o.Burst, o.EventRate, o.Queries, o.Duration, o.MaxRequests)
	fmt.Fprintf(&b, "| API | request form | concurrency | requests | req/s | p50 | p99 | max | errors | mean best score | index events/s during level |\n")
	fmt.Fprintf(&b, "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, x := range r.Results {
		fmt.Fprintf(&b, "| %s | %s | %d | %d | %.0f | %s | %s | %s | %d | %.2f | %.0f |\n", x.API, x.Mode, x.Concurrency, x.Requests, x.RPS,
			fmtDur(x.P50), fmtDur(x.P99), fmtDur(x.Max), x.Errors, x.MeanScore, x.EventsPerSec)
	}
	fmt.Fprintf(&b, "\nIndex at the end: %d workers, %d blocks held (%d memberships in the positional index); %d batches applied, %d gaps detected, %d recovered by replay.\n",
		r.Workers, r.Blocks, r.Memberships, r.Batches, r.Gaps, r.Recovered)
	fmt.Fprintf(&b, "\nReading: latency is measured by the client per request (the round trip over loopback, JSON or protobuf encoding and decoding "+
		"included) while the publisher (Python, one process for all ranks) and the load generator compete with the server for the same cores, "+
		"so the throughputs are a lower bound for the server alone (and the latencies an upper bound). \"mean best score\" is the best worker's score divided by the query's blocks, "+
		"averaged: evidence that the queries hit a populated index; it falls over the run because the stream keeps evicting the queried "+
		"prompts from the engines' LRU caches (removals reach the index like stores). \"index events/s\" counts the stored and removed "+
		"events the index accepted during the level. The server's own cost per request, without HTTP: "+
		"`go test -run '^$' -bench MatchHandler ./server/`.\n")
	return b.String()
}

func fmtDur(d time.Duration) string {
	switch {
	case d >= time.Millisecond:
		return fmt.Sprintf("%.2f ms", float64(d)/1e6)
	default:
		return fmt.Sprintf("%.0f µs", float64(d)/1e3)
	}
}
