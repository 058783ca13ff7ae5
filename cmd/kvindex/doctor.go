package main

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"sort"
	"strings"
	"time"

	"github.com/kvindex/kvindex/engine"
	"github.com/kvindex/kvindex/kvevents"
	"github.com/kvindex/kvindex/server"
	"github.com/kvindex/kvindex/subscriber"
	"github.com/kvindex/kvindex/vllmhash"
)

func init() {
	register("doctor", command{
		summary:  "check engines for a few seconds: what they publish, what is wrong; or compare two replicas",
		synopsis: "[--config FILE] [--engine SPEC]... [--for 5s] [flags] | --compare SOURCE1 SOURCE2 [--resync] | --tokenize URL --tokenizer DIR",
		about: "Connects to each engine's KV-event publisher, follows it (with its replay) for --for,\n" +
			"and prints what it saw and which problems it found, with what to do about each.\n" +
			"With --compare, reads the per-worker digests of two indexes (serve URLs or snapshot files)\n" +
			"and prints the workers that differ; --resync then has SOURCE1, a NATS replica, rebuild them.\n" +
			"With --tokenize, sends probe texts to an engine's /tokenize (vLLM's) and compares its token\n" +
			"ids with --tokenizer's (a model folder, as kvindex tokenize), naming the first difference.\n" +
			"Exit status 0: no problem; 1: problems (or a runtime failure); 2: bad usage.",
		run: untilSignal(doctorMain),
	})
}

// doctorMain follows every configured engine (the same configuration as kvindex serve)
// into a private index for --for, then prints per engine what arrived and the problems
// found: the silent-miss diagnostics of package subscriber, plus connection, replay,
// gap and rejection findings. Exit status: 0 no problem, 1 problems found, 2 bad usage.
func doctorMain(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if wantsCompare(args) {
		return doctorCompare(ctx, args, stdout, stderr) // doctorcompare.go
	}
	if hasFlag(args, "tokenize") {
		return doctorTokenize(ctx, args, stdout, stderr) // doctortokenize.go
	}
	fs := newFlags("doctor", stderr)
	fs.Bool("compare", false, compareHelp)
	fs.Bool("resync", false, "with --compare: ask SOURCE1, a NATS replica, to resync each worker that differs from its stream, then compare again")
	fs.String("tokenize", "", tokenizeURLHelp)
	fs.String("tokenizer", "", tokenizerHelp)
	cfgPath := fs.String("config", "", "JSON configuration file (docs/serve.md, Configuration); flags override it")
	blockSize := fs.Int("block-size", 0, "block size of engines that set none (default 16)")
	dur := fs.Duration("for", 5*time.Second, "how long to follow the engines (an idle engine publishes nothing: send it a request meanwhile)")
	hashSeed := fs.String("hash-seed", "", "check every engine's block hashes as vLLM computes them with this PYTHONHASHSEED (engines' hash_seed= overrides)")
	hashAlgo := fs.String("hash-algo", "", "with --hash-seed: the engines' prefix_caching_hash_algo: sha256 (default) or sha256_cbor")
	asJSON := fs.Bool("json", false, "print one JSON object per engine instead of text")
	maxMsg := fs.Int("max-message-bytes", 0, "as kvindex serve: "+maxMessageHelp)
	var engines engineFlags
	fs.Var(&engines, "engine", engineHelp)
	if code, ok := parseFlags(fs, args, stdout); !ok {
		return code
	}
	if *dur <= 0 || *dur > 10*time.Minute {
		fmt.Fprintln(stderr, "kvindex doctor: --for must be in (0, 10m]")
		return 2
	}
	cfg, code, ok := readConfigFlag("doctor", *cfgPath, stderr)
	if !ok {
		return code
	}
	if *blockSize != 0 {
		cfg.BlockSize = *blockSize
	}
	if *maxMsg != 0 {
		cfg.MaxMessageBytes = *maxMsg
	}
	cfg.Engines = append(cfg.Engines, engines...)
	if *hashSeed != "" {
		for i := range cfg.Engines {
			if cfg.Engines[i].HashCheck == nil {
				cfg.Engines[i].HashCheck = &server.HashCheckConfig{Seed: *hashSeed, Algo: *hashAlgo}
			}
		}
	}
	// The run is the observation: a worker that synced and heard nothing (not even
	// buffered history through the replay) by its end is reported.
	if cfg.Diagnose.NoEventsAfter == 0 {
		cfg.Diagnose.NoEventsAfter = server.Duration(time.Nanosecond)
	}
	if cfg.Diagnose.Window == 0 {
		cfg.Diagnose.Window = server.Duration(max(*dur, time.Second))
	}
	cfg.Diagnose.MinSamples = max(cfg.Diagnose.MinSamples, 1)
	if len(cfg.Engines) == 0 {
		fmt.Fprintln(stderr, "kvindex doctor: no engine: give --engine SPEC or --config FILE")
		return 2
	}
	subCfgs, err := cfg.SubscriberConfigs()
	if err != nil {
		fmt.Fprintf(stderr, "kvindex doctor: %v\n", err)
		return 2
	}
	findings, err := runDoctor(ctx, subCfgs, *dur)
	if err != nil {
		fmt.Fprintf(stderr, "kvindex doctor: %v\n", err)
		return 1
	}
	findings = append(findings, unobservable(cfg)...)
	bad := 0
	for _, f := range findings {
		if len(f.Problems) > 0 {
			bad++
		}
		if *asJSON {
			b, _ := json.Marshal(f)
			fmt.Fprintln(stdout, string(b))
		} else {
			f.print(stdout)
		}
	}
	if !*asJSON {
		fmt.Fprintf(stdout, "%d engine(s) checked for %s: %d with problems\n", len(findings), *dur, bad)
	}
	if bad > 0 {
		return 1
	}
	return 0
}

