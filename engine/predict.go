package engine

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Predictions: a router that sends a request to a worker records that the worker is
// about to hold the request's blocks (Predict). Until the worker's own events arrive
// (tens to hundreds of milliseconds later) queries count the prediction, so sibling
// requests follow the first one instead of scattering; for workers that publish no
// events at all the predictions are the whole index ("approximate" routing).
//
// The semantics, which DESIGN.md ("Predictions") states as part of the contract and the
// reference model (internal/refmodel) implements independently:
//
//   - A prediction is (worker, namespace, P = content hashes of n >= 1 blocks, expiry).
//     It is live from Predict until its expiry (now + ttl by Config.Clock) or until it
//     ends.
//   - It ends when the worker's events cover or contradict it: a clear or a removal of
//     the worker (known to the index or not); an accepted stored event of the worker in
//     the prediction's namespace that stores P's last block under P's prefix (the
//     prediction is confirmed: from then on the confirmed index answers for it); an
//     accepted removed event that removes a seq the worker holds at a key of P (a
//     confirmed block of P was evicted). A new prediction of the same worker, namespace
//     and P replaces the old one (a refresh: new expiry, newest again).
//   - Bounds: a worker keeps at most Config.PredictionsPerWorker live predictions and the
//     engine at most Config.PredictedBlocks blocks in all of them; a Predict that would
//     exceed either first ends the oldest (the worker's own oldest for the first bound,
//     the engine's oldest for the second).
//   - A query Q in namespace ns gives each worker a predicted length p = the longest
//     common prefix of Q with any of its live predictions in ns, next to its confirmed
//     score c (exact, untouched by predictions). The worker matches when max(c, p) >= 1,
//     with Score = max(c, p) and Predicted = Score - c. A worker known only through
//     predictions has Size 0.
//
// Structure: one table behind an RWMutex (queries read, Predict and the events of
// workers with predictions write), entries in a slab linked into three intrusive lists
// (the engine's insertion order, the worker's insertion order, and the entries that share
// the query's first key, found through a map keyed by that key's seeded fingerprint).
// No goroutine and no timer: an expired entry is skipped by queries and freed by the
// next Predict (oldest first) or by the bounds. While the engine holds no predictions
// (live == 0) queries and events pay one atomic load.

// Limits on the prediction configuration.
const (
	// MaxPredictionsPerWorker bounds Config.PredictionsPerWorker.
	MaxPredictionsPerWorker = 1 << 16
	// MaxPredictedBlocks bounds Config.PredictedBlocks (16 bytes a block: 1 GiB).
	MaxPredictedBlocks = 1 << 26
	// MaxPredictionTTL bounds Config.PredictionTTL and Predict's ttl.
	MaxPredictionTTL = 10 * time.Minute
)

// predTable is the engine's prediction table.
type predTable struct {
	// live counts the entries in the slab, expired or not: 0 lets queries and events
	// skip the table.
	live atomic.Int64

	mu sync.RWMutex
	// ents is the slab; entry 0 is unused so that 0 can mean "none" in the links.
	ents []predEnt
	free uint32 // first free entry, chained through gnext
	// oldest and newest delimit the engine-wide list in insertion order.
	oldest, newest uint32
	blocks         int
	minExp         int64 // see sweep
	byName         map[string]*predWorker
	roots          map[uint64]*predRoot // fingerprint of (ns, 0, P[0]) -> its entries
	// scratch of the event hooks, reused under mu.
	ends []uint32
}

// predEnt is one prediction.
type predEnt struct {
	w       *predWorker
	ns      uint32
	content []uint64 // P; nil on a free entry
	pre     []uint64 // P's prefix hashes, pre[i] = key prefix at position i
	expires int64    // Unix nanoseconds
	root    uint64   // the roots map's key
	// links: engine-wide and per worker (entry ids, 0 = none)
	gprev, gnext, wprev, wnext uint32
}

