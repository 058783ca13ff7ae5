package server

import (
	"context"
	"errors"
	"fmt"
	"net"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/status"

	"github.com/kvindex/kvindex/api/kvindexv1"
	"github.com/kvindex/kvindex/engine"
	"github.com/kvindex/kvindex/hash"
)

// The gRPC API (api/kvindexv1/kvindex.proto) answers what the HTTP API answers, from
// the same engine and subscribers: Match is /v1/match, Workers is /v1/workers, and the
// standard grpc.health.v1.Health service is /healthz (service "") and /readyz (service
// GRPCServiceName). It listens only when GRPCConfig.Listen is set.
//
// Anyone who can reach the port can send to it, so every resource a peer can claim is
// bounded: the size of a message either way (MaxMessageBytes, checked by grpc-go before
// it allocates the message), concurrent streams per connection (MaxConcurrentStreams),
// the header list, the blocks of one query (Config.MaxQueryBlocks, as over HTTP), the
// time of one query (Config.QueryTimeout), and pings (a peer pinging more often than
// every 10 s is disconnected).

// Each call also reserves its largest message from the connection's and the server's
// in-flight budgets before grpc-go reads it (admit.go), and connections are bounded.

// GRPCServiceName is the Index service's full name; its health status is readiness.
const GRPCServiceName = "kvindex.v1.Index"

// gRPC defaults and bounds.
const (
	DefaultGRPCMaxMessageBytes      = 4 << 20
	MaxGRPCMaxMessageBytes          = 64 << 20
	DefaultGRPCMaxConcurrentStreams = 128
	MaxGRPCMaxConcurrentStreams     = 1 << 16
	grpcMaxHeaderListBytes          = 16 << 10
)

// GRPCConfig configures the gRPC API. The zero value leaves it off.
type GRPCConfig struct {
	// Listen is the gRPC address, e.g. "127.0.0.1:9090"; "" serves no gRPC.
	Listen string `json:"listen,omitempty"`
	// MaxMessageBytes bounds a request and a response message. Default 4 MiB, at most
	// 64 MiB: a 4 MiB request holds a query of about a million tokens.
	MaxMessageBytes int `json:"max_message_bytes,omitempty"`
	// MaxConcurrentStreams bounds the calls one connection may have in flight. Default
	// 128, at most 65536; the server advertises at most limits.conn_in_flight_bytes /
	// MaxMessageBytes (4 with the defaults), so that a client's calls queue on its side
	// rather than being refused for the connection's budget (admit.go).
	MaxConcurrentStreams uint32 `json:"max_concurrent_streams,omitempty"`
}

func (g GRPCConfig) withDefaults() GRPCConfig {
	if g.MaxMessageBytes == 0 {
		g.MaxMessageBytes = DefaultGRPCMaxMessageBytes
	}
	if g.MaxConcurrentStreams == 0 {
		g.MaxConcurrentStreams = DefaultGRPCMaxConcurrentStreams
	}
	return g
}

func (g GRPCConfig) validate() error {
	g = g.withDefaults()
	if g.Listen != "" {
		if _, _, err := net.SplitHostPort(g.Listen); err != nil {
			return fmt.Errorf("%w: grpc.listen %q: %v", ErrConfig, g.Listen, err)
		}
	}
	if g.MaxMessageBytes < 1024 || g.MaxMessageBytes > MaxGRPCMaxMessageBytes {
		return fmt.Errorf("%w: grpc.max_message_bytes %d: want 1024..%d", ErrConfig, g.MaxMessageBytes, MaxGRPCMaxMessageBytes)
	}
	if g.MaxConcurrentStreams > MaxGRPCMaxConcurrentStreams {
		return fmt.Errorf("%w: grpc.max_concurrent_streams %d: want 1..%d", ErrConfig, g.MaxConcurrentStreams, MaxGRPCMaxConcurrentStreams)
	}
	return nil
}

// grpcService implements kvindexv1.IndexServer and the health service for s.
type grpcService struct {
	kvindexv1.UnimplementedIndexServer
	grpc_health_v1.UnimplementedHealthServer
	s *Server
}

