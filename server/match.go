package server

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"slices"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kvindex/kvindex/engine"
	"github.com/kvindex/kvindex/hash"
	"github.com/kvindex/kvindex/route"
	"github.com/kvindex/kvindex/server/internal/wire"
)

// The match pipeline: one path from a decoded request to its answer, whichever
// transport brought it. A transport only decodes (HTTP's single-pass reader in
// package wire, a gRPC message's getters) and encodes (JSON, protobuf); every check, the
// hashing, the engine call, the trust states, the pick and top-k are here, in one
// order, so the same request gets the same answer and the same error over both:
//
//	POST /v1/match ── decodeRequest ──┐              ┌── writeJSON / writeAPIError
//	gRPC Match ────── grpcMatchInput ─┤              ├── grpcMatchResponse / grpcStatus
//	                                  ▼              │
//	  matchInput ── target: model, namespace         │
//	             ── textQuery: prompt or messages turned into tokens (text.go)
//	             ── checkQuery: tokens xor content_hashes, at most MaxQueryBlocks
//	             ── policy, tier_weights, top_k, request_id, load
//	             ── hashQuery: tokens (and extra_keys) in blocks of the model's size
//	             ── find: the engine under Config.QueryTimeout
//	             ── matches: each worker scored from its trust state (trust.go), sorted
//	             ── choose: the policy's pick (pick.go), tracked when asked; record
//	             ── top-k ──────────────────────────────┘
//
// POST /v1/routed and gRPC Routed share the same way (routed), and the Mooncake /query
// shares the engine step (find) and the trust states.
//
// A check refuses with an *apiError that names the HTTP status and code and the gRPC
// code of the refusal, and one message for both. A request refused anyway costs no
// hashing: the hashes come after every check of the request's own fields.

// apiError is a request's refusal, in both transports' terms.
type apiError struct {
	status     int        // the HTTP status
	code       string     // the HTTP body's code
	grpc       codes.Code // the gRPC status code
	retryAfter bool       // HTTP: Retry-After: 1 (a full namespace table, which a sweep empties)
	err        error
}

func (e *apiError) Error() string { return e.err.Error() }
func (e *apiError) Unwrap() error { return e.err }

// badRequest is a client's mistake: 400 with code, INVALID_ARGUMENT.
func badRequest(code string, err error) *apiError {
	return &apiError{status: http.StatusBadRequest, code: code, grpc: codes.InvalidArgument, err: err}
}

// writeAPIError answers an HTTP request with e.
func writeAPIError(w http.ResponseWriter, e *apiError) {
	if e.retryAfter {
		w.Header().Set("Retry-After", "1")
	}
	writeError(w, e.status, e.code, "%s", e.err.Error())
}

// grpcStatus is e as a gRPC status.
func (e *apiError) grpcStatus() error { return status.Error(e.grpc, e.err.Error()) }

// queryInput is the part of a match or routed request that names a query, as its
// transport decoded it: nothing in it is checked yet. Tokens and hashes alias the
// decoded request's memory.
type queryInput struct {
	model, namespace, loraName, cacheSalt string
	tokens                                []uint32
	hashes                                []uint64
	// hasTokens and hasHashes say the field was given (an empty list included; a gRPC
	// request cannot tell an empty list from none, so there an empty one is not given).
	hasTokens, hasHashes bool
	// extraKeys is the raw JSON of extra_keys (package wire); nil when absent (gRPC
	// has none).
	extraKeys []byte
	// text is the request's prompt or messages instead of tokens (text.go).
	text wire.Text
}

// matchInput is a match request as its transport decoded it.
type matchInput struct {
	queryInput
	policy string
	// weights are the request's tier weights when hasWeights: nWeights numbers, the
	// first engine.NumTiers of them in weights.
	weights    []float64
	nWeights   int
	hasWeights bool
	topK       uint64
	record     bool
	pick       bool
	requestID  string
	loads      map[string]*WorkerLoad // unchecked; nil: none
}

// routedInput is a routed request as its transport decoded it.
type routedInput struct {
	queryInput
	worker    string
	ttlMs     uint64
	requestID string
}

// target resolves a request's model and namespace.
func (s *Server) target(in *queryInput) (*model, string, *apiError) {
	m, err := s.resolveModel(in.model)
	if err != nil {
		return nil, "", badRequest("unknown_model", err)
	}
	ns, err := RequestNamespace(m.name, in.namespace, in.loraName, in.cacheSalt)
	if err != nil {
		return nil, "", badRequest("bad_namespace", err)
	}
	return m, ns, nil
}