// predRoot holds the entries that share a first block, per worker, each worker's sorted
// by content (slices.Compare): the longest common prefix of a query with any of them is
// its longest common prefix with the live entry just before or just after the query's
// place in that order, so a query costs a binary search per worker instead of a compare
// per entry.
type predRoot struct {
	ws []predRootWorker
}

type predRootWorker struct {
	w   *predWorker
	ids []uint32
}

// predWorker is a worker's share of the table: its entries, oldest first.
type predWorker struct {
	name           string
	n              int
	oldest, newest uint32
}

// PredictionStats describes the prediction table.
type PredictionStats struct {
	// Predictions is the number of predictions held (expired ones not yet freed
	// included); Blocks their total length.
	Predictions, Blocks int
	// Workers is the number of workers with at least one prediction held.
	Workers int
}

// PredictionStats returns a snapshot of the prediction table.
func (e *Engine) PredictionStats() PredictionStats {
	p := &e.preds
	p.mu.RLock()
	defer p.mu.RUnlock()
	return PredictionStats{Predictions: int(p.live.Load()), Blocks: p.blocks, Workers: len(p.byName)}
}

func (e *Engine) now() int64 {
	if e.cfg.Clock == nil {
		return time.Now().UnixNano()
	}
	return e.cfg.Clock().UnixNano()
}

// Predict records that worker is about to hold the blocks of content in namespace (the
// content hashes of a request just routed to it), for ttl (0: Config.PredictionTTL).
// Queries count the prediction until it expires or the worker's events cover or
// contradict it (see DESIGN.md, "Predictions"). An empty content is a no-op. It returns
// an error wrapping ErrInvalidEvent for an empty worker, a negative ttl or one above
// MaxPredictionTTL, or more blocks than Config.MaxEventBlocks or Config.PredictedBlocks;
// ErrQueryTooLong for MaxDepth blocks or more; ctx.Err() or ErrClosed. A new namespace
// is interned while the namespace table holds less than half of Config.NamespaceBytes
// (ErrInvalidEvent beyond), and dropped by a sweep once no block or live prediction
// uses it.
func (e *Engine) Predict(ctx context.Context, worker, namespace string, content []uint64, ttl time.Duration) error {
	err := e.predict(ctx, worker, namespace, content, ttl)
	e.maybeSweepNamespaces()
	return err
}

