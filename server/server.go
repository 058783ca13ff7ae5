package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"google.golang.org/grpc"

	"github.com/kvindex/kvindex/engine"
	"github.com/kvindex/kvindex/fabric"
	"github.com/kvindex/kvindex/internal/ptree"
	"github.com/kvindex/kvindex/subscriber"
	"github.com/kvindex/kvindex/tokenize"
)

// ErrServerState is returned by Start when the server was already started or shut down.
var ErrServerState = errors.New("server: already started or shut down")

// Options are the parts of a server that are not configuration.
type Options struct {
	// Logger receives lifecycle and subscriber logs. Default: discard.
	Logger *slog.Logger
	// Listener, when set, serves the API instead of listening on Config.Listen.
	Listener net.Listener
	// Index, when set, is the engine to serve instead of a new one; its events come from
	// elsewhere too (a NATS replica), and Shutdown leaves it open for its owner.
	Index *engine.Engine
	// Ready, when set, must also report true before /readyz does (a replica that has
	// caught up with its stream).
	Ready func() bool
	// GRPCListener, when set, serves the gRPC API (grpc.go) instead of listening on
	// Config.GRPC.Listen.
	GRPCListener net.Listener
	// Resume gives workers their subscriber.Config.Resume checkpoint (Index restored
	// from a snapshot that holds them as of it): the configuration's and those of the
	// engines a source adds before Start (the discovery file's).
	Resume map[string]subscriber.Checkpoint
	// Collectors are served in /metrics beside the server's own (kvindex serve's
	// snapshot counters).
	Collectors []prometheus.Collector
	// Workers, with Index, lists the workers that feed Index from elsewhere (a NATS
	// replica's, fed by a relay): /v1/workers, gRPC Workers and /metrics (state, last
	// sequence, lag, events, blocks) show them after the subscribed ones; the server
	// fills in Size and skips a worker it subscribes to itself. Handlers call it on
	// their own goroutines: it must be safe for concurrent use.
	Workers func() []WorkerInfo
	// Snapshot is the warm restart (snapshot.go): the index restored from its file by
	// New, written every Interval and by Shutdown. Not with Index.
	Snapshot SnapshotOptions
	// Replica, when set, feeds the index from a kvindex relay's NATS stream
	// (replica.go) for Config.Models, besides any engines the configuration lists;
	// Ready and Workers are then the replica's. Not with Index.
	Replica *ReplicaOptions
	// Context bounds what New does on the network (the replica's connection and
	// start). Default: context.Background().
	Context context.Context
	// LoadShare, when set, shares the load this replica routes with the other
	// replicas of serve on a NATS subject, and folds theirs (loadshare.go).
	LoadShare *LoadShareOptions
}

// check refuses options that contradict each other.
func (o *Options) check() error {
	switch {
	case o.Index != nil && (o.Snapshot.Path != "" || o.Replica != nil):
		return fmt.Errorf("%w: Options.Index with Options.Snapshot or Options.Replica (they build the index)", ErrConfig)
	case o.Replica != nil && o.Replica.URL == "":
		return fmt.Errorf("%w: Options.Replica needs a NATS URL", ErrConfig)
	case o.Replica == nil && strings.HasPrefix(o.Snapshot.Path, fabric.ObjectScheme):
		return fmt.Errorf("%w: a %s snapshot needs Options.Replica", ErrConfig, fabric.ObjectScheme)
	}
	return nil
}

// WorkerSizer reports how many blocks a worker holds. The index implements it when it
// can; /v1/workers then reports each worker's size (otherwise null).
type WorkerSizer interface {
	WorkerSize(worker string) (int, bool)
}

// model is one served model: its block size and its workers, sorted by id.
type model struct {
	name      string
	blockSize int
	// subs are the model's workers with events, by worker id.
	subs ptree.Map[string, *subscriber.Subscriber]
	// approx are the model's workers without events (served from predictions).
	approx ptree.Map[string, struct{}]
	// queries is the model's query window (diagnose.go), kept across fleets.
	queries *queryWindow
}

