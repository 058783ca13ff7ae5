package server

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/kvindex/kvindex/engine"
	"github.com/kvindex/kvindex/kvevents"
	"github.com/kvindex/kvindex/server/internal/wire"
	"github.com/kvindex/kvindex/subscriber"
)

// The routing policies /v1/match can apply.
const (
	// PolicyLongestPrefix is route.LongestPrefix, uncapped: the pickable worker with
	// the highest weighted score (its leading blocks, each at the weight of the fastest
	// tier holding it); ties, and a prompt no worker holds, go to the fewest requests
	// in flight, then by the prompt's hash (pick.go's tieBreak), so equal prompts get
	// equal picks.
	PolicyLongestPrefix = "longest-prefix"
	// PolicyRoundRobin cycles over the model's eligible workers, ignoring the cache.
	PolicyRoundRobin = "round-robin"
	// PolicyRandom picks an eligible worker uniformly at random.
	PolicyRandom = "random"
)

// Policies lists the policies.
func Policies() []string {
	return append([]string{PolicyLongestPrefix, PolicyRoundRobin, PolicyRandom}, loadAware...)
}

// U64 is an unsigned 64-bit integer that JSON may carry as a number or, for clients
// whose numbers are float64 (JavaScript), as a decimal or 0x-prefixed hex string.
type U64 uint64

// UnmarshalJSON accepts 123, "123" and "0x7b".
func (u *U64) UnmarshalJSON(b []byte) error {
	s := string(b)
	if len(s) >= 2 && s[0] == '"' && s[len(s)-1] == '"' {
		s = s[1 : len(s)-1]
	}
	base := 10
	if strings.HasPrefix(s, "0x") || strings.HasPrefix(s, "0X") {
		s, base = s[2:], 16
	}
	v, err := strconv.ParseUint(s, base, 64)
	if err != nil {
		return fmt.Errorf("not an unsigned 64-bit integer: %s", b)
	}
	*u = U64(v)
	return nil
}

// MatchRequest is the body of POST /v1/match, for clients (the server reads it with a
// strict single-pass reader: unknown or duplicated fields, wrong types and trailing
// data are 400s).
// Exactly one of Tokens and ContentHashes is given (an empty list is a query that
// matches nothing).
type MatchRequest struct {
	// Model names the model (optional when only one is configured).
	Model string `json:"model"`
	// Namespace is the prefix space within the model, in kvevents' format ("" default,
	// "lora=NAME", "salt=SALT", "lora=NAME;salt=SALT"; anything else is a 400
	// bad_namespace). Or give LoraName / CacheSalt.
	Namespace string `json:"namespace"`
	LoraName  string `json:"lora_name"`
	CacheSalt string `json:"cache_salt"`
	// Tokens are the prompt's token ids; a trailing partial block is dropped.
	Tokens []uint32 `json:"tokens"`
	// ContentHashes are the prompt's block content hashes (package hash), for callers
	// that hash themselves.
	ContentHashes []U64 `json:"content_hashes"`
	// Policy overrides the configured policy for this request.
	Policy string `json:"policy"`
	// ExtraKeys are the per-block extra keys of a multimodal (or vLLM-salted) prompt,
	// with Tokens: see package wire (server/internal/wire) for the shape and the hash.
	ExtraKeys []any `json:"extra_keys,omitempty"`
	// Record records the pick as a prediction (as POST /v1/routed would, with the
	// server's default TTL): the next requests sharing this prompt see it before the
	// picked worker's events arrive.
	Record bool `json:"record,omitempty"`
	// TierWeights overrides the server's tier weights (tier_weights in its config) for
	// this request: a device, a host and a disk block's value in the weighted score,
	// three numbers in [0, 1]. Absent or null: the server's.
	TierWeights []float64 `json:"tier_weights,omitempty"`
	// Pick counts the pick as routed: its prompt's load goes against the picked worker
	// (the cost and scorer policies read it) until POST /v1/finished names RequestID
	// (given, at most 256 bytes, or made up and returned in the pick).
	Pick      bool   `json:"pick,omitempty"`
	RequestID string `json:"request_id,omitempty"`
	// Load is the caller's own view of the workers' load, by worker id; its fields
	// replace the server's tracked ones (pick.go, WorkerLoad).
	Load map[string]WorkerLoad `json:"load,omitempty"`
}