// checkQuery checks a query's shape before any of it is hashed: exactly one of tokens
// and content hashes, of at most MaxQueryBlocks blocks.
func (s *Server) checkQuery(m *model, in *queryInput) *apiError {
	switch {
	case in.hasTokens && in.hasHashes:
		return badRequest("bad_query", errors.New("give tokens or content_hashes, not both"))
	case !in.hasTokens && !in.hasHashes:
		return badRequest("bad_query", errors.New("tokens or content_hashes is required"))
	case in.hasTokens && len(in.tokens) == 0:
		return badRequest("bad_query", errors.New("tokens is empty: give the prompt's token ids"))
	case in.hasHashes && len(in.hashes) == 0:
		return badRequest("bad_query", errors.New("content_hashes is empty: give the prompt's block hashes"))
	}
	blocks := len(in.hashes)
	if in.hasTokens {
		blocks = len(in.tokens) / m.blockSize
	}
	if blocks > s.cfg.MaxQueryBlocks {
		return badRequest("query_too_long", fmt.Errorf("query of %d blocks exceeds %d", blocks, s.cfg.MaxQueryBlocks))
	}
	if in.extraKeys != nil && !in.hasTokens {
		return badRequest("bad_query", errors.New("extra_keys needs tokens (with content_hashes, hash them in: hash.ContentExtra)"))
	}
	return nil
}

// hashQuery returns the query's content hashes: the request's own, or its tokens (and
// extra keys) hashed in blocks of the model's size into sc.q.
func (s *Server) hashQuery(m *model, in *queryInput, sc *matchScratch) ([]uint64, *apiError) {
	if !in.hasTokens {
		return in.hashes, nil
	}
	var q []uint64
	if in.extraKeys != nil {
		keys, err := wire.ParseExtraKeys(in.extraKeys, len(in.tokens)/m.blockSize)
		if err != nil {
			return nil, badRequest("bad_extra_keys", fmt.Errorf("extra_keys: %w", err))
		}
		q = wire.ContentsWithKeys(sc.q[:0], in.tokens, m.blockSize, keys)
	} else {
		var err error
		if q, err = hash.Blocks(sc.q[:0], in.tokens, m.blockSize); err != nil {
			return nil, &apiError{status: http.StatusInternalServerError, code: "internal", grpc: codes.Internal, err: err}
		}
	}
	sc.q = q
	return q, nil
}

// promptTokens is a query's prompt length in tokens, for the load it puts on a worker.
func promptTokens(m *model, in *queryInput, q []uint64) int {
	if in.hasTokens {
		return len(in.tokens)
	}
	return len(q) * m.blockSize
}

// checkWeights checks a request's tier weights (n numbers, the first NumTiers in w).
func checkWeights(w []float64, n int) (engine.Weights, *apiError) {
	if n != engine.NumTiers {
		return engine.Weights{}, badRequest("bad_tier_weights", fmt.Errorf("tier_weights has %d numbers, want %d (device, host, disk)", n, engine.NumTiers))
	}
	ws, err := parseWeights(w[:n], "tier_weights")
	if err != nil {
		return engine.Weights{}, badRequest("bad_tier_weights", err)
	}
	return ws, nil
}

// checkLoads checks a request's per-worker load, in worker order (so that the error
// names the same worker whatever the map's order).
func checkLoads(loads map[string]*WorkerLoad) error {
	if len(loads) == 0 {
		return nil
	}
	for _, w := range slices.Sorted(maps.Keys(loads)) {
		if err := loads[w].check(); err != nil {
			return fmt.Errorf("load: worker %q: %v", w, err)
		}
	}
	return nil
}

// checkLoadWorkers refuses a load entry for a worker the model does not serve (as
// /v1/routed refuses its worker): a mistyped name would otherwise be ignored and the
// pick made without the load the caller meant to report. With an index fed by another
// process every name is accepted (servesWorker): that process alone knows the workers.
func (s *Server) checkLoadWorkers(m *model, loads map[string]*WorkerLoad) *apiError {
	if len(loads) == 0 {
		return nil
	}
	for _, w := range slices.Sorted(maps.Keys(loads)) {
		if !s.servesWorker(m, w) {
			return badRequest("unknown_worker", fmt.Errorf("load: worker %q is not a worker of model %q", w, m.name))
		}
	}
	return nil
}