// Server is kvindex serve: one engine, one subscriber per engine rank, the HTTP API.
//
// Ownership: New builds everything; Start launches one goroutine per subscriber, one per
// discovery source and one HTTP serving goroutine; an engine change (engines.go) starts
// and stops subscribers under engMu; Shutdown stops the HTTP server (draining
// requests), then the discovery sources and the subscribers, then closes the engine.
// Handlers run on net/http's goroutines and only read: the engine (safe for concurrent
// use), the fleet (immutable once published), subscriber statuses (copied under their
// locks) and the server's atomics.
type Server struct {
	cfg     Config
	weights engine.Weights // Config.TierWeights, the default of /v1/match
	log     *slog.Logger
	eng     *engine.Engine
	// text are Config.Tokenizers' models (text.go), loaded by New; read-only.
	text map[string]*tokenize.Model
	// replays bounds the subscribers' replays at once (Config.MaxConcurrentReplays).
	replays *subscriber.ReplayLimiter

	// The engines (engines.go): fl is what handlers read; engMu owns the rest.
	fl          atomic.Pointer[fleet]
	engineCount atomic.Pointer[map[string]int] // engines per source, for /metrics
	engMu       sync.Mutex
	entries     map[string]*engineEntry // by key
	entrySeq    uint64
	claims      claims                           // the entries' claims, kept as they change (enginesinc.go)
	queryWins   map[string]*queryWindow          // by model
	runCtx      context.Context                  // the subscribers' parent; nil before Start
	closed      bool                             // Shutdown has begun: no more changes
	resume      map[string]subscriber.Checkpoint // Options.Resume, for engines added before Start
	engChanges  *prometheus.CounterVec
	// The discovery sources (discovery.go), fixed by New: their states and loops.
	discovery []*discoveryState
	runners   []func(context.Context)

	reg         *prometheus.Registry
	findLatency prometheus.Histogram
	requests    *prometheus.CounterVec
	// httpLatency and grpcLatency time each call in its handler (instrument,
	// grpcMetrics): serve's own latency, which a client's exceeds by the network, the
	// transport's framing and the OS scheduling either side.
	httpLatency *prometheus.HistogramVec // kvindex_http_request_duration_seconds{handler}
	grpcLatency *prometheus.HistogramVec // kvindex_grpc_request_duration_seconds{method}, registered when gRPC starts
	inFlight    prometheus.Gauge
	handler     http.Handler
	admit       *admission // request budgets and connection limits (admit.go)
	access      *access    // TLS and client authentication (auth.go)

	ln      net.Listener
	httpSrv *http.Server
	grpcLn  net.Listener // nil unless the gRPC API is served
	grpcSrv *grpc.Server
	grpcReq *prometheus.CounterVec // kvindex_grpc_requests_total, registered when gRPC starts
	// The probe listener (probes.go); nil unless Config.ProbeListen is set.
	probeLn  net.Listener
	probeSrv *http.Server

	stopSubs context.CancelFunc
	wg       sync.WaitGroup
	errc     chan error

	// external is set when another process feeds the engine (Options.Index, a NATS
	// replica); extReady is Options.Ready (the replica's caughtUp), extWorkers
	// Options.Workers (the replica's workers). ownsEngine says Shutdown closes the
	// engine (not Options.Index's, nor the replica's, which closes its own).
	external   bool
	ownsEngine bool
	extReady   func() bool
	extWorkers func() []WorkerInfo // nil when none

	// warm is the warm restart (snapshot.go; write nil: no snapshot); feed the NATS
	// replica (replica.go; nil: none).
	warm *warmRestart
	feed *replicaFeed

	started  atomic.Bool
	draining atomic.Bool
	ready    atomic.Bool
	rr       atomic.Uint64
	routing  *routing // the load-aware policies and their load (pick.go)
	shutOnce sync.Once
	shutErr  error

	// Diagnostics (diagnose.go): now is the clock (tests set it before use); logged
	// holds when each ongoing problem was last logged.
	now      func() time.Time
	logMu    sync.Mutex
	logged   map[problemKey]time.Time
	stopDiag chan struct{}

	// trust is the workers' trust bookkeeping (trust.go).
	trust trustTable
	// resyncs admits the resyncs clients ask for (resyncgate.go).
	resyncs resyncGate
}