// RoutedRequest is the body of POST /v1/routed: the caller sent a request to Worker, so
// the worker is about to hold its blocks (read strictly, like MatchRequest). Exactly one
// of Tokens and ContentHashes is given.
type RoutedRequest struct {
	Model     string `json:"model"`
	Namespace string `json:"namespace,omitempty"`
	LoraName  string `json:"lora_name,omitempty"`
	CacheSalt string `json:"cache_salt,omitempty"`
	// Worker is the worker the request went to: one of the model's workers.
	Worker        string   `json:"worker"`
	Tokens        []uint32 `json:"tokens,omitempty"`
	ContentHashes []U64    `json:"content_hashes,omitempty"`
	ExtraKeys     []any    `json:"extra_keys,omitempty"`
	// TTLms is the prediction's lifetime in milliseconds; 0 or absent: the server's
	// default (index.prediction_ttl). At most 600000.
	TTLms uint64 `json:"ttl_ms,omitempty"`
	// RequestID, when given, also counts the request's load against Worker until POST
	// /v1/finished names it (the cost and scorer policies read it).
	RequestID string `json:"request_id,omitempty"`
}

// RoutedResponse is the answer of POST /v1/routed.
type RoutedResponse struct {
	Model     string `json:"model"`
	Namespace string `json:"namespace"`
	Worker    string `json:"worker"`
	// Blocks is the number of full blocks predicted.
	Blocks int `json:"blocks"`
	// TTLms is the prediction's lifetime as applied.
	TTLms int64 `json:"ttl_ms"`
}

// Match is one worker's answer.
type Match struct {
	Worker string `json:"worker"`
	// Score is the number of leading query blocks the worker holds, on any tier.
	Score int `json:"score"`
	// Tiers are the leading query blocks the worker holds in device memory, in device
	// or host memory, and on any tier (device, host, disk): cumulative, so Tiers[2] ==
	// Score; all three equal for an engine that publishes device events only.
	Tiers [engine.NumTiers]int `json:"tiers"`
	// Weighted is the weighted score: each leading block at the weight of the fastest
	// tier that holds it (w[0]*Tiers[0] + w[1]*(Tiers[1]-Tiers[0]) +
	// w[2]*(Tiers[2]-Tiers[1])), with the request's or the server's weights.
	Weighted float64 `json:"weighted"`
	// Size is the number of blocks the worker holds.
	Size int `json:"size"`
	// Predicted is the part of Score that comes from predictions (POST /v1/routed,
	// "record"), not from the worker's events.
	Predicted int `json:"predicted"`
	// State is the worker's subscriber state (live, stale, disconnected, ...), or
	// "approximate" for a worker without events.
	State string `json:"state"`
	// Trust is the trust state the score came from (trust.go): "exact" (the worker's
	// events), "degraded" (the index merged with predictions: a lower bound) or
	// "approximate" (predictions alone).
	Trust string `json:"trust"`
}

// Pick is the worker the policy chose.
type Pick struct {
	Worker string `json:"worker"`
	Policy string `json:"policy"`
	Score  int    `json:"score"`
	// Weighted is the picked worker's weighted score (0 when it matched nothing).
	Weighted float64 `json:"weighted"`
	Reason   string  `json:"reason"`
	// RequestID names the pick counted as routed ("pick": true), for its POST
	// /v1/finished report.
	RequestID string `json:"request_id,omitempty"`
}

// MatchResponse is the answer of POST /v1/match.
type MatchResponse struct {
	Model     string `json:"model"`
	Namespace string `json:"namespace"`
	// Blocks is the number of full blocks in the query.
	Blocks int `json:"blocks"`
	// Matches lists the workers with score >= 1, best first: weighted descending,
	// then score descending, then worker id; at most the request's top_k (and the
	// server's max_matches) of them.
	Matches []Match `json:"matches"`
	// MatchesTotal is how many workers matched, Matches' length before top_k.
	MatchesTotal int `json:"matches_total"`
	// TierWeights are the weights the weighted scores were computed with.
	TierWeights engine.Weights `json:"tier_weights"`
	// Pick is null when the model has no eligible (live or stale) worker.
	Pick *Pick `json:"pick"`
	// Recorded says the pick was recorded as a prediction ("record": true).
	Recorded bool `json:"recorded,omitempty"`
	// Tokens is the number of token ids a text query (prompt or messages) made.
	Tokens int `json:"tokens,omitempty"`
}