func (e *Engine) predict(ctx context.Context, worker, namespace string, content []uint64, ttl time.Duration) error {
	if e.closed.Load() {
		return e.err()
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: prediction: %s", ErrInvalidEvent, fmt.Sprintf(format, args...))
	}
	switch {
	case worker == "":
		return bad("empty worker id")
	case len(worker) > MaxWorkerLen:
		return bad("worker id of %d bytes (limit %d)", len(worker), MaxWorkerLen)
	case len(namespace) > MaxNamespaceLen:
		return bad("namespace of %d bytes (limit %d)", len(namespace), MaxNamespaceLen)
	case ttl < 0 || ttl > MaxPredictionTTL:
		return bad("ttl %v, want 0..%v", ttl, MaxPredictionTTL)
	case len(content) >= MaxDepth:
		return fmt.Errorf("%w: %d blocks (limit %d)", ErrQueryTooLong, len(content), MaxDepth-1)
	case len(content) > e.cfg.MaxEventBlocks || len(content) > e.cfg.PredictedBlocks:
		return bad("%d blocks (limit %d)", len(content), min(e.cfg.MaxEventBlocks, e.cfg.PredictedBlocks))
	case len(content) == 0:
		return nil
	}
	if ttl == 0 {
		ttl = e.cfg.PredictionTTL
	}
	// The entry's own copy of content and its prefix hashes share one allocation (they
	// live and die together), computed outside the lock.
	n := len(content)
	buf := make([]uint64, 2*n)
	own, pre := buf[:n:n], buf[n:]
	copy(own, content)
	pre[0] = content[0]
	e.chain.fill(pre, content, 1)

	p := &e.preds
	p.mu.Lock()
	defer p.mu.Unlock()
	ns := uint32(0)
	if namespace != "" {
		// A query in it must find it, so a new namespace is interned, under the
		// prediction lock: a sweep reads the predictions under it (namespaces.go).
		// Predictions (a client's word, unlike events) may fill half the table.
		if ns = e.namespaceID(namespace, nsPredicted); ns == 0 {
			return fmt.Errorf("%w (Config.NamespaceBytes %d, half of it for predictions)", ErrNamespaceTableFull, e.cfg.NamespaceBytes)
		}
	}
	root := e.fingerprint(key{prefix: content[0], ns: ns})
	now := e.now()
	p.expire(now)
	pw := p.byName[worker]
	if pw == nil {
		if p.byName == nil {
			p.byName, p.roots = map[string]*predWorker{}, map[uint64]*predRoot{}
		}
		pw = &predWorker{name: strings.Clone(worker)}
		p.byName[pw.name] = pw
	}
	// phase 1: a refresh replaces the same prediction
	for id := pw.oldest; id != 0; id = p.ents[id].wnext {
		if x := &p.ents[id]; x.ns == ns && slices.Equal(x.content, own) {
			p.end(id)
			break
		}
	}
	// phase 2: make room (the worker's bound, then the engine's). The bounds count live
	// predictions only, so expired ones are freed before a live one is evicted.
	if pw.n >= e.cfg.PredictionsPerWorker {
		for id := pw.oldest; id != 0; {
			next := p.ents[id].wnext
			if p.ents[id].expires <= now {
				p.end(id)
			}
			id = next
		}
	}
	for pw.n >= e.cfg.PredictionsPerWorker {
		p.end(pw.oldest)
	}
	if p.blocks+len(own) > e.cfg.PredictedBlocks {
		p.sweep(now)
	}
	for p.blocks+len(own) > e.cfg.PredictedBlocks {
		p.end(p.oldest)
	}
	if p.byName[pw.name] != pw { // its last entry went in phase 2
		p.byName[pw.name] = pw
	}
	// phase 3: insert as the newest of all three lists
	id := p.alloc()
	x := &p.ents[id]
	*x = predEnt{w: pw, ns: ns, content: own, pre: pre, expires: now + int64(ttl), root: root}
	x.gprev, p.newest = p.newest, id
	if x.gprev != 0 {
		p.ents[x.gprev].gnext = id
	} else {
		p.oldest = id
	}
	x.wprev, pw.newest = pw.newest, id
	if x.wprev != 0 {
		p.ents[x.wprev].wnext = id
	} else {
		pw.oldest = id
	}
	p.link(id)
	pw.n++
	p.blocks += len(own)
	if p.live.Add(1) == 1 || x.expires < p.minExp {
		p.minExp = x.expires
	}
	return nil
}

// sweep frees every expired entry. It walks the whole table only when some entry may
// have expired: minExp is at most the earliest expiry held (entries that end only raise
// the true minimum), recomputed by each walk.
func (p *predTable) sweep(now int64) {
	if p.live.Load() == 0 || now < p.minExp {
		return
	}
	minExp := int64(1<<63 - 1)
	for id := p.oldest; id != 0; {
		x := &p.ents[id]
		next := x.gnext
		if x.expires <= now {
			p.end(id)
		} else {
			minExp = min(minExp, x.expires)
		}
		id = next
	}
	p.minExp = minExp
}

// link files entry id under its root, in its worker's content order.
func (p *predTable) link(id uint32) {
	x := &p.ents[id]
	r := p.roots[x.root]
	if r == nil {
		r = &predRoot{}
		p.roots[x.root] = r
	}
	k := slices.IndexFunc(r.ws, func(rw predRootWorker) bool { return rw.w == x.w })
	if k < 0 {
		r.ws = append(r.ws, predRootWorker{w: x.w})
		k = len(r.ws) - 1
	}
	rw := &r.ws[k]
	at, _ := slices.BinarySearchFunc(rw.ids, x.content, p.compare)
	rw.ids = slices.Insert(rw.ids, at, id)
}

