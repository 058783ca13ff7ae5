package server

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"net/http"
	"slices"
	"time"

	"github.com/kvindex/kvindex/hash"
	"github.com/kvindex/kvindex/route"
)

// The load-aware policies of /v1/match: package route's families (route.Families),
// the code `kvindex sim` measures, over the exact index and the load the server
// tracks.
const (
	// PolicyCost is route.Cost (Dynamo's KV router): the least overlap-weighted
	// prefill blocks plus decode blocks, from the load the server tracks (or the
	// caller sends). "cost" is its old name.
	PolicyCost = route.FamilyDynamoCost
	// PolicyScorer is route.Scorer (llm-d's weighted scorers): prefix, KV utilisation
	// and queue depth. "scorer" is its old name.
	PolicyScorer = route.FamilyLLMDScorer
	// PolicyAffinity is route.Affinity (llm-d's sticky-until-saturated default).
	PolicyAffinity = route.FamilyLLMDAffinity
	// PolicyLoad is route.Scorer without the prefix (llm-d's load-only scheduling).
	PolicyLoad = route.FamilyLLMDLoad
	// PolicyLeastLoaded is route.LeastLoaded: the fewest prompt tokens in flight.
	PolicyLeastLoaded = route.FamilyLeastLoaded
)

// loadAware are the policies picked by a route policy over the tracked load.
var loadAware = []string{PolicyCost, PolicyScorer, PolicyAffinity, PolicyLoad, PolicyLeastLoaded}

// policyAliases are the old names of the load-aware policies.
var policyAliases = map[string]string{"cost": PolicyCost, "scorer": PolicyScorer}

// canonicalPolicy returns the policy named name (an old name resolved), or false.
func canonicalPolicy(name string) (string, bool) {
	if a, ok := policyAliases[name]; ok {
		name = a
	}
	switch name {
	case PolicyLongestPrefix, PolicyRoundRobin, PolicyRandom:
		return name, true
	}
	return name, slices.Contains(loadAware, name)
}

// RoutingConfig configures the load-aware policies (config key "routing"). Zero fields
// take their defaults.
type RoutingConfig struct {
	// OverlapWeight is dynamo-cost's weight of a prefill block against a decode block
	// (default 1, Dynamo's), Temperature its softmax temperature (default 0: the
	// least cost).
	OverlapWeight float64 `json:"overlap_weight,omitempty"`
	Temperature   float64 `json:"temperature,omitempty"`
	// PrefixWeight, KVWeight and QueueWeight are llmd-scorer's (defaults 2, 1, 1,
	// llm-d's).
	PrefixWeight float64 `json:"prefix_weight,omitempty"`
	KVWeight     float64 `json:"kv_weight,omitempty"`
	QueueWeight  float64 `json:"queue_weight,omitempty"`
	// AffinityThreshold, PeakPrefillThroughput (tokens/s) and MaxTTFTPenaltyMs are
	// llmd-affinity's (defaults 0.8, 15,928 and 18,000, llm-d's).
	AffinityThreshold     float64 `json:"affinity_threshold,omitempty"`
	PeakPrefillThroughput float64 `json:"peak_prefill_throughput,omitempty"`
	MaxTTFTPenaltyMs      float64 `json:"max_ttft_penalty_ms,omitempty"`
	// MaxInFlight bounds the routed requests the server tracks (default 1,048,576).
	MaxInFlight int `json:"max_in_flight,omitempty"`
	// InFlightTTL forgets a routed request that no finished report ended (default
	// 10m): a lost report must not count against a worker forever.
	InFlightTTL Duration `json:"in_flight_ttl,omitempty"`
	// MaxTrackedBlocks bounds the block hashes kept across the routed requests
	// (default 1,048,576, about 40 MiB; route.TrackerConfig.MaxBlocks): past it a
	// request's load counts by its number of blocks, unshared.
	MaxTrackedBlocks int `json:"max_tracked_blocks,omitempty"`
	// MaxClientInFlight, MaxClientIDBytes and MaxClientWorkerBlocks bound what one
	// client (its identity, or its source address without authentication) has
	// tracked: requests (default 65,536), the bytes of their ids (default 16 MiB) and
	// the blocks they count against one worker (default 16,384). Past one, a pick or
	// routed request is refused with 429 (requestid.go).
	MaxClientInFlight     int `json:"max_client_in_flight,omitempty"`
	MaxClientIDBytes      int `json:"max_client_id_bytes,omitempty"`
	MaxClientWorkerBlocks int `json:"max_client_worker_blocks,omitempty"`
}