// errorBody is every error's JSON body.
type errorBody struct {
	Error string `json:"error"`
	Code  string `json:"code"`
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	enc := json.NewEncoder(w)
	_ = enc.Encode(v)
}

func writeError(w http.ResponseWriter, status int, code, format string, args ...any) {
	writeJSON(w, status, errorBody{Error: fmt.Sprintf(format, args...), Code: code})
}

// statusRecorder remembers the status code for the request counter.
type statusRecorder struct {
	http.ResponseWriter
	code int
}

func (r *statusRecorder) WriteHeader(code int) {
	r.code = code
	r.ResponseWriter.WriteHeader(code)
}

func (s *Server) instrument(name string, h http.HandlerFunc) http.Handler {
	latency := s.httpLatency.WithLabelValues(name)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		s.inFlight.Inc()
		defer s.inFlight.Dec()
		rec := &statusRecorder{ResponseWriter: w, code: http.StatusOK}
		h(rec, r)
		s.requests.WithLabelValues(name, strconv.Itoa(rec.code)).Inc()
		latency.Observe(time.Since(start).Seconds())
	})
}

func methods(h http.HandlerFunc, allowed ...string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		for _, m := range allowed {
			if r.Method == m || (m == http.MethodGet && r.Method == http.MethodHead) {
				h(w, r)
				return
			}
		}
		w.Header().Set("Allow", strings.Join(allowed, ", "))
		writeError(w, http.StatusMethodNotAllowed, "method_not_allowed", "%s not allowed; use %s", r.Method, strings.Join(allowed, ", "))
	}
}

func (s *Server) routes() http.Handler {
	mux := http.NewServeMux()
	mux.Handle("/v1/match", s.instrument("match", methods(s.handleMatch, http.MethodPost)))
	mux.Handle("/v1/routed", s.instrument("routed", methods(s.handleRouted, http.MethodPost)))
	mux.Handle("/v1/route", s.instrument("route", methods(s.handleRoute, http.MethodPost)))
	mux.Handle("/v1/finished", s.instrument("finished", methods(s.handleFinished, http.MethodPost)))
	mux.Handle("/v1/workers", s.instrument("workers", methods(s.handleWorkers, http.MethodGet)))
	mux.Handle("/v1/workers/{worker}/resync", s.instrument("resync", methods(s.handleResync, http.MethodPost)))
	mux.Handle("/v1/engines", s.instrument("engines", methods(s.handleEngines, http.MethodGet, http.MethodPost)))
	mux.Handle("/v1/engines/{key}", s.instrument("engine", methods(s.handleEngine, http.MethodDelete)))
	mux.Handle("/register", s.instrument("mooncake_register", methods(s.handleMooncakeRegister, http.MethodPost)))
	mux.Handle("/unregister", s.instrument("mooncake_unregister", methods(s.handleMooncakeUnregister, http.MethodPost)))
	mux.Handle("/query", s.instrument("mooncake_query", methods(s.handleMooncakeQuery(false), http.MethodPost)))
	mux.Handle("/query_by_hash", s.instrument("mooncake_query_by_hash", methods(s.handleMooncakeQuery(true), http.MethodPost)))
	mux.Handle("/healthz", s.instrument("healthz", methods(s.handleHealth, http.MethodGet)))
	mux.Handle("/readyz", s.instrument("readyz", methods(s.handleReady, http.MethodGet)))
	metrics := promhttp.HandlerFor(s.reg, promhttp.HandlerOpts{ErrorLog: nil})
	mux.Handle("/metrics", s.instrument("metrics", methods(metrics.ServeHTTP, http.MethodGet)))
	mux.Handle("/", s.instrument("other", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, http.StatusNotFound, "not_found", "no such endpoint: %s", r.URL.Path)
	}))
	return mux
}

