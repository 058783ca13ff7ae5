package server

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net"
	"slices"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/status"

	"github.com/kvindex/kvindex/api/kvindexv1"
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
		grpc.KeepaliveParams(keepalive.ServerParameters{MaxConnectionIdle: 5 * time.Minute, Time: time.Minute, Timeout: 20 * time.Second,
			MaxConnectionAge: time.Duration(s.admit.limits.MaxConnectionAge), MaxConnectionAgeGrace: maxConnectionAgeGrace}),
		grpc.ChainUnaryInterceptor(s.grpcMetrics, s.admit.grpcRelease),
		grpc.InTapHandle(s.admit.grpcTap(int64(g.MaxMessageBytes), s.access)),
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

// grpcMetrics counts calls by method and gRPC code (kvindex_grpc_requests_total) and
// times them (kvindex_grpc_request_duration_seconds: from the decoded request to the
// answer, before grpc-go encodes and sends it). Methods are the registered ones: grpc-go
// refuses an unknown method before the interceptors, so the labels stay bounded.
func (s *Server) grpcMetrics(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
	start := time.Now()
	resp, err := h(ctx, req)
	s.grpcReq.WithLabelValues(info.FullMethod, status.Code(err).String()).Inc()
	s.grpcLatency.WithLabelValues(info.FullMethod).Observe(time.Since(start).Seconds())
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
	s.grpcLatency = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "kvindex_grpc_request_duration_seconds",
		Help:    "Time a gRPC call spends in its handler, by method: from the decoded request to the answer, before it is encoded and sent.",
		Buckets: requestBuckets,
	}, []string{"method"})
	s.reg.MustRegister(s.grpcReq, s.grpcLatency)
	s.grpcSrv = s.newGRPCServer()
	s.admit.grpcLn = s.admit.limit(ln, "grpc")
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		if err := s.grpcSrv.Serve(s.admit.grpcLn); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
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

// Match is POST /v1/match over gRPC: the request decoded, the pipeline run (match.go).
func (g *grpcService) Match(ctx context.Context, req *kvindexv1.MatchRequest) (*kvindexv1.MatchResponse, error) {
	in := grpcMatchInput(req)
	sc := scratchPool.Get().(*matchScratch) // the HTTP handlers' pool: q and found are reused
	defer sc.release()
	var resp MatchResponse
	if e := g.s.match(ctx, &in, sc, &resp); e != nil {
		return nil, e.grpcStatus()
	}
	return grpcMatchResponse(&resp), nil
}

// grpcQuery is a Match or Routed request's query, for the pipeline: protobuf cannot
// tell an empty list from none, so an empty one counts as not given.
func grpcQuery(model, namespace, loraName, cacheSalt string, tokens []uint32, hashes []uint64) queryInput {
	return queryInput{model: model, namespace: namespace, loraName: loraName, cacheSalt: cacheSalt,
		tokens: tokens, hashes: hashes, hasTokens: len(tokens) > 0, hasHashes: len(hashes) > 0}
}

// grpcMatchInput decodes a Match request for the pipeline.
func grpcMatchInput(req *kvindexv1.MatchRequest) matchInput {
	in := matchInput{
		queryInput: grpcQuery(req.GetModel(), req.GetNamespace(), req.GetLoraName(), req.GetCacheSalt(), req.GetTokens(), req.GetContentHashes()),
		policy:     req.GetPolicy(), topK: uint64(req.GetTopK()), record: req.GetRecord(), pick: req.GetPick(), requestID: req.GetRequestId(),
	}
	in.text = grpcText(req)
	if w := req.GetTierWeights(); len(w) > 0 { // proto3: empty is unset
		in.weights, in.nWeights, in.hasWeights = w, len(w), true
	}
	if lm := req.GetLoad(); len(lm) > 0 {
		in.loads = make(map[string]*WorkerLoad, len(lm))
		for w, l := range lm {
			if l == nil {
				continue
			}
			wl := &WorkerLoad{Tokens: l.Tokens, PrefillTokens: l.PrefillTokens, ActiveBlocks: l.ActiveBlocks, KVUtil: l.KvUtil}
			if l.Requests != nil {
				v := int(*l.Requests)
				wl.Requests = &v
			}
			if l.Waiting != nil {
				v := int(*l.Waiting)
				wl.Waiting = &v
			}
			in.loads[w] = wl
		}
	}
	return in
}

// grpcMatchResponse encodes the pipeline's answer.
func grpcMatchResponse(r *MatchResponse) *kvindexv1.MatchResponse {
	resp := &kvindexv1.MatchResponse{Model: r.Model, Namespace: r.Namespace, Blocks: int32(r.Blocks),
		Matches: make([]*kvindexv1.Match, 0, len(r.Matches)), MatchesTotal: int32(r.MatchesTotal),
		TierWeights: r.TierWeights[:], Recorded: r.Recorded, Tokens: int32(r.Tokens)}
	for i := range r.Matches {
		mt := &r.Matches[i]
		tiers := make([]int32, len(mt.Tiers))
		for t, n := range mt.Tiers {
			tiers[t] = int32(n)
		}
		resp.Matches = append(resp.Matches, &kvindexv1.Match{Worker: mt.Worker, Score: int32(mt.Score), Size: int32(mt.Size),
			State: mt.State, Predicted: int32(mt.Predicted), Tiers: tiers, Weighted: mt.Weighted, Trust: mt.Trust})
	}
	if p := r.Pick; p != nil {
		resp.Pick = &kvindexv1.Pick{Worker: p.Worker, Policy: p.Policy, Score: int32(p.Score), Reason: p.Reason, Weighted: p.Weighted, RequestId: p.RequestID}
	}
	return resp
}

// Routed is POST /v1/routed over gRPC (match.go's routed).
func (g *grpcService) Routed(ctx context.Context, req *kvindexv1.RoutedRequest) (*kvindexv1.RoutedResponse, error) {
	in := routedInput{
		queryInput: grpcQuery(req.GetModel(), req.GetNamespace(), req.GetLoraName(), req.GetCacheSalt(), req.GetTokens(), req.GetContentHashes()),
		worker:     req.GetWorker(), ttlMs: uint64(req.GetTtlMs()), requestID: req.GetRequestId(),
	}
	sc := scratchPool.Get().(*matchScratch)
	defer sc.release()
	r, e := g.s.routed(ctx, &in, sc)
	if e != nil {
		return nil, e.grpcStatus()
	}
	return &kvindexv1.RoutedResponse{Model: r.Model, Namespace: r.Namespace, Worker: r.Worker, Blocks: int32(r.Blocks), TtlMs: r.TTLms}, nil
}

// Finished is POST /v1/finished over gRPC.
func (g *grpcService) Finished(ctx context.Context, req *kvindexv1.FinishedRequest) (*kvindexv1.FinishedResponse, error) {
	known, e := g.s.finished(ctx, req.GetRequestId(), req.GetFirstToken())
	if e != nil {
		return nil, e.grpcStatus()
	}
	return &kvindexv1.FinishedResponse{Known: known}, nil
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
		if d, err := wi.Digest.WorkerDigest(); err == nil {
			w.Digest, w.DigestBlocks = d.Sum, int64(d.Blocks)
			for _, ns := range slices.Sorted(maps.Keys(d.Namespaces)) {
				nd := d.Namespaces[ns]
				w.NamespaceDigests = append(w.NamespaceDigests, &kvindexv1.NamespaceDigest{Namespace: ns, Digest: nd.Sum, Blocks: int64(nd.Blocks)})
			}
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
