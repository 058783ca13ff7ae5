package server

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"sync/atomic"

	"github.com/kvindex/kvindex/internal/ptree"
	"github.com/kvindex/kvindex/subscriber"
)

// Engines that change at runtime. Every engine the server follows belongs to one
// source: SourceConfig (the configuration's engine list, replaced on reload),
// SourceAPI (POST and DELETE /v1/engines) or a discovery source (any other name, given
// to SetEngines). A source is authoritative over its engines: SetEngines
// makes a source's engines exactly a given list, AddEngine and RemoveEngine change
// SourceAPI's one at a time, and no source can take or drop another's.
//
// An engine is known by its key, its worker field or else its endpoint (with dp_ranks,
// the prefix of its ranks' "<worker>#dp<r>" ids); keys, worker ids and endpoints are
// unique across all sources, and every engine is checked against the others exactly as
// a configuration's engines are checked against each other.
//
// A change touches only the engines it names. An engine that is added gets one
// subscriber per rank, started at once when the server runs; one that is removed
// leaves the fleet handlers read first (it is no longer picked or listed), then its
// subscribers stop and its workers leave the index (blocks and predictions). A changed
// engine is removed, then added. Every other engine's subscriber keeps running: its
// events keep applying and its answers do not change.
//
// SetEngines costs O(engines served): it plans the source's engines against all the
// others and builds a new fleet. Replacing one engine of 2,048 took 47-71 ms of wall
// time and 4.2 MB on a loaded 2-core machine, applying 2,048 from nothing 110 ms
// (go test -run '^$' -bench BenchmarkSetEngines ./server/): fine for discovery and
// admin calls, not for a per-request path. AddEngine and RemoveEngine (the admin API,
// /register) change one engine against the claims kept as entries change and publish
// the previous fleet with it added or taken out (enginesinc.go): nothing formatted,
// planned or copied per served engine, the fleet's maps being persistent
// (internal/ptree), so that a change copies O(log n) nodes. An add and a remove
// allocate 120 times and 23 KB with 100 engines served, 135 times and 30 KB with
// 10,000, where cloning the maps allocated 42 KB and 3.3 MB (TestEngineAddCostFlat);
// the median process CPU time of an add is 12-17 µs with 100, 13-21 µs with 1,000
// and 17-29 µs with 10,000 engines, against 17-22, 37-69 and 276-368 µs when the maps
// were cloned (go test -run '^$' -bench BenchmarkEngineAdd -benchtime 500x ./server/,
// both builds in one session on a shared 2-core machine; under a load of 12 the
// 10,000 case reached 43-118 µs).
//
// Concurrency: engMu serialises every change, Start's launch of the subscribers and
// Shutdown's end of changes; it owns entries, runCtx, closed and the per-model query
// windows. Handlers never take it: they read the fleet, an immutable value a change
// publishes whole (one atomic pointer), so a request sees the engines before or after
// a change, never half of one. What they read of a worker comes from the fleet's read
// index, a Go map the fleet's first reader builds (fleetindex.go): a change stays
// O(log n) under engMu, a lookup costs a Go map's.

// The sources of engines besides discovery.
const (
	// SourceConfig is the configuration's engine list (Config.Engines).
	SourceConfig = "config"
	// SourceAPI is the admin API (POST and DELETE /v1/engines).
	SourceAPI = "api"
)

// ErrEngineExists is returned by AddEngine for a key, worker id or endpoint already
// served; ErrUnknownEngine by RemoveEngine for an engine that is not; ErrEngineSource
// by RemoveEngine for an engine another source owns.
var (
	ErrEngineExists  = errors.New("server: engine already served")
	ErrUnknownEngine = errors.New("server: no such engine")
	ErrEngineSource  = errors.New("server: engine belongs to another source")
)

// fleet is the set of served engines as handlers read it, published whole by each
// change and never modified after.
type fleet struct {
	// subs are the subscribed workers, in the order their engines were added (the
	// configuration's first, in its order), keyed by subKey.
	subs ptree.Map[uint64, *subscriber.Subscriber]
	// workers holds every worker: its subscriber or model, its instance and rank,
	// keyed by a seeded hash (worker ids are the clients'), in no order. Handlers
	// read it through idx.
	workers ptree.Hashed[fleetWorker]
	models  ptree.Map[string, *model]
	// approx maps each worker without events to its model (the listings').
	approx ptree.Hashed[*model]

	// idx is the read index of workers (fleetindex.go), nil until the first lookup
	// builds it; building is set by the reader that builds it.
	idx      atomic.Pointer[map[string]fleetWorker]
	building atomic.Bool
}