// RequestNamespace is the index namespace of a query: subscriber.Namespace(model, ns)
// where ns is namespace, or built from a LoRA name and a cache salt as kvevents does.
//
// The namespace is at most engine.MaxNamespaceLen bytes (1 KiB: LoRA names and cache
// salts are tens of bytes): a longer one is an error, checked on the raw fields before
// anything is built from them.
func RequestNamespace(model, namespace, loraName, cacheSalt string) (string, error) {
	if namespace != "" && (loraName != "" || cacheSalt != "") {
		return "", errors.New("give namespace, or lora_name/cache_salt, not both")
	}
	if n := len(model) + len(namespace) + len(loraName) + len(cacheSalt); n > engine.MaxNamespaceLen {
		return "", fmt.Errorf("%w: model, namespace, lora_name and cache_salt take %d bytes", errNamespaceTooLong, n)
	}
	ns := namespace
	if loraName != "" || cacheSalt != "" {
		ns = kvevents.Namespace(loraName, cacheSalt)
	} else if err := checkNamespace(ns); err != nil {
		return "", err
	}
	full := subscriber.Namespace(model, ns)
	if len(full) > engine.MaxNamespaceLen {
		return "", fmt.Errorf("%w: %d bytes escaped", errNamespaceTooLong, len(full))
	}
	return full, nil
}

// errNamespaceTooLong refuses a request whose namespace is over engine.MaxNamespaceLen.
var errNamespaceTooLong = fmt.Errorf("namespace longer than %d bytes", engine.MaxNamespaceLen)

// checkNamespace reports whether ns is a namespace kvevents can give an event: "",
// "lora=NAME", "lora_id=ID", "salt=SALT", or a lora part and a salt part joined by ';',
// each value non-empty and escaped as AppendEscaped does. Anything else could never
// match and is a client's mistake, so it gets a 400 rather than an empty answer.
func checkNamespace(ns string) error {
	if ns == "" {
		return nil
	}
	bad := func(why string) error {
		return fmt.Errorf("namespace %q: %s (want lora=NAME, lora_id=ID, salt=SALT or lora=NAME;salt=SALT)", ns, why)
	}
	lora, salt, two := strings.Cut(ns, ";")
	if two && lora == "" {
		return bad("empty part")
	}
	if !two && strings.HasPrefix(ns, "salt=") {
		lora, salt, two = "", ns, true
	}
	if lora != "" {
		switch {
		case strings.HasPrefix(lora, "lora="):
			if err := checkEscaped(lora[len("lora="):]); err != nil {
				return bad(err.Error())
			}
		case strings.HasPrefix(lora, "lora_id="):
			if !decimalID(lora[len("lora_id="):]) {
				return bad("lora_id is not a decimal id")
			}
		default:
			return bad("unknown part " + strconv.Quote(lora))
		}
	}
	if two {
		v, ok := strings.CutPrefix(salt, "salt=")
		if !ok {
			return bad("unknown part " + strconv.Quote(salt))
		}
		if err := checkEscaped(v); err != nil {
			return bad(err.Error())
		}
	}
	return nil
}

// checkEscaped checks a namespace value: non-empty, no raw ';' or control bytes, and
// every '%' followed by two upper-case hex digits.
func checkEscaped(v string) error {
	if v == "" {
		return errors.New("empty value")
	}
	for i := 0; i < len(v); i++ {
		switch c := v[i]; {
		case c == ';' || c < 0x20 || c == 0x7f:
			return fmt.Errorf("unescaped byte %#02x", c)
		case c == '%':
			if i+2 >= len(v) || !isUpperHex(v[i+1]) || !isUpperHex(v[i+2]) {
				return errors.New("bad %XX escape")
			}
			i += 2
		}
	}
	return nil
}

// decimalID reports whether id is an integer as the decoder writes a lora_id: an
// unsigned 64-bit one, or a negative one of 64 bits (msgpack carries both), in decimal
// without leading zeros ("-0" never comes out).
func decimalID(id string) bool {
	digits, neg := strings.CutPrefix(id, "-")
	if digits == "" || (digits[0] == '0' && (len(digits) > 1 || neg)) {
		return false
	}
	if neg {
		_, err := strconv.ParseInt(id, 10, 64)
		return err == nil
	}
	_, err := strconv.ParseUint(digits, 10, 64)
	return err == nil
}

func isUpperHex(c byte) bool { return c >= '0' && c <= '9' || c >= 'A' && c <= 'F' }

