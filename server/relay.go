package server

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/kvindex/kvindex/fabric"
	"github.com/kvindex/kvindex/internal/oplog"
	"github.com/kvindex/kvindex/subscriber"
)

// The relay (kvindex relay): it follows engines as serve does, one subscriber per
// rank, but hands their events to a fabric.Publisher (a NATS JetStream stream) instead
// of an index, so that any number of serve replicas (Options.Replica) answer from one
// stream. It shares serve's engine configuration (Config.SubscriberConfigs), its
// per-worker series (workerSeries), its build-info gauge and its NATS dial
// (fabric.Dial). Goroutines: one per subscriber (Run), one HTTP server (Listener); its
// state is the subscribers' and the publisher's, read at request or scrape time, so
// nothing here runs on the event path.

// ErrRelay wraps NewRelay's failure to reach NATS or create the stream: a runtime
// failure, not a configuration error (those wrap ErrConfig).
var ErrRelay = errors.New("server: relay")

// RelayConfig configures a Relay. Zero values mean the defaults.
type RelayConfig struct {
	// URL is the NATS server ("nats://host:4222"); required.
	URL string
	// NATS are the connection's options beyond fabric.Dial's (credentials and TLS:
	// fabric.NATSAuth).
	NATS []nats.Option
	// ConnectTimeout bounds how long NewRelay tries to reach NATS and create the
	// stream (default fabric.DefaultConnectTimeout).
	ConnectTimeout time.Duration
	// Stream is the stream published to, created if missing.
	Stream fabric.StreamConfig
	// Engines are followed (Config.SubscriberConfigs: one per rank); their Index is
	// replaced by the publisher. None: a relay that only publishes op logs
	// (PublishOps).
	Engines []subscriber.Config
	// Listener, when set, serves /healthz, /readyz and /metrics until Close.
	Listener net.Listener
	// MetricsTokenFile holds bearer tokens (serve's token file format) that /metrics
	// then requires; /healthz and /readyz stay open. A Listener on a non-loopback
	// address needs it unless AllowUnauthenticated (ErrUnauthenticatedListen): the
	// metrics name every worker and its stream position.
	MetricsTokenFile     string
	AllowUnauthenticated bool
	// Logger receives the relay's and its subscribers' lines (nil: discarded).
	Logger *slog.Logger
}

// Relay publishes engines' events (or an op log's) to a JetStream stream. NewRelay,
// then Run (engines) or PublishOps, then Close.
type Relay struct {
	log  *slog.Logger
	nc   *nats.Conn
	pub  *fabric.Publisher
	subs []*subscriber.Subscriber
	// ctx is the subscribers' index context: the publisher's calls end with it (Close).
	ctx    context.Context
	cancel context.CancelFunc
	srv    *http.Server
	served chan error
}

// NewRelay connects to NATS, ensures the stream and builds one subscriber per engine
// rank; nothing runs until Run. Failing to reach NATS or create the stream within
// ConnectTimeout wraps ErrRelay (with a hint when the server lacks JetStream); a bad
// engine configuration wraps ErrConfig.
func NewRelay(ctx context.Context, cfg RelayConfig) (*Relay, error) {
	if cfg.URL == "" {
		return nil, fmt.Errorf("%w: relay: no NATS URL", ErrConfig)
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	auth := AuthConfig{TokenFile: cfg.MetricsTokenFile, AllowUnauthenticated: cfg.AllowUnauthenticated}
	if err := checkListener(auth, cfg.Listener); err != nil {
		return nil, err
	}
	acc, err := newAccess(auth)
	if err != nil {
		return nil, err
	}
	nc, pub, err := relayConnect(ctx, cfg, log)
	if err != nil {
		return nil, err
	}
	r := &Relay{log: log, nc: nc, pub: pub}
	r.ctx, r.cancel = context.WithCancel(context.Background())
	for _, sc := range cfg.Engines {
		sc.Index = pub.Index(r.ctx, sc.Model)
		sc.Logger = log // every subscriber line names its worker
		sub, err := subscriber.New(sc)
		if err != nil {
			r.Close()
			return nil, fmt.Errorf("%w: %w", ErrConfig, err)
		}
		r.subs = append(r.subs, sub)
	}
	if cfg.Listener != nil {
		if err := r.serve(cfg.Listener, acc); err != nil {
			r.Close()
			return nil, err
		}
	}
	return r, nil
}

// relayConnect reaches NATS and ensures the stream, trying for at most the
// configured timeout: a server that is down, or one without JetStream, ends the relay
// with the reason rather than a silent wait.
func relayConnect(ctx context.Context, cfg RelayConfig, log *slog.Logger) (*nats.Conn, *fabric.Publisher, error) {
	timeout := cmp.Or(cfg.ConnectTimeout, fabric.DefaultConnectTimeout)
	cctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	nc, err := fabric.Dial(cctx, cfg.URL, "kvindex relay", timeout, log, cfg.NATS...)
	if err != nil {
		return nil, nil, fmt.Errorf("%w: %w", ErrRelay, err)
	}
	p, err := fabric.NewPublisher(cctx, nc, fabric.PublisherConfig{Stream: cfg.Stream, Logger: log})
	if err != nil {
		nc.Close()
		hint := ""
		if errors.Is(err, nats.ErrNoResponders) || errors.Is(err, jetstream.ErrJetStreamNotEnabled) || strings.Contains(err.Error(), nats.ErrNoResponders.Error()) {
			hint = " (is JetStream enabled on the server? nats-server -js)"
		}
		return nil, nil, fmt.Errorf("%w: creating stream %s at %s (tried for %v): %w%s", ErrRelay, cmp.Or(cfg.Stream.Name, fabric.DefaultStream), cfg.URL, timeout, err, hint)
	}
	return nc, p, nil
}

// Run follows the engines until ctx ends (nil) or one subscriber fails (its error,
// naming the worker); it stops every subscriber before returning.
func (r *Relay) Run(ctx context.Context) error {
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	errc := make(chan error, len(r.subs))
	var wg sync.WaitGroup
	for _, sub := range r.subs {
		wg.Go(func() {
			if err := sub.Run(rctx); err != nil {
				errc <- fmt.Errorf("worker %s: %w", sub.Worker(), err)
			}
		})
	}
	var err error
	select {
	case <-ctx.Done():
	case err = <-errc:
	}
	cancel()
	wg.Wait()
	return err
}

// PublishOps publishes an op log's events (queries skipped) under model and flushes
// the connection; it returns the events handed to the stream (Stats says what the
// stream took of them).
func (r *Relay) PublishOps(ctx context.Context, model string, ops []oplog.Op) (int, error) {
	n, err := fabric.PublishOps(ctx, r.pub, model, ops)
	if err != nil {
		return n, err
	}
	return n, r.nc.Flush()
}

// Stats are the publisher's counters.
func (r *Relay) Stats() fabric.PublisherStats { return r.pub.Stats() }

// Subscribers are the relay's subscribers, one per engine rank.
func (r *Relay) Subscribers() []*subscriber.Subscriber { return r.subs }

// Addr is the listener's address ("" without one).
func (r *Relay) Addr() string {
	if r.srv == nil {
		return ""
	}
	return r.srv.Addr
}

// Close stops serving HTTP, ends the publisher's pending calls and closes the NATS
// connection. Run must have returned.
func (r *Relay) Close() error {
	var err error
	if r.srv != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		err = r.srv.Shutdown(ctx)
		cancel()
		if serr := <-r.served; !errors.Is(serr, http.ErrServerClosed) {
			err = errors.Join(err, serr)
		}
	}
	r.cancel()
	r.nc.Close()
	return err
}