// rankOf is a worker's place in its instance: the Mooncake API folds an instance's
// data-parallel ranks into one answer.
type rankOf struct {
	instance, tenant string
	rank             int
}

// fleet returns the engines as of now.
func (s *Server) fleet() *fleet { return s.fl.Load() }

// worker returns the subscribed worker w (nil when none is).
func (f *fleet) worker(w string) *subscriber.Subscriber { return f.lookup(w).sub }

// approxOf returns the model of worker w without events (nil when w is not one).
func (f *fleet) approxOf(w string) *model { return f.lookup(w).approx }

// engineEntry is one served engine (owned by engMu).
type engineEntry struct {
	source string
	tenant string // the Mooncake API's tenant_id ("default" for every other source)
	key    string
	spec   EngineConfig // as given, its block size defaulted
	pubs   []publisher
	runs   []*subRun // the subscribed publishers' subscribers, in rank order
	seq    uint64    // order of addition: the fleet lists engines by it
}

// subRun is one subscriber and, once launched, its goroutine's stop and end.
type subRun struct {
	sub    *subscriber.Subscriber
	cancel context.CancelFunc // nil until launched
	done   chan struct{}      // closed when its Run returned
}

// EngineInfo is one entry of GET /v1/engines.
type EngineInfo struct {
	// Key is the engine's name in DELETE /v1/engines/{key}: its worker, or its
	// endpoint when it sets none.
	Key    string `json:"key"`
	Source string `json:"source"`
	// Workers are its worker ids (one per data-parallel rank).
	Workers []string     `json:"workers"`
	Engine  EngineConfig `json:"engine"`
}

// EngineChanges is what SetEngines (and a reload) did, by engine key.
type EngineChanges struct {
	Added     []string `json:"added"`
	Removed   []string `json:"removed"`
	Replaced  []string `json:"replaced"`
	Unchanged []string `json:"unchanged"`
	// Rejected lists the engines left out, each with the reason; a changed engine
	// whose new version is rejected keeps running as it was.
	Rejected []EngineRejection `json:"rejected"`
}

// EngineRejection is an engine a change left out, and why.
type EngineRejection struct {
	Key   string `json:"key"`
	Error string `json:"error"`
}

// Empty reports whether nothing changed and nothing was rejected.
func (c EngineChanges) Empty() bool {
	return len(c.Added)+len(c.Removed)+len(c.Replaced)+len(c.Rejected) == 0
}

// engineKey is an engine's key: its worker, else its endpoint; for one rank of an
// instance (DPRank), that rank's worker id.
func engineKey(e EngineConfig) string {
	if e.DPRank != nil && e.Worker != "" {
		return subscriber.WorkerID(e.Worker, *e.DPRank, true)
	}
	return cmp.Or(e.Worker, e.Endpoint)
}

// sameSpec reports whether two engine specs (block sizes defaulted) are the same
// engine: equal JSON encodings, so a nil and an empty list agree.
func sameSpec(a, b EngineConfig) bool {
	ja, err1 := json.Marshal(a)
	jb, err2 := json.Marshal(b)
	return err1 == nil && err2 == nil && string(ja) == string(jb)
}

// normalize returns e as the server keeps it: its block size defaulted.
func (s *Server) normalize(e EngineConfig) EngineConfig {
	if e.BlockSize == 0 {
		e.BlockSize = s.cfg.BlockSize
	}
	return e
}

// Engines lists the served engines, in the order they were added.
func (s *Server) Engines() []EngineInfo {
	s.engMu.Lock()
	defer s.engMu.Unlock()
	out := make([]EngineInfo, 0, len(s.entries))
	for _, en := range s.sortedEntries() {
		info := EngineInfo{Key: en.key, Source: en.source, Engine: en.spec, Workers: make([]string, 0, len(en.pubs))}
		for _, p := range en.pubs {
			info.Workers = append(info.Workers, p.cfg.Worker)
		}
		out = append(out, info)
	}
	return out
}

// sortedEntries returns the entries in the order of addition (engMu held).
func (s *Server) sortedEntries() []*engineEntry {
	out := slices.Collect(maps.Values(s.entries))
	slices.SortFunc(out, func(a, b *engineEntry) int { return cmp.Compare(a.seq, b.seq) })
	return out
}