func (s *Server) resolveModel(name string) (*model, error) {
	models := s.fleet().models
	if name == "" {
		if models.Len() == 1 {
			for _, m := range models.All() {
				return m, nil
			}
		}
		if m, ok := models.Get(""); ok {
			return m, nil
		}
		return nil, errors.New("model is required: several models are served")
	}
	m, ok := models.Get(name)
	if !ok {
		return nil, fmt.Errorf("unknown model %q", name)
	}
	return m, nil
}

// matchScratch is one request's reusable memory: the HTTP body and its decoded
// request, the query's hashes and the engine's matches (gRPC uses the last two), and
// a load-aware pick's working memory.
type matchScratch struct {
	body  bytes.Buffer
	req   wire.Request
	q     []uint64
	found []engine.Match
	pick  pickScratch

	tokens []uint32 // a text query's ids (text.go)
}

var scratchPool = sync.Pool{New: func() any { return new(matchScratch) }}

// readBody reads a request body within the size limit, answering the error itself.
func (s *Server) readBody(w http.ResponseWriter, r *http.Request, buf *bytes.Buffer) bool {
	if n := r.ContentLength; n > 0 && n <= s.cfg.MaxBodyBytes {
		buf.Grow(int(n) + bytes.MinRead) // ReadFrom keeps MinRead free: the buffer never doubles
	}
	_, err := buf.ReadFrom(http.MaxBytesReader(w, r.Body, s.cfg.MaxBodyBytes))
	if err == nil {
		return true
	}
	var mbe *http.MaxBytesError
	if errors.As(err, &mbe) {
		writeError(w, http.StatusRequestEntityTooLarge, "body_too_large", "request body exceeds %d bytes", mbe.Limit)
		return false
	}
	writeError(w, http.StatusBadRequest, "bad_body", "reading the body: %v", err)
	return false
}

// release gives a request's scratch back to the pool unless it grew large: a body, or
// the tokens or content hashes parsed from it (a hostile list of short numbers is up to
// four times the body), past what a common query needs.
func (sc *matchScratch) release() {
	if sc.body.Cap() <= 1<<20 && cap(sc.req.Tokens) <= 1<<18 && cap(sc.req.Hashes) <= 1<<18 && cap(sc.tokens) <= 1<<18 {
		scratchPool.Put(sc)
	}
}

// readRequest reads a match or routed request's body and decodes it into sc.req,
// answering every error itself (ok false). What it decodes is checked by the pipeline
// (match.go).
func (s *Server) readRequest(w http.ResponseWriter, r *http.Request, sc *matchScratch, kind wire.Kind) bool {
	sc.body.Reset()
	if !s.readBody(w, r, &sc.body) {
		return false
	}
	if sc.body.Len() == 0 {
		writeError(w, http.StatusBadRequest, "bad_json", "empty request body")
		return false
	}
	if err := wire.Decode(sc.body.Bytes(), &sc.req, kind); err != nil {
		writeError(w, http.StatusBadRequest, "bad_json", "invalid request: %v", err)
		return false
	}
	return true
}

// queryOf is a decoded request's query, for the pipeline.
func queryOf(req *wire.Request) queryInput {
	return queryInput{model: req.Model, namespace: req.Namespace, loraName: req.LoraName, cacheSalt: req.CacheSalt,
		tokens: req.Tokens, hashes: req.Hashes, hasTokens: req.HasTokens, hasHashes: req.HasHashes, extraKeys: req.ExtraKeys,
		text: req.Text}
}

// handleMatch is POST /v1/match: the body decoded, the pipeline run (match.go).
func (s *Server) handleMatch(w http.ResponseWriter, r *http.Request) {
	sc := scratchPool.Get().(*matchScratch)
	defer sc.release()
	if !s.readRequest(w, r, sc, wire.KindMatch) {
		return
	}
	req := &sc.req
	loads, err := decodeLoads(req.Load)
	if err != nil {
		writeError(w, http.StatusBadRequest, "bad_load", "%v", err)
		return
	}
	in := matchInput{queryInput: queryOf(req), policy: req.Policy, weights: req.Weights[:], nWeights: req.NWeights,
		hasWeights: req.HasWeights, topK: req.TopK, record: req.Record, pick: req.Pick, requestID: req.RequestID, loads: loads}
	var resp MatchResponse
	if e := s.match(r.Context(), &in, sc, &resp); e != nil {
		writeAPIError(w, e)
		return
	}
	writeJSON(w, http.StatusOK, resp)
}

