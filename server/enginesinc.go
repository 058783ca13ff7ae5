package server

import (
	"cmp"
	"fmt"
	"maps"
	"slices"

	"github.com/kvindex/kvindex/subscriber"
)

// Adding or removing one engine costs O(1) work under engMu besides copying: the
// claims every served engine holds (worker ids, endpoints, model block sizes, Mooncake
// instances) are kept as the entries change, instead of planned again from every entry
// (a formatted name and a map entry per engine, and the whole configuration validated
// once more), and the fleet a change publishes is the previous one with the engine
// added or taken out (its maps cloned, which copies their tables without hashing or
// formatting anything; the affected model's worker list copied), not rebuilt from
// every entry sorted. SetEngines, which changes many at once, still plans and builds
// from every entry.

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
	old := s.fleet()
	f := &fleet{subs: slices.Grow(slices.Clone(old.subs), len(en.runs)), byWorker: maps.Clone(old.byWorker),
		models: maps.Clone(old.models), approx: maps.Clone(old.approx), ranks: maps.Clone(old.ranks)}
	f.addEntry(en, func(name string, bs int) *model { return s.fleetModel(f, name, bs) }, true)
	s.fl.Store(f)
	s.countEngines(en.source, 1)
}

// addEntry adds en's workers to f, their models from modelOf. sorted keeps the
// models' worker lists in order as it inserts (a full rebuild sorts them once at the
// end instead).
func (f *fleet) addEntry(en *engineEntry, modelOf func(name string, bs int) *model, sorted bool) {
	runs := en.runs
	for _, p := range en.pubs {
		f.ranks[p.cfg.Worker] = rankOf{instance: p.instance, tenant: en.tenant, rank: p.cfg.DPRank}
		m := modelOf(p.cfg.Model, p.cfg.BlockSize)
		if p.approx {
			i := len(m.approx)
			if sorted {
				i, _ = slices.BinarySearch(m.approx, p.cfg.Worker)
			}
			m.approx = slices.Insert(m.approx, i, p.cfg.Worker)
			f.approx[p.cfg.Worker] = m
			continue
		}
		sub := runs[0].sub
		runs = runs[1:]
		f.subs = append(f.subs, sub)
		f.byWorker[sub.Worker()] = sub
		i := len(m.subs)
		if sorted {
			i, _ = slices.BinarySearchFunc(m.subs, sub.Worker(), func(a *subscriber.Subscriber, w string) int { return cmp.Compare(a.Worker(), w) })
		}
		m.subs = slices.Insert(m.subs, i, sub)
	}
}

// publishRemoveLocked publishes the fleet with ens taken out (engMu held; ens deleted
// from the entries).
func (s *Server) publishRemoveLocked(ens []*engineEntry) {
	old := s.fleet()
	f := &fleet{byWorker: maps.Clone(old.byWorker), models: maps.Clone(old.models), approx: maps.Clone(old.approx),
		ranks: maps.Clone(old.ranks)}
	gone := map[*subscriber.Subscriber]bool{}
	for _, en := range ens {
		m := s.fleetModel(f, en.spec.Model, en.spec.BlockSize)
		for _, p := range en.pubs {
			delete(f.ranks, p.cfg.Worker)
			delete(f.approx, p.cfg.Worker)
			m.approx = slices.DeleteFunc(m.approx, func(w string) bool { return w == p.cfg.Worker })
		}
		for _, r := range en.runs {
			gone[r.sub] = true
			delete(f.byWorker, r.sub.Worker())
		}
		m.subs = slices.DeleteFunc(m.subs, func(sub *subscriber.Subscriber) bool { return gone[sub] })
		if _, configured := s.cfg.Models[m.name]; len(m.subs)+len(m.approx) == 0 && !configured {
			delete(f.models, m.name)
			delete(s.queryWins, m.name)
		}
		s.countEngines(en.source, -1)
	}
	f.subs = slices.DeleteFunc(slices.Clone(old.subs), func(sub *subscriber.Subscriber) bool { return gone[sub] })
	s.fl.Store(f)
}

// fleetModel returns f's model name as a copy f owns (its worker lists copied), made
// when f has none (engMu held).
func (s *Server) fleetModel(f *fleet, name string, bs int) *model {
	if m := f.models[name]; m != nil {
		c := *m
		c.subs, c.approx = slices.Clone(m.subs), slices.Clone(m.approx)
		f.models[name] = &c
		return &c
	}
	q := s.queryWins[name]
	if q == nil {
		q = &queryWindow{}
		s.queryWins[name] = q
	}
	m := &model{name: name, blockSize: bs, queries: q}
	f.models[name] = m
	return m
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