// AddEngine starts following one more engine (source SourceAPI) and returns its
// worker ids. An engine with the same key and spec already added through the API is
// not an error (a retried request): its workers are returned with added false. Errors
// wrap ErrConfig (the engine is invalid, or conflicts with another: a worker id,
// endpoint or block size), ErrEngineExists (its key is served with another spec or by
// another source) or ErrServerState (after Shutdown).
func (s *Server) AddEngine(e EngineConfig) (workers []string, added bool, err error) {
	return s.addEngine(SourceAPI, defaultTenant, e)
}

// addEngine adds one engine of source (AddEngine, the Mooncake API's /register).
func (s *Server) addEngine(source, tenant string, e EngineConfig) (workers []string, added bool, err error) {
	e = s.normalize(e)
	key := engineKey(e)
	s.engMu.Lock()
	defer s.engMu.Unlock()
	if s.closed {
		return nil, false, ErrServerState
	}
	if en := s.entries[key]; en != nil {
		if en.source == source && en.tenant == tenant && sameSpec(en.spec, e) {
			return en.workers(), false, nil
		}
		return nil, false, fmt.Errorf("%w: engine %q is served (source %s) with another spec; remove it first", ErrEngineExists, key, en.source)
	}
	if err := s.cfg.RuntimeEngines.checkRuntime(e, len(s.entries)); err != nil {
		return nil, false, err
	}
	if source == SourceMooncake {
		// An instance's ranks belong to one registration source and tenant.
		if in, ok := s.claims.instances[e.Worker]; ok && (in.source != source || in.tenant != tenant) {
			return nil, false, fmt.Errorf("%w: instance %q is served by %s (tenant %q)", ErrEngineExists, e.Worker, describeSource(in.source), in.tenant)
		}
	}
	// Planned against the claims kept (enginesinc.go): nothing is claimed on failure.
	pubs, err := s.claims.planner(s).engine(e, 0, fmt.Sprintf("engine %q", key))
	if err != nil {
		return nil, false, err
	}
	en, err := s.newEntry(source, key, e, pubs, s.resume)
	if err != nil {
		s.claims.releasePlanned(pubs)
		return nil, false, err
	}
	en.tenant = tenant
	s.insertLocked(en)
	s.publishAddLocked(en)
	s.launchLocked(en)
	s.noteChange(source, "added", 1)
	s.log.Info("engine added", "engine", key, "source", source, "workers", len(en.pubs))
	return en.workers(), true, nil
}

// RemoveEngine stops following an engine the API added and drops its workers from
// the index, returning their ids; it returns once they are gone. Errors wrap
// ErrUnknownEngine, ErrEngineSource (the engine belongs to the configuration or a
// discovery source, which alone may remove it) or ErrServerState.
func (s *Server) RemoveEngine(key string) ([]string, error) {
	s.engMu.Lock()
	defer s.engMu.Unlock()
	if s.closed {
		return nil, ErrServerState
	}
	en := s.entries[key]
	if en == nil {
		return nil, fmt.Errorf("%w: %q", ErrUnknownEngine, key)
	}
	if en.source != SourceAPI {
		return nil, fmt.Errorf("%w: engine %q comes from %s; remove it there", ErrEngineSource, key, describeSource(en.source))
	}
	s.removeLocked([]*engineEntry{en})
	s.noteChange(SourceAPI, "removed", 1)
	s.log.Info("engine removed", "engine", key, "source", SourceAPI)
	return en.workers(), nil
}

// describeSource names a source for an error message.
func describeSource(src string) string {
	switch src {
	case SourceConfig:
		return "the configuration (edit it and reload: SIGHUP)"
	case SourceAPI:
		return "the admin API"
	}
	return "discovery source " + strconv.Quote(src)
}