// finding is what the doctor learnt about one publisher.
type finding struct {
	Worker   string               `json:"worker"`
	Endpoint string               `json:"endpoint"`
	Replay   string               `json:"replay_endpoint,omitempty"`
	Model    string               `json:"model"`
	Block    int                  `json:"block_size"`
	State    string               `json:"state"`
	Saw      []string             `json:"saw"`
	Problems []subscriber.Problem `json:"problems"`
}

func (f *finding) print(w io.Writer) {
	fmt.Fprintf(w, "engine %s  %s", f.Worker, f.Endpoint)
	if f.Replay != "" {
		fmt.Fprintf(w, " (replay %s)", f.Replay)
	}
	fmt.Fprintf(w, "  model %q, block_size %d\n", f.Model, f.Block)
	fmt.Fprintf(w, "  state     %s\n", f.State)
	for i, s := range f.Saw {
		label := "  saw       "
		if i > 0 {
			label = "            "
		}
		fmt.Fprintln(w, label+s)
	}
	if len(f.Problems) == 0 {
		fmt.Fprintln(w, "  problems  none")
	}
	for i, p := range f.Problems {
		label := "  problems  "
		if i > 0 {
			label = "            "
		}
		fmt.Fprintf(w, "%s%s: %s\n              fix: %s\n", label, p.Code, p.Message, p.Hint)
	}
	fmt.Fprintln(w)
}

// runDoctor follows the publishers into a private index for d and diagnoses each.
func runDoctor(ctx context.Context, cfgs []subscriber.Config, d time.Duration) ([]finding, error) {
	eng, err := engine.New(engine.Config{})
	if err != nil {
		return nil, err
	}
	defer eng.Close()
	subs := make([]*subscriber.Subscriber, len(cfgs))
	for i, c := range cfgs {
		c.Index = eng
		c.Grace = -1
		if subs[i], err = subscriber.New(c); err != nil {
			return nil, err
		}
	}
	// Diagnose at the end of the run, before Run returns and marks the subscribers stopped.
	out := make([]finding, len(subs))
	diagnose := func() {
		now := time.Now()
		for i, s := range subs {
			out[i] = diagnoseOne(s, cfgs[i], now)
		}
	}
	if err := subscriber.RunFor(ctx, subs, d, diagnose); err != nil {
		return nil, err
	}
	return out, nil
}

