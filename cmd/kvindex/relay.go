package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"

	"github.com/kvindex/kvindex/fabric"
	"github.com/kvindex/kvindex/internal/oplog"
	"github.com/kvindex/kvindex/server"
	"github.com/kvindex/kvindex/subscriber"
)

// relayMain is `kvindex relay`. It exits 2 for a bad command line, 1 when NATS cannot be
// reached (or the stream created) within --connect-timeout, when --listen cannot bind,
// or when following an engine fails; 0 once --ops is published or a signal stops it.
func relayMain(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := newFlags("relay", stderr)
	url := fs.String("nats", "", natsHelp+" (required)")
	stream := fs.String("stream", fabric.DefaultStream, streamHelp+" (created if missing)")
	prefix := fs.String("subject-prefix", fabric.DefaultSubjectPrefix, "subject prefix of the stream")
	memory := fs.Bool("memory", false, "create the stream in memory instead of files")
	dups := fs.Duration("duplicates", fabric.DefaultDuplicates, "the stream's deduplication window")
	maxAge := fs.Duration("max-age", 0, "the stream's retention by age (0: unbounded)")
	opsPath := fs.String("ops", "", "publish the events of this op log (queries skipped) and exit, instead of following engines")
	model := fs.String("model", "", "model name the --ops events are published under, in its namespace (the one serve --nats --models NAME=... answers from)")
	grace := fs.Duration("grace", 0, graceHelp)
	maxMsg := fs.Int("max-message-bytes", 0, maxMessageHelp)
	logLevel := fs.String("log-level", "info", logLevelHelp)
	tiersFlag := fs.String("tiers", "", "media mapped to storage tiers over the defaults, as MEDIUM=TIER,... (as kvindex serve --tiers)")
	metricsToken := fs.String("auth-token-file", "", "with --listen: /metrics requires \"Authorization: Bearer TOKEN\" with a token of this file (needed on a non-loopback --listen unless --allow-unauthenticated)")
	allowUnauth := fs.Bool("allow-unauthenticated", false, "with --listen: serve /metrics to anyone on a non-loopback address")
	listen := fs.String("listen", "", "serve /healthz, /readyz and /metrics (published, dropped, stream lag per worker) at this address, e.g. 127.0.0.1:9091 (default: none)")
	natsAuth := natsAuthFlags(fs)
	connectTimeout := fs.Duration("connect-timeout", fabric.DefaultConnectTimeout, "at start, keep trying to reach NATS and create the stream this long, then exit 1 with the reason")
	var engines engineFlags
	fs.Var(&engines, "engine", engineHelp)
	if code, ok := parseFlags(fs, args, stdout); !ok {
		return code
	}
	fail := func(code int, format string, a ...any) int {
		fmt.Fprintf(stderr, "kvindex relay: "+format+"\n", a...)
		return code
	}
	switch {
	case *url == "":
		return fail(2, "--nats is required")
	case (*opsPath == "") == (len(engines) == 0):
		return fail(2, "give either --ops or at least one --engine")
	case *connectTimeout <= 0:
		return fail(2, "--connect-timeout must be positive")
	}
	natsOpts, err := natsAuth.Options()
	if err != nil {
		return fail(2, "%v", err)
	}
	level, err := parseLogLevel(*logLevel)
	if err != nil {
		return fail(2, "--log-level: %v", err)
	}
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level}))

	var ops []oplog.Op
	if *opsPath != "" {
		f, err := os.Open(*opsPath)
		if err != nil {
			return fail(1, "%v", err)
		}
		ops, err = oplog.ReadAll(f)
		f.Close()
		if err != nil {
			return fail(1, "%s: %v", *opsPath, err)
		}
	}
	var subCfgs []subscriber.Config
	if len(engines) > 0 {
		cfg := server.Config{Engines: engines, Grace: server.Duration(*grace), MaxMessageBytes: *maxMsg}
		if err := tierFlags(&cfg, *tiersFlag, ""); err != nil {
			return fail(2, "%v", err)
		}
		if subCfgs, err = cfg.SubscriberConfigs(); err != nil {
			return fail(2, "%v", err)
		}
	}
	var ln net.Listener
	if *listen != "" { // bound before NATS is dialled: a port in use fails at once
		if ln, err = net.Listen("tcp", *listen); err != nil {
			return fail(1, "--listen: %v", err)
		}
	}
	r, err := server.NewRelay(ctx, server.RelayConfig{
		URL: *url, NATS: natsOpts, ConnectTimeout: *connectTimeout, Logger: log, Listener: ln, Engines: subCfgs,
		MetricsTokenFile: *metricsToken, AllowUnauthenticated: *allowUnauth,
		Stream: fabric.StreamConfig{Name: *stream, SubjectPrefix: *prefix, Memory: *memory, Duplicates: *dups, MaxAge: *maxAge},
	})
	if err != nil {
		if ln != nil {
			ln.Close()
		}
		if errors.Is(err, server.ErrConfig) {
			return fail(2, "%v", err)
		}
		return fail(1, "%v", err)
	}
	defer r.Close()
	if ln != nil {
		fmt.Fprintf(stdout, "kvindex relay: listening on %s (/healthz, /readyz, /metrics)\n", r.Addr())
	}
	if *opsPath != "" {
		n, err := r.PublishOps(ctx, *model, ops)
		st := r.Stats()
		fmt.Fprintf(stdout, "kvindex relay: %d events: %d published, %d already in the stream, %d deduplicated by it, %d split to fit max_payload, %d refused\n",
			n, st.Published, st.Skipped, st.Duplicates, st.Split, st.Refused)
		if err != nil {
			return fail(1, "%v", err)
		}
		return 0
	}
	fmt.Fprintf(stdout, "kvindex relay: following %d publishers into stream %s\n", len(subCfgs), *stream)
	code := 0
	if err := r.Run(ctx); err != nil {
		log.Error("fatal", "err", err)
		code = 1
	}
	fmt.Fprintln(stdout, "kvindex relay: stopped")
	return code
}