// find asks the engine for the query's matches (ctx bounds it), appending to dst.
func (s *Server) find(ctx context.Context, ns string, q []uint64, dst []engine.Match) ([]engine.Match, *apiError) {
	return s.findBy(ctx, ns, q, false, dst)
}

// findBy is find; with byPrefix, q holds the query's rolling prefix hashes (an engine
// on SPEC's chain: engine.FindMatchesByPrefixIn).
func (s *Server) findBy(ctx context.Context, ns string, q []uint64, byPrefix bool, dst []engine.Match) ([]engine.Match, *apiError) {
	start := time.Now()
	find := s.eng.FindMatchesIn
	if byPrefix {
		find = s.eng.FindMatchesByPrefixIn
	}
	found, err := find(ctx, ns, q, dst)
	s.findLatency.Observe(time.Since(start).Seconds())
	if err == nil {
		return found, nil
	}
	e := &apiError{status: http.StatusServiceUnavailable, grpc: codes.Unavailable}
	switch {
	case errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled):
		e.code, e.err = "timeout", fmt.Errorf("find matches: %w", err)
	case errors.Is(err, engine.ErrClosed) || errors.Is(err, engine.ErrShardFailed):
		e.code, e.err = "unavailable", fmt.Errorf("index unavailable: %w", err)
	case errors.Is(err, engine.ErrQueryTooLong):
		e = badRequest("query_too_long", err)
	default:
		e.status, e.code, e.grpc, e.err = http.StatusInternalServerError, "internal", codes.Internal, fmt.Errorf("find matches: %w", err)
	}
	return found, e
}

// predictError is a failed Predict's refusal.
func predictError(err error) *apiError {
	switch {
	case errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled):
		return &apiError{status: http.StatusServiceUnavailable, code: "timeout", grpc: codes.Unavailable, err: fmt.Errorf("predict: %w", err)}
	case errors.Is(err, engine.ErrClosed) || errors.Is(err, engine.ErrShardFailed):
		return &apiError{status: http.StatusServiceUnavailable, code: "unavailable", grpc: codes.Unavailable, err: fmt.Errorf("index unavailable: %w", err)}
	case errors.Is(err, engine.ErrNamespaceTableFull):
		// A sweep makes room once the namespaces nobody uses are gone.
		return &apiError{status: http.StatusServiceUnavailable, code: "namespaces_full", grpc: codes.ResourceExhausted, retryAfter: true, err: err}
	case engine.IsRejection(err) || errors.Is(err, engine.ErrQueryTooLong):
		return badRequest("bad_prediction", err)
	}
	return &apiError{status: http.StatusInternalServerError, code: "internal", grpc: codes.Internal, err: fmt.Errorf("predict: %w", err)}
}

// trackError is a failed track's refusal (a pick counted as routed, or a routed
// request with a request id).
func trackError(err error) *apiError {
	switch {
	case errors.Is(err, route.ErrDuplicate):
		return &apiError{status: http.StatusConflict, code: "duplicate_request_id", grpc: codes.AlreadyExists, err: errors.New("request_id is already in flight")}
	case errors.Is(err, route.ErrFull):
		return &apiError{status: http.StatusServiceUnavailable, code: "too_many_in_flight", grpc: codes.ResourceExhausted, err: err}
	case errors.As(err, new(*errClientBound)):
		return &apiError{status: http.StatusTooManyRequests, code: "client_tracking_limit", grpc: codes.ResourceExhausted, err: err}
	}
	return badRequest("bad_request_id", err)
}

