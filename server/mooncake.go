package server

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/kvindex/kvindex/engine"
	"github.com/kvindex/kvindex/hash"
	"github.com/kvindex/kvindex/kvevents"
)

// The Mooncake indexer API (kvcache-ai/Mooncake RFC #1403, as its Conductor's design
// document docs/source/design/conductor/indexer-api-design.md spells it), served beside
// /v1/match from the same index, for routers that speak it (Mooncake Conductor's,
// NVIDIA Dynamo's standalone indexer):
//
//	POST /register       one data-parallel rank of an instance: its KV-event endpoint
//	                     becomes an engine (source "mooncake") whose worker id is
//	                     "<instance_id>#dp<dp_rank>"; its ranks fold into one instance
//	POST /unregister     an instance's ranks (all, or dp_rank's) leave, with their blocks
//	POST /query          token_ids -> per tenant, per instance: the longest prefix hit
//	                     and its parts per medium and per rank, in tokens
//	POST /query_by_hash  the same from the prompt's per-block hashes
//
// Ranks are first-class: an instance's workers are its ranks, whatever made them (one
// /register per rank, or an engine with dp_ranks whose workers are "<worker>#dp<r>"),
// and an answer gives the instance once, with "DP" holding each rank's hit.
//
// Where kvindex's index and the RFC part:
//
//   - The media are kvindex's three tiers, named as the RFC's example names them:
//     "GPU" (device), "CPU" (host), "DISK" (disk), each the leading tokens held on
//     that medium or a faster one, so GPU <= CPU <= DISK == longest_matched (Dynamo's
//     reading of the RFC; the index keeps no prefix length per medium alone).
//   - /query_by_hash takes per-block content hashes, the RFC's "local block hash"
//     (XXH3-64, seed 1337, of each block's token ids as little-endian uint32: package
//     hash's Content, Dynamo's LocalBlockHash), as "block_hashes" (Dynamo's name).
//     The Conductor document now sends rolling sequence hashes, "seq_hashes" (its
//     example) or "block_hash" (its alias for them, kept from the first draft):
//     seq_hash[0] = local[0], seq_hash[i] = XXH3-64(LE64(seq_hash[i-1]) ||
//     LE64(local[i]), seed 1337), package hash's Next: SPEC's prefix chain. On an
//     index that runs it (index.spec_chain) they are the index's own per-position
//     prefix hashes and a list of any length is answered (engine's
//     FindMatchesByPrefixIn). The default keyed chain is the engine's secret, and a
//     rolling hash does not reveal its blocks' contents; there a query of one
//     rolling hash (the first block's is its content hash) is answered, and a longer
//     one is refused with a 400 that says why and what to send instead, rather than
//     read as content hashes that would match at most the first block.
//   - The document's other keys are accepted: "model_name" (the model, as "model" or
//     register's "modelname"; both given must agree) and "routing_group" (a label the
//     index does not need).
//   - A publisher's "additionalsalt" S (a quantization, a model revision) makes its
//     blocks a model of their own, "MODEL@S" in kvindex's other APIs, so that they
//     never match another salt's; a query's "cache_salt" S selects that model when it
//     is served, and otherwise, as a request's cache_salt on /v1/match, the namespace
//     vLLM's events give blocks salted per request. "type" is vLLM or SGLang (their
//     ZeroMQ events are what the subscribers read); Mooncake's master publisher is
//     not followed.
//   - A tenant is a label of the instances registered under it (default "default";
//     every engine of the configuration, the admin API and discovery is the default
//     tenant's): a query answers for its tenant's instances only.

// SourceMooncake is the source of the engines the Mooncake API registers.
const SourceMooncake = "mooncake"

const (
	defaultTenant = "default"
	maxIDLen      = 256 // instance and tenant ids
)

// idString is an id that JSON may give as a string or a number (Dynamo's instance ids
// are integers).
type idString string

func (s *idString) UnmarshalJSON(b []byte) error {
	b = bytes.TrimSpace(b)
	if len(b) > 0 && b[0] == '"' {
		var v string
		if err := decodeStrict(b, &v); err != nil {
			return err
		}
		*s = idString(v)
		return nil
	}
	if _, err := strconv.ParseUint(string(b), 10, 64); err != nil {
		return fmt.Errorf("an id must be a string or an unsigned integer, not %.32s", b)
	}
	*s = idString(b)
	return nil
}