func (c RoutingConfig) params() route.Params {
	return route.Params{OverlapWeight: c.OverlapWeight, Temperature: c.Temperature,
		PrefixWeight: c.PrefixWeight, KVWeight: c.KVWeight, QueueWeight: c.QueueWeight,
		Affinity: route.Affinity{Threshold: c.AffinityThreshold, PeakPrefillThroughput: c.PeakPrefillThroughput,
			MaxTTFTPenaltyMs: c.MaxTTFTPenaltyMs}}
}

// MaxRequestIDBytes bounds a request id.
const MaxRequestIDBytes = 256

// routing is the server's load-aware picking: the policies and the load it tracks.
// Safe for concurrent use: the policies are values and the tracker locks itself.
type routing struct {
	policies map[string]route.Policy // by canonical name
	// tracker's keys are trackKey(owner, id) (requestid.go).
	tracker *route.Tracker[string]
	clients *clientTracking
	share   *loadShare // nil: the load is this replica's alone
}

func newRouting(c RoutingConfig, now func() time.Time) (*routing, error) {
	r := &routing{policies: map[string]route.Policy{}}
	for _, name := range append([]string{PolicyLongestPrefix}, loadAware...) {
		// serve reads the exact index: exact knowledge.
		p, err := route.New(route.Row{Family: name, Knowledge: route.Exact}, c.params())
		if err != nil {
			return nil, fmt.Errorf("routing: %w", err)
		}
		r.policies[name] = p
	}
	tr, err := route.NewTracker[string](route.TrackerConfig{MaxInFlight: c.MaxInFlight, TTL: time.Duration(c.InFlightTTL), Now: now,
		MaxBlocks: c.MaxTrackedBlocks})
	if err != nil {
		return nil, fmt.Errorf("routing: %w", err)
	}
	if r.clients, err = newClientTracking(c); err != nil {
		return nil, err
	}
	tr.OnDrop(r.clients.give)
	r.tracker = tr
	return r, nil
}

// WorkerLoad is the load of one worker a caller may send with a match request
// ("load": {WORKER: {...}}): what its own router knows, or what the engine reports.
// Given fields replace the server's tracked ones for that worker.
type WorkerLoad struct {
	// Requests and Tokens: requests in flight on the worker and their prompt tokens.
	Requests *int   `json:"requests,omitempty"`
	Tokens   *int64 `json:"tokens,omitempty"`
	// PrefillTokens: prompt tokens still to prefill; ActiveBlocks: KV blocks of the
	// requests in flight.
	PrefillTokens *int64 `json:"prefill_tokens,omitempty"`
	ActiveBlocks  *int64 `json:"active_blocks,omitempty"`
	// Waiting: requests queued at the engine; KVUtil: its KV cache use in [0, 1].
	Waiting *int     `json:"waiting,omitempty"`
	KVUtil  *float64 `json:"kv_util,omitempty"`
}

// maxLoadValue bounds every count a caller sends.
const maxLoadValue = 1 << 40

func (l *WorkerLoad) check() error {
	for _, v := range []*int64{l.Tokens, l.PrefillTokens, l.ActiveBlocks} {
		if v != nil && (*v < 0 || *v > maxLoadValue) {
			return fmt.Errorf("counts must be in 0..%d", int64(maxLoadValue))
		}
	}
	for _, v := range []*int{l.Requests, l.Waiting} {
		if v != nil && (*v < 0 || *v > 1<<30) {
			return fmt.Errorf("counts must be in 0..%d", 1<<30)
		}
	}
	if l.KVUtil != nil && !(*l.KVUtil >= 0 && *l.KVUtil <= 1) {
		return errors.New("kv_util must be in [0, 1]")
	}
	return nil
}