// newGRPCServer builds the gRPC server with its bounds, services and metrics.
func (s *Server) newGRPCServer() *grpc.Server {
	g := s.cfg.GRPC.withDefaults()
	opts := []grpc.ServerOption{
		grpc.MaxRecvMsgSize(g.MaxMessageBytes),
		grpc.MaxSendMsgSize(g.MaxMessageBytes),
		grpc.MaxConcurrentStreams(s.admit.grpcStreams(g.MaxConcurrentStreams, int64(g.MaxMessageBytes))),
		grpc.MaxHeaderListSize(grpcMaxHeaderListBytes),
		grpc.ConnectionTimeout(5 * time.Second),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 10 * time.Second, PermitWithoutStream: true}),
		grpc.KeepaliveParams(keepalive.ServerParameters{MaxConnectionIdle: 5 * time.Minute, Time: time.Minute, Timeout: 20 * time.Second}),
		grpc.ChainUnaryInterceptor(s.grpcMetrics, s.access.grpcUnary, s.admit.grpcRelease),
		grpc.InTapHandle(s.admit.grpcTap(int64(g.MaxMessageBytes))),
		grpc.StatsHandler(grpcStats{s.admit}),
	}
	if s.access.tls != nil {
		opts = append(opts, grpc.Creds(credentials.NewTLS(s.access.tls.Clone())))
	}
	srv := grpc.NewServer(opts...)
	svc := &grpcService{s: s}
	kvindexv1.RegisterIndexServer(srv, svc)
	grpc_health_v1.RegisterHealthServer(srv, svc)
	return srv
}

// grpcMetrics counts calls by method and gRPC code (kvindex_grpc_requests_total).
func (s *Server) grpcMetrics(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
	resp, err := h(ctx, req)
	s.grpcReq.WithLabelValues(info.FullMethod, status.Code(err).String()).Inc()
	return resp, err
}

// startGRPC listens and serves the gRPC API when configured (Options.GRPCListener or
// GRPCConfig.Listen); Start calls it once the HTTP server runs.
func (s *Server) startGRPC(ln net.Listener) error {
	if ln == nil {
		if s.cfg.GRPC.Listen == "" {
			return nil
		}
		var err error
		if ln, err = net.Listen("tcp", s.cfg.GRPC.Listen); err != nil {
			return fmt.Errorf("server: grpc listen %s: %w", s.cfg.GRPC.Listen, err)
		}
	}
	s.grpcLn = ln
	s.grpcReq = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "kvindex_grpc_requests_total",
		Help: "gRPC calls by method and status code.",
	}, []string{"method", "code"})
	s.reg.MustRegister(s.grpcReq)
	s.grpcSrv = s.newGRPCServer()
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		if err := s.grpcSrv.Serve(s.admit.limit(ln, "grpc")); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
			s.report(fmt.Errorf("server: grpc serve: %w", err))
		}
	}()
	s.log.Info("serving gRPC", "addr", ln.Addr().String())
	return nil
}

// stopGRPC drains the gRPC server: in-flight calls finish until ctx ends, then the
// remaining connections are closed.
func (s *Server) stopGRPC(ctx context.Context) error {
	if s.grpcSrv == nil {
		if s.grpcLn != nil {
			_ = s.grpcLn.Close()
		}
		return nil
	}
	done := make(chan struct{})
	go func() {
		s.grpcSrv.GracefulStop()
		close(done)
	}()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		s.grpcSrv.Stop()
		<-done
		return fmt.Errorf("server: grpc drain: %w", ctx.Err())
	}
}

// GRPCAddr returns the gRPC API's address once started ("" when it does not serve).
func (s *Server) GRPCAddr() string {
	if s.grpcLn == nil {
		return ""
	}
	return s.grpcLn.Addr().String()
}