// checkID checks an instance or tenant id: present, bounded, printable, and without
// the characters kvindex's worker ids and the unregister answer reserve.
func checkID(field, id string) error {
	if id == "" {
		return fmt.Errorf("%s is required", field)
	}
	if len(id) > maxIDLen {
		return fmt.Errorf("%s is longer than %d bytes", field, maxIDLen)
	}
	for i := 0; i < len(id); i++ {
		if c := id[i]; c < 0x20 || c == 0x7f || c == '#' || c == '|' {
			return fmt.Errorf("%s %.64q: control bytes, '#' and '|' are not allowed", field, id)
		}
	}
	return nil
}

// MooncakeInstance names one publisher instance, as /register and /unregister both
// carry it.
type MooncakeInstance struct {
	// Type is the publisher: "vLLM" (default) or "SGLang".
	Type string `json:"type,omitempty"`
	// ModelName is the model ("modelname" on the wire; "model_name", the document's
	// other spelling, is ModelName2); optional while the server serves one model.
	ModelName    string `json:"modelname,omitempty"`
	ModelName2   string `json:"model_name,omitempty"`
	RoutingGroup string `json:"routing_group,omitempty"`
	// LoraName is informational: each event names its own adapter.
	LoraName   string   `json:"lora_name,omitempty"`
	TenantID   string   `json:"tenant_id,omitempty"`
	InstanceID idString `json:"instance_id"`
	// BlockSize must be the model's; 0: the model's, or the configured default.
	BlockSize int `json:"block_size,omitempty"`
	// DPRank is the rank this endpoint publishes (default 0).
	DPRank *int `json:"dp_rank,omitempty"`
}

// MooncakeRegister is the body of POST /register.
type MooncakeRegister struct {
	MooncakeInstance
	Endpoint       string `json:"endpoint"`
	ReplayEndpoint string `json:"replay_endpoint,omitempty"`
	AdditionalSalt string `json:"additionalsalt,omitempty"`
	// AdditionalSalt2 is Dynamo's spelling of AdditionalSalt.
	AdditionalSalt2 string `json:"additional_salt,omitempty"`
}

// MooncakeUnregister is the body of POST /unregister: the instance's ranks (DPRank's
// alone when given) under TenantID. The other fields of the RFC's body are accepted
// and not needed.
type MooncakeUnregister struct {
	MooncakeInstance
}

// MooncakeQuery is the body of POST /query and /query_by_hash.
type MooncakeQuery struct {
	Model    string `json:"model"`
	LoraName string `json:"lora_name,omitempty"`
	// LoraID is the RFC's deprecated alternative to LoraName (vLLM's lora_id
	// namespace).
	LoraID *int64 `json:"lora_id,omitempty"`
	// TokenIDs (/query) are the prompt's tokens; only full blocks count.
	TokenIDs []uint32 `json:"token_ids,omitempty"`
	// BlockHashes (/query_by_hash) are the prompt's per-block content hashes.
	BlockHashes []U64 `json:"block_hashes,omitempty"`
	// SeqHashes (the Conductor document's) and BlockHash (its alias for them) are
	// rolling sequence hashes: answered at every length on the spec chain, for one
	// block otherwise (see above).
	BlockHash []U64 `json:"block_hash,omitempty"`
	SeqHashes []U64 `json:"seq_hashes,omitempty"`
	// ModelName is the document's other name of Model; RoutingGroup is accepted and
	// not needed.
	ModelName    string `json:"model_name,omitempty"`
	RoutingGroup string `json:"routing_group,omitempty"`
	TenantID     string `json:"tenant_id,omitempty"`
	// InstanceID, when set, answers for that instance alone.
	InstanceID idString `json:"instance_id,omitempty"`
	// BlockSize must be the model's (0: the model's).
	BlockSize int    `json:"block_size,omitempty"`
	CacheSalt string `json:"cache_salt,omitempty"`
	// Medium (the RFC's first draft) lists the media to answer for: GPU, CPU, DISK
	// (or L1, L2, L3); absent: all.
	Medium []string `json:"medium,omitempty"`
}

