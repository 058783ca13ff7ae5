package predict

import (
	"slices"
	"strings"
	"sync"
	"sync/atomic"
)

// Table is the prediction table. The zero value is empty and ready. See the package
// documentation for who may call what.
type Table struct {
	// live counts the entries in the slab, expired or not: 0 lets queries and events
	// skip the table.
	live atomic.Int64

	mu sync.RWMutex
	// ents is the slab; entry 0 is unused so that 0 can mean "none" in the links.
	ents []ent
	free uint32 // first free entry, chained through gnext
	// oldest and newest delimit the engine-wide list in insertion order.
	oldest, newest uint32
	blocks         int
	minExp         int64 // see Sweep
	byName         map[string]*Worker
	roots          map[uint64]*root // fingerprint of (ns, 0, P[0]) -> its entries
	// ends is the scratch of the event hooks (Mark*, EndMarked), reused under mu.
	ends []uint32
}

// ent is one prediction.
type ent struct {
	w       *Worker
	ns      uint32
	content []uint64 // P; nil on a free entry
	pre     []uint64 // P's prefix hashes, pre[i] = key prefix at position i
	expires int64    // Unix nanoseconds
	root    uint64   // the roots map's key
	// links: engine-wide and per worker (entry ids, 0 = none)
	gprev, gnext, wprev, wnext uint32
}

// root holds the entries that share a first block, per worker, each worker's sorted by
// content (slices.Compare).
type root struct {
	ws []rootWorker
}

type rootWorker struct {
	w   *Worker
	ids []uint32
}

// Worker is a worker's share of the table: its entries, oldest first. Its fields are
// the table's, under its mutex.
type Worker struct {
	name           string
	n              int
	oldest, newest uint32
}

// Lock takes the table's write side: Insert, EndWorker, Sweep, Namespaces, Worker and
// the event hooks need it.
func (p *Table) Lock() { p.mu.Lock() }

// Unlock lets the write side go.
func (p *Table) Unlock() { p.mu.Unlock() }

// RLock takes the read side: AppendHits, Has and Stats need it (or the write side).
func (p *Table) RLock() { p.mu.RLock() }

// RUnlock lets the read side go.
func (p *Table) RUnlock() { p.mu.RUnlock() }

// Live is the number of entries held, expired ones not yet freed included. Any
// goroutine, no lock: 0 means the table may be skipped.
func (p *Table) Live() int64 { return p.live.Load() }

// Stats returns the entries held, their blocks and the workers with at least one.
// Read side.
func (p *Table) Stats() (predictions, blocks, workers int) {
	return int(p.live.Load()), p.blocks, len(p.byName)
}

// Has reports whether the worker named name has an entry. Read side.
func (p *Table) Has(name string) bool { return p.byName[name] != nil }

// Worker returns the worker named name's share, or nil. Write side (the event hooks
// take it to mark its entries).
func (p *Table) Worker(name string) *Worker { return p.byName[name] }

// Insert records a prediction of worker in namespace ns of content (owned by the table
// from now on) with prefix hashes pre, filed under root (the fingerprint of its first
// key), expiring at expires: a same prediction of the worker is replaced (a refresh),
// then the worker's oldest end while it has perWorker and the engine's oldest while
// the blocks would pass maxBlocks (expired entries go first). Write side.
func (p *Table) Insert(worker string, ns uint32, content, pre []uint64, rootFP uint64, now, expires int64, perWorker, maxBlocks int) {
	p.expire(now)
	pw := p.byName[worker]
	if pw == nil {
		if p.byName == nil {
			p.byName, p.roots = map[string]*Worker{}, map[uint64]*root{}
		}
		pw = &Worker{name: strings.Clone(worker)}
		p.byName[pw.name] = pw
	}
	// phase 1: a refresh replaces the same prediction
	for id := pw.oldest; id != 0; id = p.ents[id].wnext {
		if x := &p.ents[id]; x.ns == ns && slices.Equal(x.content, content) {
			p.end(id)
			break
		}
	}
	// phase 2: make room (the worker's bound, then the engine's). The bounds count live
	// predictions only, so expired ones are freed before a live one is evicted.
	if pw.n >= perWorker {
		for id := pw.oldest; id != 0; {
			next := p.ents[id].wnext
			if p.ents[id].expires <= now {
				p.end(id)
			}
			id = next
		}
	}
	for pw.n >= perWorker {
		p.end(pw.oldest)
	}
	if p.blocks+len(content) > maxBlocks {
		p.Sweep(now)
	}
	for p.blocks+len(content) > maxBlocks {
		p.end(p.oldest)
	}
	if p.byName[pw.name] != pw { // its last entry went in phase 2
		p.byName[pw.name] = pw
	}
	// phase 3: insert as the newest of all three lists
	id := p.alloc()
	x := &p.ents[id]
	*x = ent{w: pw, ns: ns, content: content, pre: pre, expires: expires, root: rootFP}
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
	p.blocks += len(content)
	if p.live.Add(1) == 1 || x.expires < p.minExp {
		p.minExp = x.expires
	}
}

