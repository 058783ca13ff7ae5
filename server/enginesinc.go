package server

import (
	"fmt"
	"maps"

	"github.com/kvindex/kvindex/internal/ptree"
	"github.com/kvindex/kvindex/subscriber"
)

// Adding or removing one engine costs O(log n) work under engMu for n engines served:
// the claims every served engine holds (worker ids, endpoints, model block sizes,
// Mooncake instances) are kept as the entries change (maps changed in place: only
// engMu reads them), instead of planned again from every entry, and the fleet a change
// publishes is the previous one with the engine added or taken out (fleetEdit): its
// maps and its models' worker lists are persistent maps (internal/ptree), so the new
// fleet copies the nodes on the changed keys' paths and shares the rest with the
// published one, which its readers keep seeing whole. SetEngines, which changes many
// at once, still plans and builds from every entry.

// claims are what the served engines hold (engMu).
type claims struct {
	plan      *planner              // the running configuration's, with every entry's claims
	modelRefs map[string]int        // engines per model: a model's block size goes with its last
	instances map[string]instanceOf // Mooncake instance (an engine's worker base) -> owner
}

// instanceOf is who serves an instance's ranks, and how many entries it has.
type instanceOf struct {
	source, tenant string
	n              int
}

// where names an entry in a planner's claims.
func (en *engineEntry) where() string { return fmt.Sprintf("engine %q", en.key) }

// planner returns the planner holding every entry's claims, made on first use from the
// running configuration, which New validated.
func (c *claims) planner(s *Server) *planner {
	if c.plan == nil {
		p, err := s.cfg.planner()
		if err != nil {
			panic(fmt.Sprintf("server: the running configuration no longer validates: %v", err))
		}
		c.plan, c.modelRefs, c.instances = p, map[string]int{}, map[string]instanceOf{}
	}
	return c.plan
}

// claim records en's claims (insertLocked).
func (c *claims) claim(s *Server, en *engineEntry) {
	c.planner(s)
	where := en.where()
	for _, pub := range en.pubs {
		c.plan.workers[pub.cfg.Worker] = where
		if !pub.approx {
			c.plan.endpoints[pub.cfg.Endpoint] = where
		}
	}
	c.plan.modelBS[en.spec.Model] = en.spec.BlockSize
	c.modelRefs[en.spec.Model]++
	if len(en.pubs) > 0 {
		in := c.instances[en.pubs[0].instance]
		in.source, in.tenant = en.source, en.tenant
		in.n++
		c.instances[en.pubs[0].instance] = in
	}
}

// release takes en's claims back (removeLocked).
func (c *claims) release(en *engineEntry) {
	for _, pub := range en.pubs {
		delete(c.plan.workers, pub.cfg.Worker)
		if !pub.approx {
			delete(c.plan.endpoints, pub.cfg.Endpoint)
		}
	}
	if c.modelRefs[en.spec.Model]--; c.modelRefs[en.spec.Model] <= 0 {
		delete(c.modelRefs, en.spec.Model)
		delete(c.plan.modelBS, en.spec.Model)
	}
	if len(en.pubs) > 0 {
		inst := en.pubs[0].instance
		if in := c.instances[inst]; in.n <= 1 {
			delete(c.instances, inst)
		} else {
			in.n--
			c.instances[inst] = in
		}
	}
}

// except returns a planner with every entry's claims but skip's (SetEngines).
func (c *claims) except(s *Server, skip map[string]*engineEntry) *planner {
	p := *c.planner(s)
	p.workers, p.endpoints, p.modelBS = maps.Clone(p.workers), maps.Clone(p.endpoints), maps.Clone(p.modelBS)
	left := maps.Clone(c.modelRefs)
	for _, en := range skip {
		for _, pub := range en.pubs {
			delete(p.workers, pub.cfg.Worker)
			if !pub.approx {
				delete(p.endpoints, pub.cfg.Endpoint)
			}
		}
		if left[en.spec.Model]--; left[en.spec.Model] <= 0 {
			delete(p.modelBS, en.spec.Model)
		}
	}
	return &p
}

// releasePlanned takes back what planner.engine claimed for an entry that was not
// inserted after all.
func (c *claims) releasePlanned(pubs []publisher) {
	for _, pub := range pubs {
		delete(c.plan.workers, pub.cfg.Worker)
		if !pub.approx {
			delete(c.plan.endpoints, pub.cfg.Endpoint)
		}
	}
}

// publishAddLocked publishes the fleet with en added (engMu held; en inserted).
func (s *Server) publishAddLocked(en *engineEntry) {
	e := s.fleet().edit(s.queryWins)
	e.addEntry(en)
	s.fl.Store(e.done())
	s.countEngines(en.source, 1)
}