// New validates cfg and builds the server: the engine (restored from Options.Snapshot,
// or the replica's, Options.Replica) and the subscribers (not yet running). Close it
// with Shutdown, even if it was never started.
func New(cfg Config, opts Options) (s *Server, err error) {
	pubs, err := cfg.plan()
	if err != nil {
		return nil, err
	}
	if err := opts.check(); err != nil {
		return nil, err
	}
	if err := checkSnapshotDir(opts.Snapshot.Path); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrConfig, err)
	}
	plan := cfg // the configuration as given, for the snapshot's plan
	cfg = cfg.withDefaults()
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	ctx := opts.Context
	if ctx == nil {
		ctx = context.Background()
	}
	warm := newWarmRestart(opts.Snapshot)
	eng, resume, ready, workers := opts.Index, opts.Resume, opts.Ready, opts.Workers
	var feed *replicaFeed
	switch path := opts.Snapshot.Path; {
	case opts.Replica != nil:
		if feed, err = startReplica(ctx, log, *opts.Replica, cfg, path); err != nil {
			return nil, err
		}
		eng, ready, workers = feed.engine, feed.caughtUp, feed.workers
		if path != "" {
			warm.write = func() error { return feed.rep.Snapshot(path) }
		}
	case path != "":
		if eng, resume, err = restoreSnapshot(path, opts.Snapshot.MaxBytes, withFileEngines(plan), log); err != nil {
			return nil, err
		}
		restored := eng
		warm.write = func() error { return restored.WriteSnapshotFile(path) }
	case eng == nil:
		if eng, err = engine.New(cfg.Index.Engine()); err != nil {
			return nil, fmt.Errorf("%w: index: %v", ErrConfig, err)
		}
	}
	owns := opts.Index == nil && feed == nil
	defer func() {
		if err == nil {
			return
		}
		if owns {
			eng.Close()
		}
		if feed != nil {
			feed.close()
		}
	}()
	weights, err := cfg.weights()
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrConfig, err) // plan checked it: unreachable
	}
	text, err := loadTokenizers(cfg.Tokenizers)
	if err != nil {
		return nil, err
	}
	nrep := cfg.MaxConcurrentReplays
	if nrep == 0 {
		nrep = DefaultMaxConcurrentReplays
	}
	replays, err := subscriber.NewReplayLimiter(nrep)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrConfig, err) // plan checked it: unreachable
	}
	s = &Server{
		text:       text,
		replays:    replays,
		weights:    weights,
		external:   opts.Index != nil || feed != nil,
		ownsEngine: owns,
		extReady:   ready,
		extWorkers: workers,
		warm:       warm,
		feed:       feed,
		cfg:        cfg,
		log:        log,
		eng:        eng,
		entries:    map[string]*engineEntry{},
		resume:     resume,
		queryWins:  map[string]*queryWindow{},
		ln:         opts.Listener,
		grpcLn:     opts.GRPCListener,
		errc:       make(chan error, len(pubs)+1),
		now:        time.Now,
		logged:     map[problemKey]time.Time{},
		stopDiag:   make(chan struct{}),
	}
	if s.routing, err = newRouting(cfg.Routing, func() time.Time { return s.now() }); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrConfig, err) // plan checked it: unreachable
	}
	for i, e := range cfg.Engines {
		var own []publisher
		for _, p := range pubs {
			if p.engine == i {
				own = append(own, p)
			}
		}
		en, err := s.newEntry(SourceConfig, engineKey(e), e, own, s.resume)
		if err != nil {
			return nil, err
		}
		s.insertLocked(en) // nothing else can see s yet
	}
	s.publishLocked()
	largest := cfg.MaxBodyBytes
	if cfg.GRPC.Listen != "" || opts.GRPCListener != nil {
		largest = max(largest, int64(cfg.GRPC.withDefaults().MaxMessageBytes))
	}
	s.admit = newAdmission(cfg.Limits, largest)
	if s.access, err = newAccess(cfg.Auth); err != nil {
		return nil, err
	}
	s.initMetrics()
	s.reg.MustRegister(s.admit.metrics()...)
	s.reg.MustRegister(s.access.failures)
	s.reg.MustRegister(warm.collectors()...)
	if feed != nil {
		s.reg.MustRegister(feed.collectors()...)
		if opts.Replica.Peer != "" {
			p, err := newPeerCheck(*opts.Replica)
			if err != nil {
				return nil, err
			}
			s.reg.MustRegister(p.collectors()...)
			s.runners = append(s.runners, func(ctx context.Context) { p.run(ctx, s) })
		}
	}
	for _, c := range opts.Collectors {
		if err := s.reg.Register(c); err != nil {
			return nil, fmt.Errorf("server: Options.Collectors: %w", err)
		}
	}
	if err := s.initDiscovery(); err != nil {
		return nil, err
	}
	if opts.LoadShare != nil {
		if s.routing.share, err = startLoadShare(ctx, log, *opts.LoadShare, s.routing.tracker,
			time.Duration(cfg.Routing.InFlightTTL), func() time.Time { return s.now() }); err != nil {
			return nil, err
		}
	}
	s.handler = s.access.httpHandler(s.admit.httpHandler(s.routes(), cfg.MaxBodyBytes), s.admit.authenticated)
	return s, nil
}