func diagnoseOne(s *subscriber.Subscriber, c subscriber.Config, now time.Time) finding {
	st := s.Status()
	f := finding{Worker: st.Worker, Endpoint: st.Endpoint, Replay: st.ReplayEndpoint, Model: st.Model, Block: c.BlockSize}
	f.State = st.State.String()
	if st.Connected {
		f.State += ", connected"
	}
	if st.Synced {
		f.State += ", synced"
	}
	seqs := "no batch"
	if st.HasSeq {
		seqs = fmt.Sprintf("last seq %d", st.LastSeq)
	}
	f.Saw = append(f.Saw, fmt.Sprintf("%d messages, %d batches (%s), %d replays; events applied: %d stored, %d removed, %d cleared",
		st.Messages, st.Batches, seqs, st.Replays, st.Stored, st.Removed, st.Cleared))
	var rej []string
	for r, n := range st.Rejected {
		if n > 0 {
			rej = append(rej, fmt.Sprintf("%s %d", subscriber.Reason(r), n))
		}
	}
	for r, n := range st.DecoderRejected {
		if n > 0 {
			rej = append(rej, fmt.Sprintf("%s %d", subscriber.DecoderReasonName(kvevents.Reason(r)), n))
		}
	}
	sort.Strings(rej)
	if len(rej) > 0 {
		f.Saw = append(f.Saw, "not applied: "+strings.Join(rej, ", "))
	}
	if len(st.Diag.SkippedGroups) > 0 {
		var g []string
		for _, x := range st.Diag.SkippedGroups {
			g = append(g, fmt.Sprintf("%s %d", x.Group, x.Count))
		}
		f.Saw = append(f.Saw, "KV-cache groups not indexed (they cannot serve a prefix): "+strings.Join(g, ", "))
	}
	if st.Diag.HashCheck {
		h := st.Diag.Hash
		if c.HashCheck.Algo == "" {
			c.HashCheck.Algo = vllmhash.SHA256Pickle
		}
		f.Saw = append(f.Saw, fmt.Sprintf("block-hash check (%s, seed %q): %d matched, %d mismatched, %d unverifiable, %d sampled out",
			c.HashCheck.Algo, c.HashCheck.Seed, h.Matched, h.Mismatched, h.Unverifiable, h.SampledOut))
	} else {
		f.Saw = append(f.Saw, "block-hash check off (--hash-seed or hash_seed= to check vLLM's own block hashes)")
	}
	if st.GapsDetected > 0 || st.Restarts > 0 {
		f.Saw = append(f.Saw, fmt.Sprintf("gaps %d detected, %d recovered, %d unrecoverable; %d publisher restarts",
			st.GapsDetected, st.GapsRecovered, st.GapsUnrecoverable, st.Restarts))
	}
	f.Problems = s.Problems(now)
	add := func(code, msg, hint string) {
		f.Problems = append(f.Problems, subscriber.Problem{Code: code, Message: msg, Hint: hint})
	}
	switch {
	case st.Connects == 0 && !st.Connected:
		add("unreachable", "never connected: "+orNone(st.LastError),
			"check the endpoint (vLLM: --kv-events-config endpoint, default tcp://*:5557; data-parallel rank r on port + r) and that the engine runs with KV events enabled")
	case !st.Synced:
		add("not_synced", "connected but the catch-up replay did not finish: "+orNone(st.LastError),
			"check the replay endpoint (vLLM: replay_endpoint in --kv-events-config) or leave it out")
	}
	if st.ReplayFailures > 0 {
		add("replay_failed", fmt.Sprintf("%d replay requests failed: %s", st.ReplayFailures, orNone(st.LastError)),
			"check the replay endpoint and that the engine's replay socket is reachable from here")
	}
	if st.State == subscriber.StateStale {
		add("stale", "part of the engine's history could not be had (gap not buffered, replay failed, or no replay endpoint): the index holds a subset of its blocks",
			"configure the replay endpoint, raise the engine's buffer_steps, or wait for the periodic resync")
	}
	if n := st.DecoderRejected[kvevents.ReasonMalformedEvent] + st.Rejected[subscriber.ReasonMalformedBatch]; n > 0 {
		add("malformed", fmt.Sprintf("%d batches or events could not be decoded", n),
			"the publisher speaks another wire format than vLLM's or SGLang's msgpack EventBatch; see kvindex's kvevents package")
	}
	if st.PeersRefused > 0 {
		hint := "the peer on the endpoint is not a vLLM/SGLang ZMTP publisher, or a bound endpoint has too many connections"
		if strings.Contains(st.LastRefusal, "-byte cap") {
			hint = "the engine sends batches larger than max_message_bytes (serve and doctor --max-message-bytes, default 16 MiB): raise it above the engine's largest batch, or make the engine publish smaller batches"
		}
		add("peer_refused", fmt.Sprintf("%d connections refused by the frame guard; the last: %s", st.PeersRefused, st.LastRefusal), hint)
	}
	if st.Rejected[subscriber.ReasonRankMismatch] > 0 {
		add("rank_mismatch", fmt.Sprintf("%d events carried another data-parallel rank", st.Rejected[subscriber.ReasonRankMismatch]),
			"set dp_ranks/dp_rank_start to the engine's data-parallel layout (rank r publishes on port + r)")
	}
	if f.Problems == nil {
		f.Problems = []subscriber.Problem{}
	}
	return f
}

// unobservable are the findings for the engines doctor cannot follow: those without an
// endpoint (serve answers for them from predictions alone). Each is a problem: doctor
// vouches only for what it saw.
func unobservable(cfg server.Config) []finding {
	var out []finding
	for _, e := range cfg.Engines {
		if e.Endpoint != "" {
			continue
		}
		out = append(out, finding{Worker: e.Worker, Model: e.Model, Block: cmp.Or(e.BlockSize, cfg.BlockSize, server.DefaultBlockSize),
			State: "not observed", Saw: []string{"nothing: no endpoint to follow"},
			Problems: []subscriber.Problem{{Code: "unobservable",
				Message: "no endpoint: the worker publishes no events, so doctor cannot check it (serve answers for it from predictions alone)",
				Hint:    "give endpoint= (vLLM: --kv-events-config endpoint) if the engine publishes KV events; otherwise this worker's matches are only as good as the router's /v1/routed reports"}}})
	}
	return out
}

func orNone(s string) string {
	if s == "" {
		return "no error recorded"
	}
	return s
}