// serve starts the relay's /healthz, /readyz and /metrics on ln; acc guards /metrics
// (MetricsTokenFile).
//
// /healthz is liveness: 200 while the NATS connection is not closed for good (it
// reconnects by itself otherwise). /readyz is 200 once NATS is connected and every
// subscriber has synced (or its engine was removed after the grace period), 503 with
// what it waits for otherwise.
func (r *Relay) serve(ln net.Listener, acc *access) error {
	reg := prometheus.NewRegistry()
	for _, c := range []prometheus.Collector{newRelayCollector(r), NewNATSCollector(r.nc), buildInfoGauge(), acc.failures} {
		if err := reg.Register(c); err != nil {
			return err
		}
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		if r.nc.IsClosed() {
			writeJSON(w, http.StatusServiceUnavailable, map[string]string{"status": "unhealthy", "nats": "closed"})
			return
		}
		writeJSON(w, http.StatusOK, map[string]string{"status": "ok", "nats": fabric.ConnState(r.nc)})
	})
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		if waiting := r.waiting(); len(waiting) > 0 {
			writeJSON(w, http.StatusServiceUnavailable, map[string]any{"ready": false, "waiting": waiting})
			return
		}
		writeJSON(w, http.StatusOK, map[string]any{"ready": true})
	})
	r.srv = &http.Server{Addr: ln.Addr().String(), Handler: acc.httpHandler(mux, func(*http.Request) {}), ReadHeaderTimeout: 10 * time.Second}
	r.served = make(chan error, 1)
	go func() { r.served <- r.srv.Serve(ln) }()
	return nil
}

// waiting names what the relay waits for before it is ready: NATS, and each
// subscriber not yet synced (nor removed).
func (r *Relay) waiting() []string {
	var waiting []string
	if !r.nc.IsConnected() {
		waiting = append(waiting, "nats ("+fabric.ConnState(r.nc)+")")
	}
	for _, sub := range r.subs {
		if st := sub.Status(); !st.Synced && st.State != subscriber.StateRemoved {
			waiting = append(waiting, st.Worker+" ("+st.State.String()+")")
		}
	}
	return waiting
}

// relayCollector exports what a relay published (kvindex_relay_*) and its
// subscribers' worker series (workerSeries, as serve exports them).
type relayCollector struct {
	r *Relay
	workerSeries
	published, duplicates, skipped, retry, split, refused *prometheus.Desc
}

func newRelayCollector(r *Relay) *relayCollector {
	return &relayCollector{r: r, workerSeries: newWorkerSeries(),
		published:  desc("relay_published_total", "Events the stream stored."),
		duplicates: desc("relay_duplicates_total", "Events the stream acknowledged as duplicates of stored ones (its deduplication window)."),
		skipped:    desc("relay_skipped_total", "Events not sent because the stream already held them (a restarted relay's replayed history)."),
		retry:      desc("relay_publish_retries_total", "Publish attempts that failed and were retried."),
		split:      desc("relay_split_total", "Events published in parts because one message would exceed the server's max_payload."),
		refused:    desc("relay_refused_total", "Events not published because they cannot fit a message even split (their names alone), or are malformed."),
	}
}

func (c *relayCollector) Describe(ch chan<- *prometheus.Desc) { prometheus.DescribeByCollect(c, ch) }

func (c *relayCollector) Collect(out chan<- prometheus.Metric) {
	ch := metricSink(out)
	ps := c.r.pub.Stats()
	ch.counter(c.published, ps.Published)
	ch.counter(c.duplicates, ps.Duplicates)
	ch.counter(c.skipped, ps.Skipped)
	ch.counter(c.retry, ps.Retries)
	ch.counter(c.split, ps.Split)
	ch.counter(c.refused, ps.Refused)
	for _, sub := range c.r.subs {
		c.workerSeries.collect(ch, sub.Status())
	}
}