// MooncakeHits is one instance's answer, in tokens. Media left out of a query's
// "medium" are omitted.
type MooncakeHits struct {
	// LongestMatched is the longest prefix hit over the instance's media and ranks.
	LongestMatched int  `json:"longest_matched"`
	GPU            *int `json:"GPU,omitempty"`
	CPU            *int `json:"CPU,omitempty"`
	DISK           *int `json:"DISK,omitempty"`
	// DP gives each rank's hit (every tier), by rank.
	DP map[string]int `json:"DP"`
}

// mooncakeModel resolves a Mooncake request's model and checks its block size.
func (s *Server) mooncakeModel(name string, blockSize int) (*model, error) {
	m, err := s.resolveModel(name)
	if err != nil {
		return nil, badRequest("unknown_model", err) // /v1/match's code
	}
	if blockSize != 0 && blockSize != m.blockSize {
		return nil, badRequest("bad_query", fmt.Errorf("block_size %d: model %q is indexed in blocks of %d tokens", blockSize, m.name, m.blockSize))
	}
	return m, nil
}

func (s *Server) handleMooncakeRegister(w http.ResponseWriter, r *http.Request) {
	var req MooncakeRegister
	if !s.readStrict(w, r, &req) {
		return
	}
	bad := func(format string, args ...any) {
		writeError(w, http.StatusBadRequest, "bad_engine", format, args...)
	}
	inst, tenant := string(req.InstanceID), cmp.Or(req.TenantID, defaultTenant)
	if err := errors.Join(checkID("instance_id", inst), checkID("tenant_id", tenant)); err != nil {
		bad("%v", err)
		return
	}
	switch strings.ToLower(req.Type) {
	case "", "vllm", "sglang":
	default:
		bad("type %q: kvindex follows vLLM and SGLang publishers", req.Type)
		return
	}
	if req.Endpoint == "" {
		bad("endpoint is required")
		return
	}
	modelName, err := oneName("modelname", req.ModelName, "model_name", req.ModelName2)
	if err != nil {
		bad("%v", err)
		return
	}
	bs := req.BlockSize
	m, err := s.resolveModel(modelName)
	switch {
	case err == nil:
		modelName = m.name
	case modelName == "":
		bad("modelname is required: %v", err)
		return
	}
	if salt := cmp.Or(req.AdditionalSalt, req.AdditionalSalt2); salt != "" {
		if err := checkID("additionalsalt", salt); err != nil {
			bad("%v", err)
			return
		}
		modelName += "@" + salt
		m, _ = s.resolveModel(modelName)
	}
	if m != nil && bs == 0 {
		bs = m.blockSize
	}
	rank := 0
	if req.DPRank != nil {
		rank = *req.DPRank
	}
	e := EngineConfig{Endpoint: req.Endpoint, ReplayEndpoint: req.ReplayEndpoint, Worker: inst, Model: modelName,
		BlockSize: bs, DPRank: &rank}
	if _, _, err := s.addEngine(SourceMooncake, tenant, e); err != nil {
		s.engineError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]string{"status": "registered successfully", "instance_id": inst})
}

func (s *Server) handleMooncakeUnregister(w http.ResponseWriter, r *http.Request) {
	var req MooncakeUnregister
	if !s.readStrict(w, r, &req) {
		return
	}
	inst, tenant := string(req.InstanceID), cmp.Or(req.TenantID, defaultTenant)
	if err := errors.Join(checkID("instance_id", inst), checkID("tenant_id", tenant)); err != nil {
		writeError(w, http.StatusBadRequest, "bad_engine", "%v", err)
		return
	}
	removed, err := s.unregisterInstance(inst, tenant, req.DPRank)
	if err != nil {
		s.engineError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"status": "unregistered successfully", "removed_instances": removed})
}

