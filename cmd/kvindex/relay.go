package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

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
	listen := fs.String("listen", "", "serve /healthz, /readyz and /metrics (published, dropped, stream lag per worker) at this address, e.g. 127.0.0.1:9091 (default: none)")
	natsAuth := natsAuthFlags(fs)
	connectTimeout := fs.Duration("connect-timeout", defaultConnectTimeout, "at start, keep trying to reach NATS and create the stream this long, then exit 1 with the reason")
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
		var err error
		cfg := server.Config{Engines: engines, Grace: server.Duration(*grace), MaxMessageBytes: *maxMsg}
		if err := tierFlags(&cfg, *tiersFlag, ""); err != nil {
			return fail(2, "%v", err)
		}
		subCfgs, err = cfg.SubscriberConfigs()
		if err != nil {
			return fail(2, "%v", err)
		}
	}
	var ln net.Listener
	if *listen != "" { // bound before NATS is dialled: a port in use fails at once
		var err error
		if ln, err = net.Listen("tcp", *listen); err != nil {
			return fail(1, "--listen: %v", err)
		}
		defer ln.Close()
	}

	nc, p, err := relayConnect(ctx, *url, *connectTimeout, fabric.PublisherConfig{
		Stream: fabric.StreamConfig{Name: *stream, SubjectPrefix: *prefix, Memory: *memory, Duplicates: *dups, MaxAge: *maxAge},
		Logger: log,
	}, log, natsOpts)
	if err != nil {
		return fail(1, "%v", err)
	}
	defer nc.Close()

	// Follow engines: one subscriber per rank, publishing instead of indexing.
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	subs := make([]*subscriber.Subscriber, 0, len(subCfgs))
	for _, sc := range subCfgs {
		sc.Index = p.Index(rctx, sc.Model)
		sc.Logger = log // every subscriber log line names its worker
		sub, err := subscriber.New(sc)
		if err != nil {
			return fail(2, "%v", err)
		}
		subs = append(subs, sub)
	}
	if ln != nil {
		h, err := startRelayHTTP(ln, nc, p, subs)
		if err != nil {
			return fail(1, "--listen: %v", err)
		}
		defer h.Close()
		fmt.Fprintf(stdout, "kvindex relay: listening on %s (/healthz, /readyz, /metrics)\n", ln.Addr())
	}

	if *opsPath != "" {
		return relayOps(ctx, p, nc, *model, ops, stdout, fail)
	}
	errc := make(chan error, len(subs))
	var wg sync.WaitGroup
	for _, sub := range subs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := sub.Run(rctx); err != nil {
				errc <- fmt.Errorf("worker %s: %w", sub.Worker(), err)
			}
		}()
	}
	fmt.Fprintf(stdout, "kvindex relay: following %d publishers into stream %s\n", len(subs), *stream)
	code := 0
	select {
	case <-ctx.Done():
	case err := <-errc:
		log.Error("fatal", "err", err)
		code = 1
	}
	cancel()
	wg.Wait()
	fmt.Fprintln(stdout, "kvindex relay: stopped")
	return code
}

// relayConnect reaches NATS and ensures the stream, trying for at most timeout: a
// server that is down, or one without JetStream, ends the relay with the reason rather
// than a silent wait.
func relayConnect(ctx context.Context, url string, timeout time.Duration, pc fabric.PublisherConfig, log *slog.Logger, natsOpts []nats.Option) (*nats.Conn, *fabric.Publisher, error) {
	cctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	nc, err := connectNATS(cctx, url, "kvindex relay", timeout, log, natsOpts...)
	if err != nil {
		return nil, nil, err
	}
	p, err := fabric.NewPublisher(cctx, nc, pc)
	if err != nil {
		nc.Close()
		hint := ""
		if errors.Is(err, nats.ErrNoResponders) || errors.Is(err, jetstream.ErrJetStreamNotEnabled) || strings.Contains(err.Error(), nats.ErrNoResponders.Error()) {
			hint = " (is JetStream enabled on the server? nats-server -js)"
		}
		return nil, nil, fmt.Errorf("creating stream %s at %s (tried for %v): %w%s", cmp.Or(pc.Stream.Name, fabric.DefaultStream), url, timeout, err, hint)
	}
	return nc, p, nil
}

// relayOps publishes an op log's events and reports what the stream took.
func relayOps(ctx context.Context, p *fabric.Publisher, nc *nats.Conn, model string, ops []oplog.Op, stdout io.Writer, fail func(int, string, ...any) int) int {
	n, err := fabric.PublishOps(ctx, p, model, ops)
	st := p.Stats()
	fmt.Fprintf(stdout, "kvindex relay: %d events: %d published, %d already in the stream, %d deduplicated by it, %d split to fit max_payload, %d refused\n",
		n, st.Published, st.Skipped, st.Duplicates, st.Split, st.Refused)
	if err != nil {
		return fail(1, "%v", err)
	}
	if err := nc.Flush(); err != nil {
		return fail(1, "%v", err)
	}
	return 0
}