// SetEngines makes source's engines exactly specs: engines of the source not in specs
// are removed, new ones added, changed ones (same key, another spec) replaced, and
// the rest left running untouched. An engine that is invalid or conflicts with
// another source's is rejected and reported, and the others still apply: one bad
// entry of a discovery source does not hold up the rest. specs naming one key twice
// keep the first. After Shutdown it returns ErrServerState and changes nothing.
func (s *Server) SetEngines(source string, specs []EngineConfig) (EngineChanges, error) {
	ch := EngineChanges{Added: []string{}, Removed: []string{}, Replaced: []string{}, Unchanged: []string{}, Rejected: []EngineRejection{}}
	if source == "" {
		return ch, errors.New("server: SetEngines needs a source")
	}
	s.engMu.Lock()
	defer s.engMu.Unlock()
	if s.closed {
		return ch, ErrServerState
	}
	reject := func(key string, err error) {
		ch.Rejected = append(ch.Rejected, EngineRejection{Key: key, Error: err.Error()})
	}
	// Sort the specs: unchanged, changed (of this source), new; a key of another
	// source is rejected outright.
	want := map[string]bool{}
	var changed, fresh []EngineConfig
	for _, e := range specs {
		e = s.normalize(e)
		key := engineKey(e)
		if want[key] {
			reject(key, fmt.Errorf("%w: engine %q is listed twice", ErrConfig, key))
			continue
		}
		want[key] = true
		switch en := s.entries[key]; {
		case en == nil:
			fresh = append(fresh, e)
		case en.source != source:
			reject(key, fmt.Errorf("%w: engine %q is served by %s", ErrEngineExists, key, describeSource(en.source)))
		case sameSpec(en.spec, e):
			ch.Unchanged = append(ch.Unchanged, key)
		default:
			changed = append(changed, e)
		}
	}
	// What goes: the source's engines no longer listed, and those changed (unless
	// their new version is rejected, below).
	isChanged := map[string]bool{}
	for _, e := range changed {
		isChanged[engineKey(e)] = true
	}
	leaving := map[string]*engineEntry{}
	for key, en := range s.entries {
		if en.source == source && (!want[key] || isChanged[key]) {
			leaving[key] = en
		}
	}
	p := s.plannerExcept(leaving)
	type planned struct {
		spec EngineConfig
		pubs []publisher
	}
	var adds []planned
	// Changed engines first: a rejected new version keeps the old one, whose claims
	// must be back in the planner before new engines claim theirs.
	for _, e := range changed {
		key := engineKey(e)
		pubs, err := p.engine(e, 0, fmt.Sprintf("engine %q", key))
		if err == nil {
			adds = append(adds, planned{e, pubs})
			continue
		}
		reject(key, err)
		old := leaving[key]
		if _, kerr := p.engine(old.spec, 0, fmt.Sprintf("engine %q", key)); kerr != nil {
			continue // the old version conflicts too now: it goes (counted as removed)
		}
		delete(leaving, key)
		ch.Unchanged = append(ch.Unchanged, key)
	}
	for _, e := range fresh {
		key := engineKey(e)
		pubs, err := p.engine(e, 0, fmt.Sprintf("engine %q", key))
		if err != nil {
			reject(key, err)
			continue
		}
		adds = append(adds, planned{e, pubs})
	}
	// Apply: removals first (a replaced engine's workers leave the index before its new
	// subscribers start), then additions.
	if len(leaving) > 0 {
		gone := slices.Collect(maps.Values(leaving))
		slices.SortFunc(gone, func(a, b *engineEntry) int { return cmp.Compare(a.seq, b.seq) })
		s.removeLocked(gone)
	}
	var news []*engineEntry
	for _, a := range adds {
		key := engineKey(a.spec)
		en, err := s.newEntry(source, key, a.spec, a.pubs, s.resume)
		if err != nil {
			reject(key, err) // unreachable: the planner built these configs
			continue
		}
		s.insertLocked(en)
		news = append(news, en)
	}
	s.publishLocked()
	for _, en := range news {
		s.launchLocked(en)
	}
	// The report.
	replacedKeys := map[string]bool{}
	for _, a := range adds {
		if key := engineKey(a.spec); leaving[key] != nil {
			replacedKeys[key] = true
			ch.Replaced = append(ch.Replaced, key)
		} else {
			ch.Added = append(ch.Added, key)
		}
	}
	for key := range leaving {
		if !replacedKeys[key] {
			ch.Removed = append(ch.Removed, key)
		}
	}
	for _, l := range [][]string{ch.Added, ch.Removed, ch.Replaced, ch.Unchanged} {
		slices.Sort(l)
	}
	s.noteChange(source, "added", len(ch.Added))
	s.noteChange(source, "removed", len(ch.Removed))
	s.noteChange(source, "replaced", len(ch.Replaced))
	s.noteChange(source, "rejected", len(ch.Rejected))
	if !ch.Empty() {
		s.log.Info("engines changed", "source", source, "added", ch.Added, "removed", ch.Removed,
			"replaced", ch.Replaced, "rejected", len(ch.Rejected))
	}
	for _, r := range ch.Rejected {
		s.log.Warn("engine rejected", "source", source, "engine", r.Key, "err", r.Error)
	}
	return ch, nil
}