// publishRemoveLocked publishes the fleet with ens taken out (engMu held; ens deleted
// from the entries).
func (s *Server) publishRemoveLocked(ens []*engineEntry) {
	e := s.fleet().edit(s.queryWins)
	for _, en := range ens {
		e.removeEntry(en, s.cfg.Models)
		s.countEngines(en.source, -1)
	}
	s.fl.Store(e.done())
}

// fleetEdit is the next fleet being made from the published one (engMu held): the
// fleet's maps and the worker lists of the models it touches are persistent maps
// (internal/ptree), so the change copies O(log n) nodes per entry it sets or deletes,
// never a whole map, and the published fleet stays as it was for its readers.
type fleetEdit struct {
	subs    *ptree.Builder[uint64, *subscriber.Subscriber]
	workers *ptree.HashedBuilder[fleetWorker]
	models  *ptree.Builder[string, *model]
	approx  *ptree.HashedBuilder[*model]
	touched map[string]*modelEdit // the models changed, by name
	wins    map[string]*queryWindow
}

// modelEdit is a model's copy in the next fleet, its worker lists being changed.
type modelEdit struct {
	m      *model
	subs   *ptree.Builder[string, *subscriber.Subscriber]
	approx *ptree.Builder[string, struct{}]
}

// edit starts the next fleet from f (nil: from nothing). wins are the server's query
// windows by model (engMu): a model new to the fleet takes its window there.
func (f *fleet) edit(wins map[string]*queryWindow) *fleetEdit {
	if f == nil {
		f = &fleet{}
	}
	return &fleetEdit{subs: f.subs.Edit(), workers: f.workers.Edit(), models: f.models.Edit(), approx: f.approx.Edit(),
		touched: map[string]*modelEdit{}, wins: wins}
}

// done returns the next fleet, to publish; e is spent.
func (e *fleetEdit) done() *fleet {
	for _, me := range e.touched {
		me.m.subs, me.m.approx = me.subs.Map(), me.approx.Map()
	}
	return &fleet{subs: e.subs.Map(), workers: e.workers.Map(), models: e.models.Map(), approx: e.approx.Map()}
}

// model returns the next fleet's copy of model name, made (with block size bs) when
// the fleet has none.
func (e *fleetEdit) model(name string, bs int) *modelEdit {
	if me := e.touched[name]; me != nil {
		return me
	}
	var c *model
	if m, ok := e.models.Get(name); ok {
		cp := *m
		c = &cp
	} else {
		q := e.wins[name]
		if q == nil {
			q = &queryWindow{}
			e.wins[name] = q
		}
		c = &model{name: name, blockSize: bs, queries: q}
	}
	e.models.Set(name, c)
	me := &modelEdit{m: c, subs: c.subs.Edit(), approx: c.approx.Edit()}
	e.touched[name] = me
	return me
}

// subKey orders the fleet's subscribed workers: by their engine's order of addition,
// then by rank (an engine has at most MaxDPRanks ranks).
func subKey(en *engineEntry, run int) uint64 { return en.seq<<16 | uint64(run) }

// addEntry adds en's workers.
func (e *fleetEdit) addEntry(en *engineEntry) {
	me := e.model(en.spec.Model, en.spec.BlockSize)
	run := 0
	for _, p := range en.pubs {
		rank := rankOf{instance: p.instance, tenant: en.tenant, rank: p.cfg.DPRank}
		if p.approx {
			me.approx.Set(p.cfg.Worker, struct{}{})
			e.approx.Set(p.cfg.Worker, me.m)
			e.workers.Set(p.cfg.Worker, fleetWorker{approx: me.m, rank: rank})
			continue
		}
		sub := en.runs[run].sub
		e.subs.Set(subKey(en, run), sub)
		e.workers.Set(sub.Worker(), fleetWorker{sub: sub, rank: rank})
		me.subs.Set(sub.Worker(), sub)
		run++
	}
}

// removeEntry takes en's workers out, and its model with them when no worker is left
// and configured (Config.Models) does not list it.
func (e *fleetEdit) removeEntry(en *engineEntry, configured map[string]int) {
	me := e.model(en.spec.Model, en.spec.BlockSize)
	for _, p := range en.pubs {
		e.workers.Delete(p.cfg.Worker)
		e.approx.Delete(p.cfg.Worker)
		me.approx.Delete(p.cfg.Worker)
	}
	for run, r := range en.runs {
		e.subs.Delete(subKey(en, run))
		e.workers.Delete(r.sub.Worker())
		me.subs.Delete(r.sub.Worker())
	}
	if _, kept := configured[me.m.name]; me.subs.Len()+me.approx.Len() == 0 && !kept {
		e.models.Delete(me.m.name)
		delete(e.wins, me.m.name)
	}
}

// countEngines moves source's engine count by d (engMu held).
func (s *Server) countEngines(source string, d int) {
	n := map[string]int{SourceConfig: 0, SourceAPI: 0}
	if old := s.engineCount.Load(); old != nil {
		maps.Copy(n, *old)
	}
	n[source] += d
	s.engineCount.Store(&n)
}