// Match is POST /v1/match over gRPC.
func (g *grpcService) Match(ctx context.Context, req *kvindexv1.MatchRequest) (*kvindexv1.MatchResponse, error) {
	s := g.s
	m, err := s.resolveModel(req.GetModel())
	if err != nil {
		return nil, status.Errorf(codes.InvalidArgument, "%v", err)
	}
	ns, err := RequestNamespace(m.name, req.GetNamespace(), req.GetLoraName(), req.GetCacheSalt())
	if err != nil {
		return nil, status.Errorf(codes.InvalidArgument, "%v", err)
	}
	policy, err := s.resolvePolicy(req.GetPolicy())
	if err != nil {
		return nil, status.Errorf(codes.InvalidArgument, "%v", err)
	}
	weights := s.weights
	if w := req.GetTierWeights(); len(w) > 0 { // proto3: empty is unset
		if weights, err = parseWeights(w, "tier_weights"); err != nil {
			return nil, status.Errorf(codes.InvalidArgument, "%v", err)
		}
	}
	sc := scratchPool.Get().(*matchScratch) // the HTTP handlers' pool: q and found are reused
	defer sc.release()
	q, err := s.grpcQuery(m, req.GetTokens(), req.GetContentHashes(), sc)
	if err != nil {
		return nil, err
	}
	qctx, cancel := context.WithTimeout(ctx, time.Duration(s.cfg.QueryTimeout))
	defer cancel()
	start := time.Now()
	found, err := s.eng.FindMatchesIn(qctx, ns, q, sc.found[:0])
	sc.found = found
	s.findLatency.Observe(time.Since(start).Seconds())
	if err != nil {
		switch {
		case errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) ||
			errors.Is(err, engine.ErrClosed) || errors.Is(err, engine.ErrShardFailed):
			return nil, status.Errorf(codes.Unavailable, "find matches: %v", err)
		default:
			return nil, status.Errorf(codes.Internal, "find matches: %v", err)
		}
	}
	matches := s.matches(ns, q, found, weights, make([]Match, 0, len(found)))
	resp := &kvindexv1.MatchResponse{Model: m.name, Namespace: ns, Blocks: int32(len(q)),
		Matches: make([]*kvindexv1.Match, 0, len(found)), TierWeights: weights[:]}
	for i := range matches {
		mt := &matches[i]
		tiers := make([]int32, len(mt.Tiers))
		for t, n := range mt.Tiers {
			tiers[t] = int32(n)
		}
		resp.Matches = append(resp.Matches, &kvindexv1.Match{Worker: mt.Worker, Score: int32(mt.Score), Size: int32(mt.Size),
			State: mt.State, Predicted: int32(mt.Predicted), Tiers: tiers, Weighted: mt.Weighted, Trust: mt.Trust})
	}
	opts, err := grpcPickOpts(req, q, m)
	if err != nil {
		return nil, err
	}
	p, err := s.choose(m, policy, matches, opts)
	if err != nil {
		return nil, trackStatus(err)
	}
	s.noteMatch(m, len(q), len(found), p)
	if p != nil {
		resp.Pick = &kvindexv1.Pick{Worker: p.Worker, Policy: p.Policy, Score: int32(p.Score), Reason: p.Reason, Weighted: p.Weighted, RequestId: p.RequestID}
		if req.GetRecord() && len(q) > 0 {
			if err := s.eng.Predict(qctx, p.Worker, ns, q, 0); err != nil {
				return nil, predictStatus(err)
			}
			resp.Recorded = true
		}
	}
	resp.MatchesTotal = int32(len(resp.Matches))
	resp.Matches = resp.Matches[:s.topK(uint64(req.GetTopK()), len(resp.Matches))]
	return resp, nil
}

// grpcQuery checks a Match or Routed request's query (checkQuery: proto3 cannot tell an
// empty list from none, so an empty one counts as not given) and returns its block
// content hashes (tokens hashed into sc.q; given hashes as they are, never kept in sc),
// or the request's gRPC status.
func (s *Server) grpcQuery(m *model, tokens []uint32, hashes []uint64, sc *matchScratch) ([]uint64, error) {
	if _, err := s.checkQuery(m, len(tokens) > 0, len(hashes) > 0, len(tokens), len(hashes)); err != nil {
		return nil, status.Errorf(codes.InvalidArgument, "%v", err)
	}
	if len(tokens) == 0 {
		return hashes, nil
	}
	q, err := hash.Blocks(sc.q[:0], tokens, m.blockSize)
	if err != nil {
		return nil, status.Errorf(codes.Internal, "%v", err)
	}
	sc.q = q
	return q, nil
}

// predictStatus maps a failed Predict to its gRPC status.
func predictStatus(err error) error {
	switch {
	case errors.Is(err, engine.ErrNamespaceTableFull):
		return status.Errorf(codes.ResourceExhausted, "predict: %v", err)
	case engine.IsRejection(err) || errors.Is(err, engine.ErrQueryTooLong):
		return status.Errorf(codes.InvalidArgument, "predict: %v", err)
	case errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) ||
		errors.Is(err, engine.ErrClosed) || errors.Is(err, engine.ErrShardFailed):
		return status.Errorf(codes.Unavailable, "predict: %v", err)
	}
	return status.Errorf(codes.Internal, "predict: %v", err)
}