// Sweep frees every expired entry. It walks the whole table only when some entry may
// have expired: minExp is at most the earliest expiry held (entries that end only raise
// the true minimum), recomputed by each walk. Write side.
func (p *Table) Sweep(now int64) {
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

// Namespaces sweeps the expired entries and marks in used the namespace of every entry
// left (the namespace table's sweep). Write side.
func (p *Table) Namespaces(now int64, used map[uint32]bool) {
	p.Sweep(now)
	for id := p.oldest; id != 0; id = p.ents[id].gnext {
		used[p.ents[id].ns] = true
	}
}

// link files entry id under its root, in its worker's content order.
func (p *Table) link(id uint32) {
	x := &p.ents[id]
	r := p.roots[x.root]
	if r == nil {
		r = &root{}
		p.roots[x.root] = r
	}
	k := slices.IndexFunc(r.ws, func(rw rootWorker) bool { return rw.w == x.w })
	if k < 0 {
		r.ws = append(r.ws, rootWorker{w: x.w})
		k = len(r.ws) - 1
	}
	rw := &r.ws[k]
	at, _ := slices.BinarySearchFunc(rw.ids, x.content, p.compare)
	rw.ids = slices.Insert(rw.ids, at, id)
}

// unlink takes entry id out of its root.
func (p *Table) unlink(id uint32) {
	x := &p.ents[id]
	r := p.roots[x.root]
	k := slices.IndexFunc(r.ws, func(rw rootWorker) bool { return rw.w == x.w })
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
func (p *Table) compare(id uint32, content []uint64) int {
	return slices.Compare(p.ents[id].content, content)
}

// alloc returns a free entry id, growing the slab when none is free.
func (p *Table) alloc() uint32 {
	if p.free != 0 {
		id := p.free
		p.free = p.ents[id].gnext
		return id
	}
	if len(p.ents) == 0 {
		p.ents = append(p.ents, ent{}) // id 0 means none
	}
	p.ents = append(p.ents, ent{})
	return uint32(len(p.ents) - 1)
}

// end unlinks entry id from its lists and frees it. Write side.
func (p *Table) end(id uint32) {
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
	*x = ent{gnext: p.free}
	p.free = id
	if p.live.Load() == 0 && len(p.ents) > 1024 {
		p.ents, p.free = nil, 0 // give a burst's slab back
	}
}

// expire frees the expired entries at the old end of the engine-wide list. An expired
// entry behind a longer-lived older one waits for a later call or for the bounds;
// readers skip it meanwhile.
func (p *Table) expire(now int64) {
	for p.oldest != 0 && p.ents[p.oldest].expires <= now {
		p.end(p.oldest)
	}
}

// EndWorker ends every prediction of the worker named name. Write side.
func (p *Table) EndWorker(name string) {
	if pw := p.byName[name]; pw != nil {
		for pw.n > 0 {
			p.end(pw.oldest)
		}
	}
}

// The event hooks: an event of a worker with predictions marks the entries it covers
// or contradicts (ResetMarks, then MarkHeld or MarkConfirmed per key), and ends them
// once it is applied (EndMarked). Write side, held across the event.

// ResetMarks forgets the marks of the event before.
func (p *Table) ResetMarks() { p.ends = p.ends[:0] }

// MarkHeld marks pw's entries in namespace ns with key (pos, prefix) on their path:
// a removal of a block held there contradicts them.
func (p *Table) MarkHeld(pw *Worker, ns, pos uint32, prefix uint64) {
	p.mark(pw, ns, int(pos), prefix, false)
}

// MarkConfirmed marks pw's entries in namespace ns whose last key is (at, prefix): a
// store of that key confirms them.
func (p *Table) MarkConfirmed(pw *Worker, ns uint32, at int, prefix uint64) {
	p.mark(pw, ns, at, prefix, true)
}

// mark marks pw's entries in namespace ns with key (pos, prefix) on their path (as
// their last key, if last).
func (p *Table) mark(pw *Worker, ns uint32, pos int, prefix uint64, last bool) {
	for id := pw.oldest; id != 0; id = p.ents[id].wnext {
		x := &p.ents[id]
		if x.ns == ns && pos < len(x.pre) && x.pre[pos] == prefix && (!last || len(x.pre) == pos+1) {
			p.ends = appendOnce(p.ends, id)
		}
	}
}

// EndMarked ends the marked entries.
func (p *Table) EndMarked() {
	for _, id := range p.ends {
		p.end(id)
	}
}

func appendOnce(s []uint32, id uint32) []uint32 {
	if slices.Contains(s, id) {
		return s
	}
	return append(s, id)
}

// Hit is one worker's predicted length for a query.
type Hit struct {
	Worker string
	N      int
}

// AppendHits appends to dst, for each worker with a live entry in namespace ns filed
// under rootFP (the fingerprint of the query's first key), the longest common prefix
// of key with any of them, when at least 1 (byPrefix: key holds prefix hashes,
// AppendEach). Read side; nothing allocated beyond dst's growth.
func (p *Table) AppendHits(dst []Hit, rootFP uint64, ns uint32, key []uint64, byPrefix bool, now int64) []Hit {
	return AppendEach(p, dst, rootFP, ns, key, byPrefix, now, func(w string, n int) Hit { return Hit{Worker: w, N: n} })
}

// AppendEach is AppendHits with each hit made by mk (which must not capture, so that
// it costs no allocation). With byPrefix, key holds the query's prefix hashes instead
// of its content hashes (a query by rolling hashes; the engine's chain is then SPEC's,
// the one the entries' pre were made with), compared with each entry's pre: two
// sequences share their first n prefix hashes exactly when they share their first n
// blocks, barring a chain collision. Read side.
func AppendEach[T any](p *Table, dst []T, rootFP uint64, ns uint32, key []uint64, byPrefix bool, now int64, mk func(worker string, n int) T) []T {
	r := p.roots[rootFP]
	if r == nil {
		return dst
	}
	for k := range r.ws {
		n := 0
		if byPrefix {
			n = p.bestByPrefix(r.ws[k].ids, ns, key, now)
		} else {
			n = p.bestPrefix(r.ws[k].ids, ns, key, now)
		}
		if n > 0 {
			dst = append(dst, mk(r.ws[k].w.name, n))
		}
	}
	return dst
}

// bestPrefix returns the longest common prefix of content with the live entries of ids
// (sorted by content) in namespace ns: the nearest live entry on each side of content's
// place decides it.
func (p *Table) bestPrefix(ids []uint32, ns uint32, content []uint64, now int64) int {
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

// bestByPrefix is bestPrefix for a query given by its prefix hashes: ids are sorted
// by content, which the query does not reveal, so every live entry is compared (at
// most Config.PredictionsPerWorker of them).
func (p *Table) bestByPrefix(ids []uint32, ns uint32, pre []uint64, now int64) int {
	best := 0
	for _, id := range ids {
		if x := &p.ents[id]; x.ns == ns && x.expires > now {
			best = max(best, commonPrefix(x.pre, pre))
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