// unregisterInstance removes an instance's ranks (rank's alone when given) that the
// Mooncake API registered under tenant, and returns them as "instance|tenant|rank".
func (s *Server) unregisterInstance(inst, tenant string, rank *int) ([]string, error) {
	s.engMu.Lock()
	defer s.engMu.Unlock()
	if s.closed {
		return nil, ErrServerState
	}
	var gone []*engineEntry
	var removed []string
	other := ""
	for _, en := range s.sortedEntries() {
		for _, p := range en.pubs {
			if p.instance != inst || (rank != nil && p.cfg.DPRank != *rank) {
				continue
			}
			if en.source != SourceMooncake || en.tenant != tenant {
				other = en.source
				continue
			}
			if len(gone) == 0 || gone[len(gone)-1] != en {
				gone = append(gone, en)
			}
			removed = append(removed, fmt.Sprintf("%s|%s|%d", inst, tenant, p.cfg.DPRank))
		}
	}
	if len(gone) == 0 {
		if other != "" {
			return nil, fmt.Errorf("%w: instance %q comes from %s, not /register (or under another tenant)", ErrEngineSource, inst, describeSource(other))
		}
		return nil, fmt.Errorf("%w: no instance %q (tenant %q, rank %s) registered", ErrUnknownEngine, inst, tenant, rankText(rank))
	}
	s.removeLocked(gone)
	s.noteChange(SourceMooncake, "removed", len(gone))
	s.log.Info("instance unregistered", "instance", inst, "tenant", tenant, "ranks", len(removed))
	slices.Sort(removed)
	return removed, nil
}

func rankText(r *int) string {
	if r == nil {
		return "any"
	}
	return strconv.Itoa(*r)
}

// readStrict reads a body into v with decodeStrict, answering errors itself.
func (s *Server) readStrict(w http.ResponseWriter, r *http.Request, v any) bool {
	var body bytes.Buffer
	if !s.readBody(w, r, &body) {
		return false
	}
	if err := decodeStrict(body.Bytes(), v); err != nil {
		writeError(w, http.StatusBadRequest, "bad_json", "invalid request: %v", err)
		return false
	}
	return true
}

// The media of an answer, by the names a query's "medium" may use.
var mooncakeMedia = map[string]engine.Tier{"GPU": engine.TierDevice, "L1": engine.TierDevice,
	"CPU": engine.TierHost, "L2": engine.TierHost, "DISK": engine.TierDisk, "L3": engine.TierDisk}

func (s *Server) handleMooncakeQuery(byHash bool) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		var req MooncakeQuery
		if !s.readStrict(w, r, &req) {
			return
		}
		resp, code, err := s.mooncakeQuery(r.Context(), &req, byHash)
		if err != nil {
			writeError(w, code, mooncakeCode(code, err), "%v", err)
			return
		}
		writeJSON(w, http.StatusOK, resp)
	}
}

// mooncakeCode is an error's code: "unavailable" for an index that cannot answer
// (closed, failed, timed out), the engine step's own code for its other errors.
func mooncakeCode(status int, err error) string {
	var ae *apiError
	switch {
	case status == http.StatusServiceUnavailable:
		return "unavailable"
	case errors.Is(err, errQueryTooLong):
		return "query_too_long"
	case errors.As(err, &ae):
		return ae.code
	}
	return "bad_query"
}

var errQueryTooLong = errors.New("query too long")