// topK is how many of n matches an answer carries: the request's top_k (0: none
// asked), at most Config.MaxMatches. The pick is made from all of them first.
func (s *Server) topK(asked uint64, n int) int {
	k := uint64(s.cfg.MaxMatches)
	if asked > 0 {
		k = min(k, asked)
	}
	return int(min(uint64(n), k))
}

// matches appends the API's matches for the engine's answer to dst, in the order the
// response promises (HTTP and gRPC alike): weighted descending (the best worker for a
// router first), then score descending, then worker id.
//
// A worker the server does not serve is left out: one whose engine was just removed
// (its blocks are leaving the index) or whose predictions outlive it (a removed engine
// without events). Each match is scored from its worker's trust state (trust.go; ns
// and q are the query's, for the predictions of approximate workers), which it names:
// an approximate worker without a prediction for the query is left out too.
func (s *Server) matches(ns string, q []uint64, found []engine.Match, w engine.Weights, dst []Match) []Match {
	fl := s.fleet()
	ts := s.newTrustScorer(fl, ns, q)
	defer ts.done()
	for i := range found {
		f := found[i]
		fw := fl.lookup(f.Worker) // once per worker: the fleet's index (fleetindex.go)
		state := fw.state(s.external)
		if state == stateUnknown {
			continue
		}
		t := s.scoredTrust(fw, ts.lowered, f.Worker)
		if !ts.rescore(&f, t) {
			continue
		}
		if t != trustExact {
			s.trust.fallback[t].Inc()
		}
		dst = append(dst, Match{Worker: f.Worker, Score: f.Score, Tiers: f.Tiers, Weighted: f.Weighted(w),
			Size: f.Size, Predicted: f.Predicted, State: state, Trust: t.String()})
	}
	slices.SortFunc(dst, func(a, b Match) int {
		switch {
		case a.Weighted != b.Weighted:
			if a.Weighted > b.Weighted {
				return -1
			}
			return 1
		case a.Score != b.Score:
			return b.Score - a.Score
		}
		return strings.Compare(a.Worker, b.Worker)
	})
	return dst
}

// noteMatch feeds a served match to the diagnostics (HTTP and gRPC alike): a non-empty
// query counts toward the model's unmatched rate, and the picked worker is marked served
// (for events_stopped).
func (s *Server) noteMatch(m *model, blocks, found int, pick *Pick) {
	if blocks > 0 {
		s.noteQuery(m, found > 0)
	}
	if pick == nil {
		return
	}
	if sub := s.fleet().worker(pick.Worker); sub != nil {
		sub.NoteServed(s.now())
	}
}

// resolvePolicy returns a match request's policy (the configured one when empty), or an
// error naming the known ones.
func (s *Server) resolvePolicy(policy string) (string, error) {
	if policy == "" {
		policy = s.cfg.Policy
	}
	if p, ok := canonicalPolicy(policy); ok {
		return p, nil
	}
	return "", fmt.Errorf("unknown policy %q (want one of %v)", policy, Policies())
}

// stateApproximate is the state of a worker without events; stateUnknown that of a
// worker the server does not serve.
const (
	stateApproximate = "approximate"
	stateUnknown     = "unknown"
)

// servesWorker reports whether worker is one of model m's workers (any worker when the
// index is fed by another process, which knows them).
func (s *Server) servesWorker(m *model, worker string) bool {
	f := s.fleet()
	if sub := f.worker(worker); sub != nil {
		return sub.Model() == m.name
	}
	if am := f.approxOf(worker); am != nil {
		return am.name == m.name
	}
	return s.external
}

// handleRouted is POST /v1/routed: a routing decision recorded as a prediction
// (match.go's routed).
func (s *Server) handleRouted(w http.ResponseWriter, r *http.Request) {
	sc := scratchPool.Get().(*matchScratch)
	defer sc.release()
	if !s.readRequest(w, r, sc, wire.KindRouted) {
		return
	}
	req := &sc.req
	in := routedInput{queryInput: queryOf(req), worker: req.Worker, ttlMs: req.TTLms, requestID: req.RequestID}
	resp, e := s.routed(r.Context(), &in, sc)
	if e != nil {
		writeAPIError(w, e)
		return
	}
	writeJSON(w, http.StatusOK, resp)
}