// requestBuckets are the request-duration histograms' bucket bounds: 50 µs to 10 s in
// 27 steps of about 1.57x (4.6 and 7.2 ms are neighbours, where a router's budget
// lies), each rounded to three significant digits so that the le labels read plainly.
var requestBuckets = threeDigits(prometheus.ExponentialBucketsRange(50e-6, 10, 28))

// threeDigits rounds each bound of b to three significant digits (through their decimal
// form, so that each is the float nearest to it and prints as such).
func threeDigits(b []float64) []float64 {
	for i, v := range b {
		b[i], _ = strconv.ParseFloat(strconv.FormatFloat(v, 'g', 3, 64), 64)
	}
	return b
}

func (s *Server) initMetrics() {
	s.reg = prometheus.NewRegistry()
	s.findLatency = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "kvindex_find_matches_duration_seconds",
		Help:    "Latency of the index's find-matches call for /v1/match.",
		Buckets: prometheus.ExponentialBuckets(1e-6, 2, 22), // 1µs .. ~2s
	})
	s.requests = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "kvindex_http_requests_total",
		Help: "HTTP requests by handler and status code.",
	}, []string{"handler", "code"})
	s.httpLatency = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "kvindex_http_request_duration_seconds",
		Help:    "Time an HTTP request spends in its handler, by handler: the body read, the work and the response written.",
		Buckets: requestBuckets,
	}, []string{"handler"})
	s.inFlight = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "kvindex_http_in_flight_requests",
		Help: "HTTP requests being served (a scrape counts itself).",
	})
	s.engChanges = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "kvindex_engine_changes_total",
		Help: "Engines added, removed, replaced (changed spec) or rejected at runtime, by source (config, api, a discovery source).",
	}, []string{"source", "change"})
	s.reg.MustRegister(s.initTrust(), newTrustCollector(s), newDigestCollector(s))
	s.reg.MustRegister(s.findLatency, s.requests, s.httpLatency, s.inFlight, s.engChanges, newEngineCollector(s), newDiscoveryCollector(s), newCollector(s), newDiagCollector(s), buildInfoGauge(),
		collectors.NewGoCollector(collectors.WithGoCollectorRuntimeMetrics(collectors.MetricsScheduler)), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
}