// unlink takes entry id out of its root.
func (p *predTable) unlink(id uint32) {
	x := &p.ents[id]
	r := p.roots[x.root]
	k := slices.IndexFunc(r.ws, func(rw predRootWorker) bool { return rw.w == x.w })
	rw := &r.ws[k]
	rw.ids = slices.Delete(rw.ids, slices.Index(rw.ids, id), slices.Index(rw.ids, id)+1)
	if len(rw.ids) > 0 {
		return
	}
	r.ws = slices.Delete(r.ws, k, k+1)
	if len(r.ws) == 0 {
		delete(p.roots, x.root)
	}
}

// compare orders entry id against content (the roots' per-worker order).
func (p *predTable) compare(id uint32, content []uint64) int {
	return slices.Compare(p.ents[id].content, content)
}

// alloc returns a free entry id, growing the slab when none is free.
func (p *predTable) alloc() uint32 {
	if p.free != 0 {
		id := p.free
		p.free = p.ents[id].gnext
		return id
	}
	if len(p.ents) == 0 {
		p.ents = append(p.ents, predEnt{}) // id 0 means none
	}
	p.ents = append(p.ents, predEnt{})
	return uint32(len(p.ents) - 1)
}

// end unlinks entry id from its lists and frees it. Called with mu held.
func (p *predTable) end(id uint32) {
	x := &p.ents[id]
	pw := x.w
	if x.gprev != 0 {
		p.ents[x.gprev].gnext = x.gnext
	} else {
		p.oldest = x.gnext
	}
	if x.gnext != 0 {
		p.ents[x.gnext].gprev = x.gprev
	} else {
		p.newest = x.gprev
	}
	if x.wprev != 0 {
		p.ents[x.wprev].wnext = x.wnext
	} else {
		pw.oldest = x.wnext
	}
	if x.wnext != 0 {
		p.ents[x.wnext].wprev = x.wprev
	} else {
		pw.newest = x.wprev
	}
	p.unlink(id)
	pw.n--
	if pw.n == 0 {
		delete(p.byName, pw.name)
	}
	p.blocks -= len(x.content)
	p.live.Add(-1)
	*x = predEnt{gnext: p.free}
	p.free = id
	if p.live.Load() == 0 && len(p.ents) > 1024 {
		p.ents, p.free = nil, 0 // give a burst's slab back
	}
}

// expire frees the expired entries at the old end of the engine-wide list. An expired
// entry behind a longer-lived older one waits for a later call or for the bounds;
// queries skip it meanwhile.
func (p *predTable) expire(now int64) {
	for p.oldest != 0 && p.ents[p.oldest].expires <= now {
		p.end(p.oldest)
	}
}

// endWorker ends every prediction of the worker named name. Called with mu held.
func (p *predTable) endWorker(name string) {
	if pw := p.byName[name]; pw != nil {
		for pw.n > 0 {
			p.end(pw.oldest)
		}
	}
}