// mooncakeQuery answers /query (byHash false) or /query_by_hash; on error it returns
// the HTTP status.
func (s *Server) mooncakeQuery(ctx context.Context, req *MooncakeQuery, byHash bool) (map[string]map[string]*MooncakeHits, int, error) {
	badReq := func(format string, args ...any) (map[string]map[string]*MooncakeHits, int, error) {
		return nil, http.StatusBadRequest, fmt.Errorf(format, args...)
	}
	tenant := cmp.Or(req.TenantID, defaultTenant)
	if err := checkID("tenant_id", tenant); err != nil {
		return badReq("%v", err)
	}
	var m *model
	var err error
	if req.Model, err = oneName("model", req.Model, "model_name", req.ModelName); err != nil {
		return badReq("%v", err)
	}
	salted := *req
	if req.CacheSalt != "" {
		// A publisher's additional salt made a model of its own.
		if sm, serr := s.mooncakeModel(req.Model+"@"+req.CacheSalt, req.BlockSize); serr == nil && req.Model != "" {
			m, salted.CacheSalt = sm, ""
		}
	}
	if m == nil {
		if m, err = s.mooncakeModel(req.Model, req.BlockSize); err != nil {
			return nil, http.StatusBadRequest, err // its code: unknown_model or bad_query
		}
	}
	ns, err := mooncakeNamespace(m.name, &salted)
	if err != nil {
		return badReq("%v", err)
	}
	media := []engine.Tier{engine.TierDevice, engine.TierHost, engine.TierDisk}
	if req.Medium != nil {
		media = media[:0]
		for _, name := range req.Medium {
			t, ok := mooncakeMedia[strings.ToUpper(name)]
			if !ok {
				return badReq("medium %q: want GPU, CPU, DISK (or L1, L2, L3)", name)
			}
			media = append(media, t)
		}
	}
	var q []uint64
	rolling := false // q holds rolling prefix hashes
	switch {
	case !byHash:
		if req.BlockHashes != nil || req.BlockHash != nil || req.SeqHashes != nil {
			return badReq("/query takes token_ids; block hashes go to /query_by_hash")
		}
		if len(req.TokenIDs) == 0 {
			return badReq("token_ids is required: give the prompt's token ids")
		}
		if n := len(req.TokenIDs) / m.blockSize; n > s.cfg.MaxQueryBlocks {
			return nil, http.StatusBadRequest, fmt.Errorf("%w: %d blocks, at most %d", errQueryTooLong, n, s.cfg.MaxQueryBlocks)
		}
		if q, err = hash.Blocks(nil, req.TokenIDs, m.blockSize); err != nil {
			return nil, http.StatusInternalServerError, err
		}
	case req.TokenIDs != nil:
		return badReq("/query_by_hash takes block_hashes or seq_hashes; token_ids go to /query")
	case (req.SeqHashes != nil || req.BlockHash != nil) && req.BlockHashes != nil, req.SeqHashes != nil && req.BlockHash != nil:
		return badReq("give one of block_hashes (local hashes), seq_hashes and block_hash (rolling hashes)")
	case req.SeqHashes != nil || req.BlockHash != nil:
		if q, rolling, err = rollingQuery(req, s.cfg.MaxQueryBlocks, s.eng.SpecChain()); err != nil {
			return nil, http.StatusBadRequest, err
		}
	default:
		hs := req.BlockHashes
		if len(hs) == 0 {
			return badReq("block_hashes is required: give the prompt's block hashes")
		}
		if len(hs) > s.cfg.MaxQueryBlocks {
			return nil, http.StatusBadRequest, fmt.Errorf("%w: %d blocks, at most %d", errQueryTooLong, len(hs), s.cfg.MaxQueryBlocks)
		}
		q = make([]uint64, len(hs))
		for i, h := range hs {
			q[i] = uint64(h)
		}
	}
	var found []engine.Match
	if len(q) > 0 {
		qctx, cancel := context.WithTimeout(ctx, time.Duration(s.cfg.QueryTimeout))
		defer cancel()
		var e *apiError
		if found, e = s.findBy(qctx, ns, q, rolling, nil); e != nil { // the match pipeline's engine step (match.go)
			return nil, e.status, e
		}
		s.noteQuery(m, len(found) > 0)
		found = s.trustFound(ns, q, rolling, found)
	}
	return s.mooncakeAnswer(m, tenant, string(req.InstanceID), media, found), http.StatusOK, nil
}

// mooncakeNamespace is a Mooncake query's index namespace (lora_name or lora_id, and
// cache_salt, as vLLM's events name them).
func mooncakeNamespace(model string, req *MooncakeQuery) (string, error) {
	if req.LoraID == nil {
		return RequestNamespace(model, "", req.LoraName, req.CacheSalt)
	}
	if req.LoraName != "" {
		return "", errors.New("give lora_name or lora_id, not both")
	}
	ns := "lora_id=" + strconv.FormatInt(*req.LoraID, 10)
	if req.CacheSalt != "" {
		ns += ";" + kvevents.Namespace("", req.CacheSalt)
	}
	return RequestNamespace(model, ns, "", "")
}