// Engine returns the server's index.
func (s *Server) Engine() *engine.Engine { return s.eng }

// Subscribers returns the server's subscribers as of now, one per engine rank, in the
// order their engines were added (the configuration's first, in its order).
func (s *Server) Subscribers() []*subscriber.Subscriber {
	return slices.Collect(s.fleet().subs.Values())
}

// Handler returns the HTTP API (for tests; Start serves it).
func (s *Server) Handler() http.Handler { return s.handler }

// Errors delivers fatal errors: the HTTP server failing, or the index failing under a
// subscriber. The caller should then Shutdown.
func (s *Server) Errors() <-chan error { return s.errc }

// Start listens (unless Options.Listener was given), starts the subscribers and serves
// the API. It returns once the listener is open.
func (s *Server) Start() error {
	if !s.started.CompareAndSwap(false, true) || s.draining.Load() {
		return ErrServerState
	}
	for _, err := range []error{
		checkListener(s.cfg.Auth, s.ln), checkListener(s.cfg.Auth, s.grpcLn),
	} {
		if err != nil {
			return err
		}
	}
	if s.ln == nil {
		if err := checkListen(s.cfg.Auth, s.cfg.Listen); err != nil {
			return err
		}
	}
	if s.grpcLn == nil {
		if err := checkListen(s.cfg.Auth, s.cfg.GRPC.Listen); err != nil {
			return err
		}
	}
	if s.ln == nil {
		ln, err := net.Listen("tcp", s.cfg.Listen)
		if err != nil {
			return fmt.Errorf("server: listen %s: %w", s.cfg.Listen, err)
		}
		s.ln = ln
	}
	ctx, cancel := context.WithCancel(context.Background())
	s.stopSubs = cancel
	s.engMu.Lock()
	s.runCtx = ctx
	s.resume = nil // a checkpoint is the restored snapshot's: engines added later start afresh
	for _, en := range s.sortedEntries() {
		s.launchLocked(en)
	}
	s.engMu.Unlock()
	for _, run := range s.runners {
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			run(ctx)
		}()
	}
	if s.warm.write != nil && s.warm.opts.Interval > 0 {
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			s.warm.loop(ctx, s.log)
		}()
	}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		s.diagnoseLoop(s.stopDiag)
	}()
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		s.trustLoop(s.stopDiag)
	}()
	s.httpSrv = &http.Server{
		Handler:           s.handler,
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       30 * time.Second,
		WriteTimeout:      30 * time.Second,
		IdleTimeout:       120 * time.Second,
		MaxHeaderBytes:    64 << 10,
		ConnContext:       s.admit.connContext,
		ErrorLog:          slog.NewLogLogger(s.log.Handler(), slog.LevelWarn),
	}
	serve := s.httpSrv.Serve
	if s.access.tls != nil {
		s.httpSrv.TLSConfig = s.access.tls.Clone()
		serve = func(ln net.Listener) error { return s.httpSrv.ServeTLS(ln, "", "") }
	}
	httpLn := s.admit.limit(s.ln, "http")
	s.admit.httpLn = httpLn
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		if err := serve(httpLn); err != nil && !errors.Is(err, http.ErrServerClosed) {
			s.report(fmt.Errorf("server: serve: %w", err))
		}
	}()
	if err := s.startGRPC(s.grpcLn); err != nil {
		return err
	}
	if err := s.startProbes(); err != nil {
		return err
	}
	s.log.Info("serving", "addr", s.ln.Addr().String(), "engines", len(s.cfg.Engines), "workers", s.fleet().subs.Len())
	s.checkFDs()
	return nil
}

func (s *Server) report(err error) {
	select {
	case s.errc <- err:
	default:
	}
}

// Addr returns the API's address once started ("" before).
func (s *Server) Addr() string {
	if s.ln == nil {
		return ""
	}
	return s.ln.Addr().String()
}