// match runs the pipeline of a match request into *resp, using sc's memory (the
// matches are resp's own).
func (s *Server) match(ctx context.Context, in *matchInput, sc *matchScratch, resp *MatchResponse) *apiError {
	m, ns, e := s.target(&in.queryInput)
	if e != nil {
		return e
	}
	if e := s.textQuery(m, &in.queryInput, sc); e != nil {
		return e
	}
	if e := s.checkQuery(m, &in.queryInput); e != nil {
		return e
	}
	policy, err := s.resolvePolicy(in.policy)
	if err != nil {
		return badRequest("bad_policy", err)
	}
	weights := s.weights
	if in.hasWeights {
		if weights, e = checkWeights(in.weights, in.nWeights); e != nil {
			return e
		}
	}
	if in.topK > MaxMaxMatches {
		return badRequest("bad_top_k", fmt.Errorf("top_k %d exceeds %d", in.topK, MaxMaxMatches))
	}
	if err := checkRequestID(in.requestID); err != nil {
		return badRequest("bad_request_id", err)
	}
	if err := checkLoads(in.loads); err != nil {
		return badRequest("bad_load", err)
	}
	if e := s.checkLoadWorkers(m, in.loads); e != nil {
		return e
	}
	q, e := s.hashQuery(m, &in.queryInput, sc)
	if e != nil {
		return e
	}
	qctx, cancel := context.WithTimeout(ctx, time.Duration(s.cfg.QueryTimeout))
	defer cancel()
	found, e := s.find(qctx, ns, q, sc.found[:0])
	sc.found = found
	if e != nil {
		return e
	}
	*resp = MatchResponse{Model: m.name, Namespace: ns, Blocks: len(q), TierWeights: weights,
		Matches: s.matches(ns, q, found, weights, make([]Match, 0, len(found)))}
	opts := pickOpts{track: in.pick, id: in.requestID, owner: ownerOf(ctx), tokens: promptTokens(m, &in.queryInput, q), blocks: q, loads: in.loads,
		scratch: &sc.pick}
	if resp.Pick, err = s.choose(m, policy, resp.Matches, opts); err != nil {
		return trackError(err)
	}
	s.noteMatch(m, len(q), len(found), resp.Pick)
	if resp.Pick != nil && in.record && len(q) > 0 {
		if err := s.eng.Predict(qctx, resp.Pick.Worker, ns, q, 0); err != nil {
			return predictError(err)
		}
		resp.Recorded = true
	}
	if in.text.Given() {
		resp.Tokens = len(in.tokens)
	}
	resp.MatchesTotal = len(resp.Matches)
	resp.Matches = resp.Matches[:s.topK(in.topK, len(resp.Matches))]
	return nil
}

// routed runs the pipeline of a routed request: the worker is about to hold the
// query's blocks, a prediction until its events say so.
func (s *Server) routed(ctx context.Context, in *routedInput, sc *matchScratch) (RoutedResponse, *apiError) {
	m, ns, e := s.target(&in.queryInput)
	if e != nil {
		return RoutedResponse{}, e
	}
	if e := s.checkQuery(m, &in.queryInput); e != nil {
		return RoutedResponse{}, e
	}
	switch {
	case in.worker == "":
		return RoutedResponse{}, badRequest("bad_worker", errors.New("worker is required"))
	case !s.servesWorker(m, in.worker):
		return RoutedResponse{}, badRequest("unknown_worker", fmt.Errorf("worker %q is not a worker of model %q", in.worker, m.name))
	case in.ttlMs > uint64(engine.MaxPredictionTTL/time.Millisecond):
		return RoutedResponse{}, badRequest("bad_ttl", fmt.Errorf("ttl_ms %d exceeds %d", in.ttlMs, engine.MaxPredictionTTL.Milliseconds()))
	}
	if err := checkRequestID(in.requestID); err != nil {
		return RoutedResponse{}, badRequest("bad_request_id", err)
	}
	q, e := s.hashQuery(m, &in.queryInput, sc)
	if e != nil {
		return RoutedResponse{}, e
	}
	ttl := time.Duration(in.ttlMs) * time.Millisecond
	if ttl == 0 {
		ttl = s.eng.Config().PredictionTTL
	}
	qctx, cancel := context.WithTimeout(ctx, time.Duration(s.cfg.QueryTimeout))
	defer cancel()
	if in.requestID != "" {
		if err := s.trackRouted(qctx, m, ns, in.worker, in.requestID, q, promptTokens(m, &in.queryInput, q)); err != nil {
			if errors.Is(err, route.ErrDuplicate) || errors.Is(err, route.ErrFull) || errors.As(err, new(*errClientBound)) {
				return RoutedResponse{}, trackError(err)
			}
			return RoutedResponse{}, &apiError{status: http.StatusServiceUnavailable, code: "unavailable", grpc: codes.Unavailable, err: fmt.Errorf("find matches: %w", err)}
		}
	}
	if err := s.eng.Predict(qctx, in.worker, ns, q, ttl); err != nil {
		return RoutedResponse{}, predictError(err)
	}
	return RoutedResponse{Model: m.name, Namespace: ns, Worker: in.worker, Blocks: len(q), TTLms: ttl.Milliseconds()}, nil
}