// mooncakeAnswer folds the matches into the tenant's instances of model m (inst's
// alone when set): every served instance appears, each rank in DP, 0 when it matched
// nothing.
func (s *Server) mooncakeAnswer(m *model, tenant, inst string, media []engine.Tier, found []engine.Match) map[string]map[string]*MooncakeHits {
	f := s.fleet()
	out := map[string]*MooncakeHits{}
	fm, _ := f.models.Get(m.name)
	entry := func(worker string) (*MooncakeHits, string, bool) {
		fw := f.lookup(worker) // the fleet's index (fleetindex.go)
		ro := fw.rank
		if !fw.served() || ro.tenant != tenant || (inst != "" && ro.instance != inst) {
			return nil, "", false
		}
		h := out[ro.instance]
		if h == nil {
			h = &MooncakeHits{DP: map[string]int{}}
			for _, t := range media {
				zero := 0
				switch t {
				case engine.TierDevice:
					h.GPU = &zero
				case engine.TierHost:
					h.CPU = &zero
				case engine.TierDisk:
					h.DISK = &zero
				}
			}
			out[ro.instance] = h
		}
		rank := strconv.Itoa(ro.rank)
		if _, ok := h.DP[rank]; !ok {
			h.DP[rank] = 0
		}
		return h, rank, true
	}
	if fm != nil {
		for _, sub := range fm.subs.All() {
			entry(sub.Worker())
		}
		for w := range fm.approx.Keys() {
			entry(w)
		}
	}
	bs := m.blockSize
	for i := range found {
		mt := &found[i]
		h, rank, ok := entry(mt.Worker) // only a served worker's
		if !ok {
			continue
		}
		h.DP[rank] = max(h.DP[rank], mt.Score*bs)
		h.LongestMatched = max(h.LongestMatched, mt.Score*bs)
		for _, v := range []struct {
			p *int
			t engine.Tier
		}{{h.GPU, engine.TierDevice}, {h.CPU, engine.TierHost}, {h.DISK, engine.TierDisk}} {
			if v.p != nil {
				*v.p = max(*v.p, mt.Tiers[v.t]*bs)
			}
		}
	}
	return map[string]map[string]*MooncakeHits{tenant: out}
}

// oneName is the value of two fields that name the same thing (a model, under the
// document's two spellings): either, or both when they agree.
func oneName(f1, v1, f2, v2 string) (string, error) {
	if v1 != "" && v2 != "" && v1 != v2 {
		return "", fmt.Errorf("%s %q and %s %q differ: give one", f1, v1, f2, v2)
	}
	return cmp.Or(v1, v2), nil
}

// rollingQuery reads a query's rolling sequence hashes (seq_hashes, or block_hash, the
// document's alias), bounded by maxBlocks. On an index that runs SPEC's chain
// (specChain) they are its own prefix hashes and are answered as they are (rolling
// true: engine.FindMatchesByPrefixIn). Otherwise only the first block can be answered
// (its rolling hash is its content hash, rolling false), and a longer list is refused
// saying why: the keyed chain names positions by a secret, and a rolling hash cannot
// be turned back into each block's content; answering the first block alone would
// report every longer hit as one block.
func rollingQuery(req *MooncakeQuery, maxBlocks int, specChain bool) (q []uint64, rolling bool, err error) {
	field, hs := "seq_hashes", req.SeqHashes
	if hs == nil {
		field, hs = "block_hash", req.BlockHash
	}
	switch {
	case len(hs) == 0:
		return nil, false, fmt.Errorf("%s is empty: give the prompt's rolling hashes", field)
	case len(hs) > maxBlocks:
		return nil, false, fmt.Errorf("%w: %d blocks, at most %d", errQueryTooLong, len(hs), maxBlocks)
	case len(hs) > 1 && !specChain:
		return nil, false, fmt.Errorf("%s: %d rolling sequence hashes: this index names positions by its own keyed prefix chain (index.spec_chain is off), and a rolling hash does not reveal a block's content past the first block; run serve with index.spec_chain (SPEC's XXH3 chain, which these hashes are), or send block_hashes (the per-block local hashes: XXH3-64, seed 1337, of each block's token ids as little-endian uint32) or token_ids to /query", field, len(hs))
	}
	q = make([]uint64, len(hs))
	for i, h := range hs {
		q[i] = uint64(h)
	}
	return q, len(q) > 1, nil
}