// Shutdown drains: /readyz turns 503 at once, the HTTP server stops accepting and waits
// for in-flight requests (until ctx ends, then closes them), the subscribers stop, the
// last snapshot is written (Options.Snapshot; its failure is the error), the replica
// closes, and the engine closes. Idempotent; later calls return the first call's result.
func (s *Server) Shutdown(ctx context.Context) error {
	s.shutOnce.Do(func() {
		s.draining.Store(true)
		s.engMu.Lock() // waits for a change in progress; none starts after
		s.closed = true
		s.engMu.Unlock()
		var errs []error
		if err := s.stopGRPC(ctx); err != nil {
			errs = append(errs, err)
		}
		if s.probeSrv != nil {
			_ = s.probeSrv.Close() // probes hold nothing worth draining
		}
		if s.httpSrv != nil {
			if err := s.httpSrv.Shutdown(ctx); err != nil {
				errs = append(errs, fmt.Errorf("server: drain: %w", err))
				_ = s.httpSrv.Close()
			}
		} else if s.ln != nil {
			_ = s.ln.Close()
		}
		if s.stopSubs != nil {
			s.stopSubs()
			close(s.stopDiag)
		}
		s.wg.Wait()
		// The subscribers and the replica's writers have stopped: the last snapshot is
		// their exact position.
		if s.warm.write != nil {
			if err := s.warm.snapshot(); err != nil {
				errs = append(errs, fmt.Errorf("server: final snapshot: %w", err))
			}
		}
		if s.feed != nil {
			if err := s.feed.close(); err != nil {
				errs = append(errs, err)
			}
		}
		if err := s.routing.share.close(); err != nil {
			errs = append(errs, err)
		}
		if s.ownsEngine {
			if err := s.eng.Close(); err != nil {
				errs = append(errs, err)
			}
		}
		s.shutErr = errors.Join(errs...)
		s.log.Info("stopped")
	})
	return s.shutErr
}

// sizer returns the index as a WorkerSizer, or nil if it is not one.
func (s *Server) sizer() WorkerSizer {
	if ws, ok := any(s.eng).(WorkerSizer); ok {
		return ws
	}
	return nil
}

// isReady reports readiness: every subscriber has synced once (latched), and the server
// is not draining.
// subWaiting says whether readiness waits for a subscriber, and names it. The rule:
// every configured engine must have connected once and synced. A worker removed after
// the grace period left the index, and the server does not wait for an engine that is
// gone (it syncs again if the engine comes back) — unless it never connected at all:
// that is a wrong endpoint far more often than an engine that died, so the server stays
// unready and says so (its last error is in /v1/workers).
func subWaiting(st subscriber.Status) (string, bool) {
	switch {
	case st.Synced && st.ReplayShort && st.State != subscriber.StateRemoved:
		return st.Worker + " (its replay broke off; retrying: " + st.LastError + ")", true
	case st.Synced:
		return "", false
	case st.State != subscriber.StateRemoved:
		return st.Worker, true
	case st.Connects == 0:
		return st.Worker + " (never connected: " + st.LastError + ")", true
	}
	return "", false
}

func (s *Server) isReady() (bool, []string) {
	if s.draining.Load() {
		return false, []string{"draining"}
	}
	if s.ready.Load() {
		return true, nil
	}
	var waiting []string
	if s.extReady != nil && !s.extReady() {
		waiting = append(waiting, "index feed")
	}
	for _, d := range s.discovery {
		if !d.synced.Load() {
			waiting = append(waiting, "discovery "+d.source)
		}
	}
	for _, sub := range s.fleet().subs.All() {
		if w, ok := subWaiting(sub.Status()); ok {
			waiting = append(waiting, w)
		}
	}
	if len(waiting) == 0 {
		// Events reach the index's shards asynchronously: a barrier makes everything
		// applied so far visible before the server calls itself ready.
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := s.eng.Barrier(ctx); err != nil {
			return false, []string{"index barrier: " + err.Error()}
		}
		s.ready.Store(true)
		return true, nil
	}
	return false, waiting
}