// apply lays the caller's fields over the tracked load.
func (l *WorkerLoad) apply(dst *route.Load) {
	if l == nil {
		return
	}
	if l.Requests != nil {
		dst.Requests = *l.Requests
	}
	if l.Tokens != nil {
		dst.Tokens = *l.Tokens
	}
	if l.PrefillTokens != nil {
		dst.PrefillTokens = *l.PrefillTokens
	}
	if l.ActiveBlocks != nil {
		dst.ActiveBlocks = *l.ActiveBlocks
	}
	if l.Waiting != nil {
		dst.Waiting = *l.Waiting
	}
	if l.KVUtil != nil {
		dst.KVUtil = *l.KVUtil
	}
}

// decodeLoads reads a request's "load" object (raw JSON, strict: unknown fields are
// errors, and so is a worker given null); the pipeline checks the values (checkLoads).
func decodeLoads(raw []byte) (map[string]*WorkerLoad, error) {
	if raw == nil || bytes.Equal(raw, []byte("null")) {
		return nil, nil
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	var loads map[string]*WorkerLoad
	if err := dec.Decode(&loads); err != nil {
		return nil, fmt.Errorf("load: %v", err)
	}
	for w, l := range loads {
		if l == nil {
			return nil, fmt.Errorf("load: worker %q: want an object", w)
		}
	}
	return loads, nil
}

// loadPick picks with a load-aware policy among the model's pickable workers: each
// worker's overlap is its weighted score (blocks, each at its tier's weight), its load
// what the server tracks with the caller's fields laid over. nil when no worker may be
// picked. Its working memory is o.scratch (a fresh one when nil); only the answer,
// the Pick and its reason, is allocated.
func (s *Server) loadPick(m *model, policy string, matches []Match, o pickOpts) *Pick {
	ps := o.scratch
	if ps == nil {
		ps = new(pickScratch)
	}
	k := s.loadChoose(m, policy, matches, o, ps)
	if k < 0 {
		return nil
	}
	pick := &Pick{Worker: ps.cands[k], Policy: policy, Reason: reasonFor(policy, ps.cs[k])}
	if mt := ps.byWorker[ps.cands[k]]; mt != nil {
		pick.Score, pick.Weighted = mt.Score, mt.Weighted
	}
	clear(ps.byWorker) // it points into matches, the answer's: keep none in the pool
	return pick
}

// pickScratch is a load-aware pick's working memory, one per request (matchScratch):
// once grown to the fleet, a pick allocates none of it.
type pickScratch struct {
	cands    []string          // the pickable workers, in id order
	byWorker map[string]*Match // the matches by worker, cleared after each pick
	overlaps []int             // cands[i]'s overlap under the policy
	cs       []route.Candidate // cands[i] as the policy sees it
}

// loadChoose fills ps for a load-aware pick and returns the index in ps.cands of the
// worker policy picks, -1 when no worker may be picked.
func (s *Server) loadChoose(m *model, policy string, matches []Match, o pickOpts, ps *pickScratch) int {
	ps.cands = s.candidates(m, matches, o.loads, ps.cands[:0])
	if len(ps.cands) == 0 {
		return -1
	}
	if ps.byWorker == nil {
		ps.byWorker = make(map[string]*Match, len(matches))
	}
	clear(ps.byWorker)
	for i := range matches {
		ps.byWorker[matches[i].Worker] = &matches[i]
	}
	ps.overlaps = ps.overlaps[:0]
	for _, w := range ps.cands {
		overlap := 0
		if mt := ps.byWorker[w]; mt != nil {
			overlap = overlapOf(policy, mt.Weighted)
		}
		ps.overlaps = append(ps.overlaps, overlap)
	}
	req := route.Request{Tokens: o.tokens, BlockSize: m.blockSize, Blocks: o.blocks}
	ps.cs = s.routing.tracker.Candidates(ps.cands, req, ps.overlaps, ps.cs)
	for i, w := range ps.cands {
		o.loads[w].apply(&ps.cs[i].Load)
	}
	return s.routing.policies[policy].Pick(req, ps.cs, tieBreak(policy, o.blocks))
}

// weightedScale orders longest-prefix's weighted scores to 1/1024 of a block: a host
// block at weight 0.75 beats none, and the order of fractional scores is kept (the
// zero-time sim scales them alike). The other policies read whole blocks.
const weightedScale = 1024

// overlapOf is a worker's Candidate.Overlap under policy, from its weighted score.
func overlapOf(policy string, weighted float64) int {
	if policy == PolicyLongestPrefix {
		return int(math.Round(weighted * weightedScale))
	}
	return int(math.Floor(weighted + 1e-9))
}

// tieBreak is the random number a policy breaks ties with. For longest-prefix it is
// the prompt's own hash: equal prompts get equal picks (a retried request goes where
// it went, and HTTP and gRPC answer alike), different prompts spread uniformly over
// the tied workers; the load-aware policies draw.
func tieBreak(policy string, blocks []uint64) uint64 {
	if policy != PolicyLongestPrefix || len(blocks) == 0 {
		return rand.Uint64()
	}
	h := uint64(len(blocks))
	for _, b := range blocks {
		h = hash.Next(h, b)
	}
	return h
}

func reasonFor(policy string, c route.Candidate) string {
	switch policy {
	case PolicyLongestPrefix:
		if c.Overlap > 0 {
			return "longest cached prefix"
		}
		return "no cached prefix: fewest requests in flight"
	case PolicyScorer, PolicyLoad:
		return fmt.Sprintf("highest score: %d cached blocks, %d waiting, KV %.0f%% used", c.Overlap, c.Load.Waiting, 100*c.Load.KVUtil)
	case PolicyAffinity:
		return fmt.Sprintf("sticky until saturated: %d cached blocks, %d uncached tokens in flight", c.Overlap, c.Load.UncachedTokens)
	case PolicyLeastLoaded:
		return fmt.Sprintf("least loaded: %d prompt tokens in flight", c.Load.Tokens)
	}
	return fmt.Sprintf("least cost: %d cached blocks, %d prefill tokens and %d active blocks in flight", c.Overlap, c.Load.PrefillTokens, c.Load.ActiveBlocks)
}

// pickOpts are what a match request asks of its pick beyond the policy (the pipeline
// fills them, match.go).
type pickOpts struct {
	track  bool     // "pick": true: count the pick as routed
	id     string   // its request id ("": make one up)
	owner  string   // the caller's identity (requestid.go)
	tokens int      // the prompt's tokens
	blocks []uint64 // the prompt's block hashes (the query)
	loads  map[string]*WorkerLoad
	// scratch is the request's memory for a load-aware pick (nil: a fresh one).
	scratch *pickScratch
}

// choose makes a match request's pick: with a load-aware policy or the others', and,
// when asked, counts it as routed under its request id.
func (s *Server) choose(m *model, policy string, matches []Match, o pickOpts) (*Pick, error) {
	var p *Pick
	if policy == PolicyLongestPrefix || slices.Contains(loadAware, policy) {
		p = s.loadPick(m, policy, matches, o)
	} else {
		p = s.pick(m, policy, matches)
	}
	if p == nil || !o.track {
		return p, nil
	}
	id, err := s.track(p, o, m)
	if err != nil {
		return nil, err
	}
	p.RequestID = id
	return p, nil
}

// trackRouted counts a request the caller routed itself (POST /v1/routed with a
// request_id) against its worker, with the prefix the worker holds before it.
func (s *Server) trackRouted(ctx context.Context, m *model, ns, worker, id string, q []uint64, tokens int) error {
	key := trackKey(ownerOf(ctx), id)
	found, err := s.eng.FindMatchesIn(ctx, ns, q, nil)
	if err != nil {
		return err
	}
	cached := 0
	for i := range found {
		if found[i].Worker == worker {
			cached = int(math.Floor(found[i].Weighted(s.weights)+1e-9)) * m.blockSize
		}
	}
	req := route.Request{Tokens: tokens, BlockSize: m.blockSize, Blocks: q}
	return s.routing.routed(key, worker, req, min(cached, tokens))
}

// candidates are the model's pickable workers: its eligible subscribed workers and its
// approximate ones, as the other policies' fallback takes them; with an index fed by
// another process, which alone knows the workers, also the ones the query matched and
// the ones the caller sent load for. In id order, appended to out.
func (s *Server) candidates(m *model, matches []Match, loads map[string]*WorkerLoad, out []string) []string {
	for _, sub := range m.subs.All() {
		if eligible(sub.State()) {
			out = append(out, sub.Worker())
		}
	}
	for w := range m.approx.Keys() {
		out = append(out, w)
	}
	if s.external {
		for i := range matches {
			out = append(out, matches[i].Worker)
		}
		for w := range loads {
			out = append(out, w)
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// track counts a pick as routed when the caller asked for it ("pick": true), under the
// caller's request id or a new one, and returns the id ("" when not tracked).
func (s *Server) track(pick *Pick, o pickOpts, m *model) (string, error) {
	id := o.id
	if id == "" {
		id = newRequestID()
	}
	cached := int(math.Floor(pick.Weighted+1e-9)) * m.blockSize
	req := route.Request{Tokens: o.tokens, BlockSize: m.blockSize, Blocks: o.blocks}
	if err := s.routing.routed(trackKey(o.owner, id), pick.Worker, req, cached); err != nil {
		return "", err
	}
	return id, nil
}

// checkRequestID bounds a caller's request id.
func checkRequestID(id string) error {
	if len(id) > MaxRequestIDBytes {
		return fmt.Errorf("request_id of %d bytes exceeds %d", len(id), MaxRequestIDBytes)
	}
	return nil
}

// FinishedRequest is the body of POST /v1/finished: a request routed with "pick": true
// (or POST /v1/routed with a request_id) got its first token (FirstToken) or is done
// (default), so its load leaves its worker.
type FinishedRequest struct {
	RequestID  string `json:"request_id"`
	FirstToken bool   `json:"first_token,omitempty"`
}

// FinishedResponse is the answer of POST /v1/finished.
type FinishedResponse struct {
	RequestID string `json:"request_id"`
	// Known says the request was in flight (false: never routed, already finished,
	// or forgotten after routing.in_flight_ttl).
	Known bool `json:"known"`
}

func (s *Server) handleFinished(w http.ResponseWriter, r *http.Request) {
	sc := scratchPool.Get().(*matchScratch)
	defer sc.release()
	sc.body.Reset()
	if !s.readBody(w, r, &sc.body) {
		return
	}
	dec := json.NewDecoder(bytes.NewReader(sc.body.Bytes()))
	dec.DisallowUnknownFields()
	var req FinishedRequest
	if err := dec.Decode(&req); err != nil || dec.More() {
		writeError(w, http.StatusBadRequest, "bad_json", "invalid request: want {\"request_id\": ID, \"first_token\": false}")
		return
	}
	known, e := s.finished(r.Context(), req.RequestID, req.FirstToken)
	if e != nil {
		writeAPIError(w, e)
		return
	}
	writeJSON(w, http.StatusOK, FinishedResponse{RequestID: req.RequestID, Known: known})
}

// finished checks and applies a finished (or first-token) report, HTTP and gRPC alike:
// known says the request was in flight.
func (s *Server) finished(ctx context.Context, id string, firstToken bool) (known bool, e *apiError) {
	if id == "" {
		return false, badRequest("bad_request_id", errors.New("request_id is required"))
	}
	if err := checkRequestID(id); err != nil {
		return false, badRequest("bad_request_id", err)
	}
	key := trackKey(ownerOf(ctx), id)
	if firstToken {
		known = s.routing.tracker.FirstToken(key)
	} else {
		known = s.routing.tracker.Finished(key)
	}
	if known {
		s.routing.share.finished(key, firstToken) // only this replica's own requests
	}
	return known, nil
}