// eligible reports whether a worker may be picked: its subscriber is connected and
// synced (live or stale).
func eligible(st subscriber.State) bool {
	return st == subscriber.StateLive || st == subscriber.StateStale
}

func (s *Server) pick(m *model, policy string, matches []Match) *Pick {
	// The fallback candidates: the eligible subscribed workers and the approximate ones,
	// in id order.
	var cands []string
	for _, sub := range m.subs.All() {
		if eligible(sub.State()) {
			cands = append(cands, sub.Worker())
		}
	}
	if m.approx.Len() > 0 {
		cands = slices.Grow(cands, m.approx.Len())
		for w := range m.approx.Keys() {
			cands = append(cands, w)
		}
		slices.Sort(cands)
	}
	if len(cands) == 0 {
		return nil
	}
	var c string
	reason := "round-robin"
	switch policy {
	case PolicyRandom:
		c, reason = cands[rand.IntN(len(cands))], "random"
	default:
		c = cands[int(s.rr.Add(1)-1)%len(cands)]
	}
	p := &Pick{Worker: c, Policy: policy, Reason: reason}
	for _, mt := range matches {
		if mt.Worker == c {
			p.Score, p.Weighted = mt.Score, mt.Weighted
		}
	}
	return p
}

// WorkerInfo is one entry of GET /v1/workers.
type WorkerInfo struct {
	Worker         string `json:"worker"`
	Endpoint       string `json:"endpoint"`
	ReplayEndpoint string `json:"replay_endpoint,omitempty"`
	Model          string `json:"model"`
	DPRank         int    `json:"dp_rank"`
	State          string `json:"state"`
	// Trust is the worker's diagnosed trust state (trust.go): where its scores come
	// from, unless trust.off keeps them on the index.
	Trust     string `json:"trust"`
	Synced    bool   `json:"synced"`
	Connected bool   `json:"connected"`
	// ReplayShort: the last catch-up replay broke off before its end (state stale
	// until a retry completes; subscriber.Status.ReplayShort).
	ReplayShort bool `json:"replay_short,omitempty"`
	// Size is the number of blocks the index holds for the worker; null when the index
	// cannot tell.
	Size *int `json:"size"`
	// LastSeq is the sequence of the last applied batch; null before the first.
	LastSeq *uint64 `json:"last_seq"`
	Gaps    struct {
		Detected      uint64 `json:"detected"`
		Recovered     uint64 `json:"recovered"`
		Unrecoverable uint64 `json:"unrecoverable"`
	} `json:"gaps"`
	Restarts   uint64 `json:"restarts"`
	Replays    uint64 `json:"replays"`
	Duplicates uint64 `json:"duplicates"`
	Batches    uint64 `json:"batches"`
	Events     struct {
		Stored  uint64 `json:"stored"`
		Removed uint64 `json:"removed"`
		Cleared uint64 `json:"cleared"`
		// Copied counts offloads named by engine hash only (vLLM's offloading
		// connector's stores on a host or disk medium), applied as copies.
		Copied uint64 `json:"copied"`
	} `json:"events"`
	Rejected map[string]uint64 `json:"rejected"`
	// LagSeconds is the last batch's apply time minus its timestamp (engine clock);
	// IdleSeconds the time since the last live message (null before one).
	LagSeconds  float64  `json:"lag_seconds"`
	IdleSeconds *float64 `json:"idle_seconds"`
	LastError   string   `json:"last_error,omitempty"`
	// Diagnostics lists the worker's problems (why routing may ignore its cache) and
	// the counters behind them; see diagnose.go.
	Diagnostics *WorkerDiag `json:"diagnostics"`
	// Digest is the order-independent digest of what the index holds for the worker,
	// per namespace too (digest.go).
	Digest *DigestInfo `json:"digest,omitempty"`
}

