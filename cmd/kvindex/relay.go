package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/kvindex/kvindex/fabric"
	"github.com/kvindex/kvindex/internal/oplog"
	"github.com/kvindex/kvindex/server"
	"github.com/kvindex/kvindex/subscriber"
)

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
	}
	var level slog.Level
	if err := level.UnmarshalText([]byte(*logLevel)); err != nil {
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
	var subs []subscriber.Config
	if len(engines) > 0 {
		var err error
		cfg := server.Config{Engines: engines, Grace: server.Duration(*grace), MaxMessageBytes: *maxMsg}
		if err := tierFlags(&cfg, *tiersFlag, ""); err != nil {
			return fail(2, "%v", err)
		}
		subs, err = cfg.SubscriberConfigs()
		if err != nil {
			return fail(2, "%v", err)
		}
	}

	nc, err := nats.Connect(*url, nats.Name("kvindex relay"), nats.MaxReconnects(-1),
		nats.ReconnectWait(250*time.Millisecond), nats.RetryOnFailedConnect(true))
	if err != nil {
		return fail(1, "connecting to %s: %v", *url, err)
	}
	defer nc.Close()
	p, err := fabric.NewPublisher(ctx, nc, fabric.PublisherConfig{
		Stream: fabric.StreamConfig{Name: *stream, SubjectPrefix: *prefix, Memory: *memory, Duplicates: *dups, MaxAge: *maxAge},
		Logger: log,
	})
	if err != nil {
		return fail(1, "%v", err)
	}

	if *opsPath != "" {
		n, err := fabric.PublishOps(ctx, p, *model, ops)
		st := p.Stats()
		fmt.Fprintf(stdout, "kvindex relay: %d events: %d published, %d already in the stream, %d deduplicated by it\n",
			n, st.Published, st.Skipped, st.Duplicates)
		if err != nil {
			return fail(1, "%v", err)
		}
		if err := nc.Flush(); err != nil {
			return fail(1, "%v", err)
		}
		return 0
	}

	// Follow engines: one subscriber per rank, publishing instead of indexing.
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	errc := make(chan error, len(subs))
	var wg sync.WaitGroup
	for _, sc := range subs {
		sc.Index = p.Index(rctx, sc.Model)
		sc.Logger = log // every subscriber log line names its worker
		sub, err := subscriber.New(sc)
		if err != nil {
			return fail(2, "%v", err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := sub.Run(rctx); err != nil {
				errc <- fmt.Errorf("worker %s: %w", sc.Worker, err)
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