// Routed is POST /v1/routed over gRPC.
func (g *grpcService) Routed(ctx context.Context, req *kvindexv1.RoutedRequest) (*kvindexv1.RoutedResponse, error) {
	s := g.s
	m, err := s.resolveModel(req.GetModel())
	if err != nil {
		return nil, status.Errorf(codes.InvalidArgument, "%v", err)
	}
	ns, err := RequestNamespace(m.name, req.GetNamespace(), req.GetLoraName(), req.GetCacheSalt())
	if err != nil {
		return nil, status.Errorf(codes.InvalidArgument, "%v", err)
	}
	worker := req.GetWorker()
	switch {
	case worker == "":
		return nil, status.Error(codes.InvalidArgument, "worker is required")
	case !s.servesWorker(m, worker):
		return nil, status.Errorf(codes.InvalidArgument, "worker %q is not a worker of model %q", worker, m.name)
	case time.Duration(req.GetTtlMs())*time.Millisecond > engine.MaxPredictionTTL:
		return nil, status.Errorf(codes.InvalidArgument, "ttl_ms %d exceeds %d", req.GetTtlMs(), engine.MaxPredictionTTL.Milliseconds())
	}
	sc := scratchPool.Get().(*matchScratch)
	defer sc.release()
	q, err := s.grpcQuery(m, req.GetTokens(), req.GetContentHashes(), sc)
	if err != nil {
		return nil, err
	}
	ttl := time.Duration(req.GetTtlMs()) * time.Millisecond
	if ttl == 0 {
		ttl = s.eng.Config().PredictionTTL
	}
	qctx, cancel := context.WithTimeout(ctx, time.Duration(s.cfg.QueryTimeout))
	defer cancel()
	if err := s.grpcTrackRouted(qctx, m, ns, worker, req, q); err != nil {
		return nil, err
	}
	if err := s.eng.Predict(qctx, worker, ns, q, ttl); err != nil {
		return nil, predictStatus(err)
	}
	return &kvindexv1.RoutedResponse{Model: m.name, Namespace: ns, Worker: worker, Blocks: int32(len(q)), TtlMs: ttl.Milliseconds()}, nil
}

// workerState is the state a match reports for worker, as /v1/match does.
func (s *Server) workerState(worker string) string {
	f := s.fleet()
	if sub := f.byWorker[worker]; sub != nil {
		return sub.State().String()
	}
	if f.approx[worker] != nil {
		return stateApproximate
	}
	if s.external {
		return "replicated" // fed by another process (a relay), which vouches for it
	}
	return stateUnknown
}

// Workers is GET /v1/workers over gRPC: the same workers, those without events
// included (state "approximate").
func (g *grpcService) Workers(ctx context.Context, _ *kvindexv1.WorkersRequest) (*kvindexv1.WorkersResponse, error) {
	s := g.s
	sizer := s.sizer()
	now := s.now() // the diagnostics clock, as /v1/workers
	infos := s.workerInfos(sizer, now)
	out := &kvindexv1.WorkersResponse{Workers: make([]*kvindexv1.Worker, 0, len(infos))}
	for i := range infos {
		wi := &infos[i]
		w := &kvindexv1.Worker{
			Worker: wi.Worker, Endpoint: wi.Endpoint, ReplayEndpoint: wi.ReplayEndpoint, Model: wi.Model,
			DpRank: int32(wi.DPRank), State: wi.State, Trust: wi.Trust, Synced: wi.Synced, Connected: wi.Connected,
			GapsDetected: wi.Gaps.Detected, GapsRecovered: wi.Gaps.Recovered, GapsUnrecoverable: wi.Gaps.Unrecoverable,
			Restarts: wi.Restarts, Replays: wi.Replays, Batches: wi.Batches, LagSeconds: wi.LagSeconds, LastError: wi.LastError,
		}
		if wi.Size != nil {
			w.Size = int64(*wi.Size)
		}
		if wi.LastSeq != nil {
			w.HasSeq, w.LastSeq = true, *wi.LastSeq
		}
		out.Workers = append(out.Workers, w)
	}
	return out, nil
}

// Check is the standard health check: service "" is liveness (the index answers a
// barrier within a second, as /healthz), GRPCServiceName readiness (as /readyz).
func (g *grpcService) Check(ctx context.Context, req *grpc_health_v1.HealthCheckRequest) (*grpc_health_v1.HealthCheckResponse, error) {
	serving := func(ok bool) (*grpc_health_v1.HealthCheckResponse, error) {
		st := grpc_health_v1.HealthCheckResponse_NOT_SERVING
		if ok {
			st = grpc_health_v1.HealthCheckResponse_SERVING
		}
		return &grpc_health_v1.HealthCheckResponse{Status: st}, nil
	}
	switch req.GetService() {
	case "":
		bctx, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		return serving(g.s.eng.Barrier(bctx) == nil)
	case GRPCServiceName:
		ok, _ := g.s.isReady()
		return serving(ok)
	}
	return nil, status.Errorf(codes.NotFound, "unknown service %q", req.GetService())
}