// predictedEvent applies an event to w (locked) when the engine holds predictions: the
// event itself (applyEvent), then the end of the worker's predictions it covers or
// contradicts. The prediction lock is taken after the worker's, like everywhere.
func (e *Engine) predictedEvent(w *worker, ev *Event) (gone bool, err error) {
	p := &e.preds
	if ev.Tier != TierDevice {
		return e.applyEvent(w, ev) // predictions are of device blocks: other tiers' events leave them
	}
	// Most events are of workers without predictions: a shared look first, so that they
	// do not serialise on the table. A Predict for w that slips in before the event is
	// applied is then as if it came right after the event (its confirmed part covers it
	// in queries anyway).
	p.mu.RLock()
	has := p.byName[w.name] != nil
	p.mu.RUnlock()
	if !has {
		return e.applyEvent(w, ev)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	pw := p.byName[w.name]
	if pw == nil {
		return e.applyEvent(w, ev)
	}
	p.ends = p.ends[:0]
	switch ev.Kind {
	case EventCleared, EventRemoveWorker:
		p.endWorker(w.name)
	case EventRemoved:
		// Before the removal: which of the removed seqs the worker holds at a key of a
		// prediction.
		for _, s := range ev.Seqs {
			rid, ok := w.seqs.get(&e.seed, s)
			if !ok {
				continue
			}
			k := w.keys.key(rid)
			for id := pw.oldest; id != 0; id = p.ents[id].wnext {
				if x := &p.ents[id]; x.ns == k.ns && int(k.pos) < len(x.pre) && x.pre[k.pos] == k.prefix {
					p.ends = appendOnce(p.ends, id)
				}
			}
		}
	case EventStored:
		return e.confirmingStore(w, ev, pw)
	}
	gone, err = e.applyEvent(w, ev)
	for _, id := range p.ends {
		p.end(id)
	}
	return gone, err
}

// confirmingStore applies a stored event and then ends the worker's predictions in its
// namespace whose last key the event stored. The event's keys are computed from its
// parent's key (read before the event, which may move the parent's seq) and its blocks.
func (e *Engine) confirmingStore(w *worker, ev *Event, pw *predWorker) (bool, error) {
	p := &e.preds
	var prefix uint64
	var pos uint32
	if ev.HasParent {
		h, rid, ok := e.parentOf(w, ev.Tier, ev.Parent)
		if !ok {
			return e.applyEvent(w, ev) // rejected: nothing to confirm
		}
		prefix, pos = h.keys.recs[rid].prefix(), h.keys.pos(rid)+1
	}
	gone, err := e.applyEvent(w, ev)
	if err != nil {
		return gone, err
	}
	ns := uint32(0)
	if ev.Namespace != "" {
		ns = e.namespaceID(ev.Namespace, nsFind)
	}
	p.ends = p.ends[:0]
	for i, b := range ev.Blocks {
		if i == 0 && !ev.HasParent {
			prefix = b.Content
		} else {
			prefix = e.chain.step(prefix, b.Content, pos+uint32(i))
		}
		at := int(pos) + i
		for id := pw.oldest; id != 0; id = p.ents[id].wnext {
			if x := &p.ents[id]; x.ns == ns && len(x.pre) == at+1 && x.pre[at] == prefix {
				p.ends = appendOnce(p.ends, id)
			}
		}
	}
	for _, id := range p.ends {
		p.end(id)
	}
	return gone, nil
}

func appendOnce(s []uint32, id uint32) []uint32 {
	if slices.Contains(s, id) {
		return s
	}
	return append(s, id)
}

// predictionsFor ends the predictions of an event's worker that is not known to the
// index (a clear or a removal of a worker known only through predictions).
func (e *Engine) predictionsFor(ev *Event) {
	if ev.Kind != EventCleared && ev.Kind != EventRemoveWorker {
		return
	}
	p := &e.preds
	p.mu.Lock()
	p.endWorker(ev.Worker)
	p.mu.Unlock()
}

// predHit is one worker's predicted length for a query.
type predHit struct {
	w *predWorker
	n int
}

// addPredicted merges the live predictions into a query's answer dst[start:] (sorted
// by sortMatches): a worker whose predicted length beats its confirmed score gets
// Score = the predicted length and Predicted = the difference; a worker with a
// predicted length and no confirmed match is added. Nothing is allocated beyond dst's
// growth: the hits go into the pooled query's scratch.
func (e *Engine) addPredicted(q *query, ns uint32, content []uint64, dst []Match, start int) []Match {
	p := &e.preds
	root := e.fingerprint(key{prefix: content[0], ns: ns})
	p.mu.RLock()
	defer p.mu.RUnlock()
	r := p.roots[root]
	if r == nil {
		return dst
	}
	now := e.now()
	hits := q.phits[:0]
	for k := range r.ws {
		if n := p.bestPrefix(r.ws[k].ids, ns, content, now); n > 0 {
			hits = append(hits, predHit{w: r.ws[k].w, n: n})
		}
	}
	q.phits = hits
	changed := false
	for _, h := range hits {
		i := start
		for ; i < len(dst) && dst[i].Worker != h.w.name; i++ {
		}
		if i < len(dst) {
			if m := &dst[i]; h.n > m.Score {
				m.Predicted, m.Score = h.n-m.Score, h.n
				changed = true
			}
			for t := range dst[i].Tiers {
				dst[i].Tiers[t] = max(dst[i].Tiers[t], h.n) // predicted blocks are device blocks
			}
			continue
		}
		size := 0
		if w := e.lookup(h.w.name); w != nil {
			size = w.totalSize()
		}
		dst = append(dst, Match{Worker: h.w.name, Score: h.n, Size: size, Predicted: h.n, Tiers: [NumTiers]int{h.n, h.n, h.n}})
		changed = true
	}
	if changed {
		q.sortMatches(dst[start:])
	}
	return dst
}

// bestPrefix returns the longest common prefix of content with the live entries of ids
// (sorted by content) in namespace ns: the nearest live entry on each side of content's
// place decides it.
func (p *predTable) bestPrefix(ids []uint32, ns uint32, content []uint64, now int64) int {
	at, _ := slices.BinarySearchFunc(ids, content, p.compare)
	live := func(id uint32) bool { x := &p.ents[id]; return x.ns == ns && x.expires > now }
	best := 0
	for i := at; i < len(ids); i++ {
		if live(ids[i]) {
			best = commonPrefix(p.ents[ids[i]].content, content)
			break
		}
	}
	for i := at - 1; i >= 0; i-- {
		if live(ids[i]) {
			best = max(best, commonPrefix(p.ents[ids[i]].content, content))
			break
		}
	}
	return best
}

// commonPrefix returns the length of the longest common prefix of a and b.
func commonPrefix(a, b []uint64) int {
	n := min(len(a), len(b))
	for i := 0; i < n; i++ {
		if a[i] != b[i] {
			return i
		}
	}
	return n
}

// WorkerPrediction is one worker's predicted length for a query (PredictedIn).
type WorkerPrediction struct {
	// Worker is the worker's id as given to Predict.
	Worker string
	// Blocks is the longest common prefix of the query with any of the worker's live
	// predictions in the query's namespace: at least 1.
	Blocks int
}

// PredictedIn appends to dst, for every worker with a live prediction in namespace that
// shares at least the query's first block, its predicted length, whatever its confirmed
// score (FindMatchesIn merges the two, so a prediction shorter than the confirmed
// blocks does not show there): the score a router falls back to when it cannot trust a
// worker's events (package server's trust states). The order is unspecified. It reads
// the prediction table under its read lock, allocates nothing beyond dst's growth, and
// answers an empty query, an unknown namespace and an engine without predictions with
// dst unchanged; it never blocks on the shards and answers after Close too.
func (e *Engine) PredictedIn(namespace string, content []uint64, dst []WorkerPrediction) []WorkerPrediction {
	p := &e.preds
	if len(content) == 0 || p.live.Load() == 0 {
		return dst
	}
	ns := uint32(0)
	if namespace != "" {
		if ns = e.namespaceID(namespace, nsFind); ns == 0 {
			return dst
		}
	}
	root := e.fingerprint(key{prefix: content[0], ns: ns})
	p.mu.RLock()
	defer p.mu.RUnlock()
	r := p.roots[root]
	if r == nil {
		return dst
	}
	now := e.now()
	for k := range r.ws {
		if n := p.bestPrefix(r.ws[k].ids, ns, content, now); n > 0 {
			dst = append(dst, WorkerPrediction{Worker: r.ws[k].w.name, Blocks: n})
		}
	}
	return dst
}