func (s *Server) workerInfo(sub *subscriber.Subscriber, sizer WorkerSizer, now time.Time) WorkerInfo {
	st := sub.Status()
	wi := WorkerInfo{
		Worker: st.Worker, Endpoint: st.Endpoint, ReplayEndpoint: st.ReplayEndpoint, Model: st.Model,
		DPRank: st.DPRank, State: st.State.String(), Trust: s.workerTrust(st.Worker), Synced: st.Synced, Connected: st.Connected,
		ReplayShort: st.ReplayShort, Restarts: st.Restarts, Replays: st.Replays, Duplicates: st.Duplicates, Batches: st.Batches,
		LagSeconds: st.Lag.Seconds(), LastError: st.LastError, Rejected: map[string]uint64{},
	}
	if sizer != nil {
		if n, ok := sizer.WorkerSize(st.Worker); ok {
			wi.Size = &n
		} else {
			zero := 0
			wi.Size = &zero
		}
	}
	if st.HasSeq {
		v := st.LastSeq
		wi.LastSeq = &v
	}
	wi.Gaps.Detected, wi.Gaps.Recovered, wi.Gaps.Unrecoverable = st.GapsDetected, st.GapsRecovered, st.GapsUnrecoverable
	wi.Events.Stored, wi.Events.Removed, wi.Events.Cleared, wi.Events.Copied = st.Stored, st.Removed, st.Cleared, st.Copied
	for r, n := range st.Rejected {
		if n > 0 {
			wi.Rejected[subscriber.Reason(r).String()] = n
		}
	}
	for r, n := range st.DecoderRejected {
		if n > 0 {
			wi.Rejected[subscriber.DecoderReasonName(kvevents.Reason(r))] = n
		}
	}
	if !st.LastMessage.IsZero() {
		v := now.Sub(st.LastMessage).Seconds()
		wi.IdleSeconds = &v
	}
	wi.Diagnostics = workerDiag(&st, sub.Problems(now))
	return wi
}

func (s *Server) handleWorkers(w http.ResponseWriter, r *http.Request) {
	sizer := s.sizer()
	now := s.now()
	out := struct {
		Workers []WorkerInfo `json:"workers"`
		Models  []ModelInfo  `json:"models"`
	}{Workers: s.workerInfos(sizer, now), Models: s.modelInfos(now)}
	writeJSON(w, http.StatusOK, out)
}

// workerInfos lists every worker, HTTP and gRPC alike: the subscribed ones in their
// order, then those without events by id.
func (s *Server) workerInfos(sizer WorkerSizer, now time.Time) []WorkerInfo {
	f := s.fleet()
	out := make([]WorkerInfo, 0, f.subs.Len()+f.approx.Len())
	for _, sub := range f.subs.All() {
		out = append(out, s.workerInfo(sub, sizer, now))
	}
	for _, name := range slices.Sorted(f.approx.Keys()) {
		// A worker without events: only its model, state and size (0 unless a relay
		// feeds the index) mean anything.
		wi := WorkerInfo{Worker: name, Model: f.approxOf(name).name, State: stateApproximate, Trust: TrustApproximate, Rejected: map[string]uint64{}}
		if sizer != nil {
			n, _ := sizer.WorkerSize(name)
			wi.Size = &n
		}
		out = append(out, wi)
	}
	for _, wi := range s.fedWorkers(f) {
		if sizer != nil {
			n, _ := sizer.WorkerSize(wi.Worker)
			wi.Size = &n
		}
		out = append(out, wi)
	}
	withDigests(out, s.digestsOf())
	return out
}

// fedWorkers returns Options.Workers' list without the workers the server subscribes
// to or serves from predictions (they are listed as such), each with a Rejected map.
func (s *Server) fedWorkers(f *fleet) []WorkerInfo {
	if s.extWorkers == nil {
		return nil
	}
	ws := s.extWorkers()
	out := ws[:0]
	for _, wi := range ws {
		if f.worker(wi.Worker) != nil || f.approxOf(wi.Worker) != nil {
			continue
		}
		if wi.Rejected == nil {
			wi.Rejected = map[string]uint64{}
		}
		if wi.Trust == "" {
			wi.Trust = TrustExact // its relay vouches for its stream
		}
		out = append(out, wi)
	}
	return out
}

func (s *Server) handleHealth(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), time.Second)
	defer cancel()
	if err := s.eng.Barrier(ctx); err != nil {
		writeError(w, http.StatusServiceUnavailable, "unhealthy", "index: %v", err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
}

func (s *Server) handleReady(w http.ResponseWriter, r *http.Request) {
	ok, waiting := s.isReady()
	if !ok {
		writeJSON(w, http.StatusServiceUnavailable, map[string]any{"ready": false, "waiting": waiting})
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"ready": true})
}