// workers returns the entry's worker ids.
func (en *engineEntry) workers() []string {
	out := make([]string, 0, len(en.pubs))
	for _, p := range en.pubs {
		out = append(out, p.cfg.Worker)
	}
	return out
}

// plannerExcept returns a planner that holds the claims of every served engine but
// those in skip (engMu held). The global settings are the running configuration's,
// which New validated.
func (s *Server) plannerExcept(skip map[string]*engineEntry) *planner {
	return s.claims.except(s, skip)
}

// newEntry builds an engine's subscribers (not yet running) against the server's
// index. resume gives workers their checkpoints (Options.Resume, at New).
func (s *Server) newEntry(source, key string, spec EngineConfig, pubs []publisher, resume map[string]subscriber.Checkpoint) (*engineEntry, error) {
	en := &engineEntry{source: source, tenant: defaultTenant, key: key, spec: spec, pubs: pubs}
	for _, p := range pubs {
		if p.approx {
			continue
		}
		sc := p.cfg
		sc.Index = s.eng
		sc.Replays = s.replays
		sc.Logger = s.log // every subscriber log line names its worker
		if cp, ok := resume[sc.Worker]; ok {
			sc.Resume = &cp
		}
		sub, err := subscriber.New(sc)
		if err != nil {
			return nil, err
		}
		en.runs = append(en.runs, &subRun{sub: sub})
	}
	return en, nil
}

// insertLocked records an entry (engMu held).
func (s *Server) insertLocked(en *engineEntry) {
	s.entrySeq++
	en.seq = s.entrySeq
	s.entries[en.key] = en
	s.claims.claim(s, en)
}

// removeLocked takes engines out (engMu held): out of the fleet first, so handlers
// stop listing and picking them, then their subscribers stop (all asked at once,
// then awaited), then their workers leave the index.
func (s *Server) removeLocked(ens []*engineEntry) {
	for _, en := range ens {
		delete(s.entries, en.key)
		s.claims.release(en)
	}
	s.publishRemoveLocked(ens)
	for _, en := range ens {
		for _, r := range en.runs {
			if r.cancel != nil {
				r.cancel()
			}
		}
	}
	for _, en := range ens {
		for _, r := range en.runs {
			if r.cancel != nil {
				<-r.done
			}
		}
		for _, p := range en.pubs {
			// After its subscriber's last event: the worker's calls are ordered by its
			// mutex, so nothing of it is applied after this. An error means the index
			// is closed or failed, which Errors reports.
			if err := s.eng.RemoveWorker(p.cfg.Worker); err != nil {
				s.log.Warn("removing a worker from the index", "worker", p.cfg.Worker, "err", err)
			}
		}
	}
}

// launchLocked starts an entry's subscribers if the server runs (engMu held); Start
// launches those added before it.
func (s *Server) launchLocked(en *engineEntry) {
	if s.runCtx == nil {
		return
	}
	for _, r := range en.runs {
		ctx, cancel := context.WithCancel(s.runCtx)
		r.cancel, r.done = cancel, make(chan struct{})
		sub, done := r.sub, r.done
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			defer close(done)
			defer cancel()
			if err := sub.Run(ctx); err != nil {
				s.log.Error("subscriber stopped", "worker", sub.Worker(), "err", err)
				s.report(fmt.Errorf("server: subscriber %s: %w", sub.Worker(), err))
			}
		}()
	}
}

// publishLocked builds the fleet from the entries and publishes it (engMu held). Model
// query windows outlive the fleets; a model no engine serves any more (and not in
// Config.Models) leaves with its window.
func (s *Server) publishLocked() {
	e := (*fleet)(nil).edit(s.queryWins)
	for _, en := range s.sortedEntries() {
		e.addEntry(en)
	}
	for name, bs := range s.cfg.Models {
		e.model(name, bs)
	}
	f := e.done()
	for name := range s.queryWins {
		if _, ok := f.models.Get(name); !ok {
			delete(s.queryWins, name)
		}
	}
	s.fl.Store(f)
	// Every source seen keeps its series (0 once its engines are gone).
	n := map[string]int{SourceConfig: 0, SourceAPI: 0}
	if old := s.engineCount.Load(); old != nil {
		for src := range *old {
			n[src] = 0
		}
	}
	for _, en := range s.entries {
		n[en.source]++
	}
	s.engineCount.Store(&n)
}

// noteChange counts engine changes of a source (kvindex_engine_changes_total).
func (s *Server) noteChange(source, change string, n int) {
	if n > 0 {
		s.engChanges.WithLabelValues(source, change).Add(float64(n))
	}
}
