package engine

import (
	"context"
	"fmt"
	"slices"

	"github.com/kvindex/kvindex/engine/internal/chain"
	"github.com/kvindex/kvindex/engine/internal/predict"
	"github.com/kvindex/kvindex/engine/internal/worker"
	"github.com/kvindex/kvindex/shard"
)

// Queries: the entry points (FindMatches, FindMatchesIn), the pooled workspace and its
// probe bookkeeping. The phases are in walk.go (the direct walk), jump.go (jump search),
// answer.go (answer assembly) and tune.go (the dense-landings tuner).

// Match is one worker's answer to a query.
type Match struct {
	// Worker is the worker's id as given to the event calls.
	Worker string
	// Score is the number of leading query blocks the worker holds (at least 1).
	Score int
	// Size is the number of distinct engine hashes the worker holds.
	Size int
	// Predicted is the part of Score that comes from predictions (Predict): Score minus
	// the number of leading blocks the worker's events confirm. 0 when the engine holds
	// no prediction for the worker that reaches beyond its confirmed blocks.
	Predicted int
	// Tiers gives, per tier t, the number of leading query blocks the worker holds on
	// tier t or a faster one (Tiers[0]: device; Tiers[1]: device or host; Tiers[2]: any
	// tier), predictions counted as device blocks. Score == Tiers[NumTiers-1]; a worker
	// that publishes device events only has all three equal to Score. Weighted combines
	// them.
	Tiers [NumTiers]int
}

// probeAt says where a position's probe is: in q.sub[batch].Probes[idx], if gen is the
// query's stamp (q.gen); otherwise the position was not probed by this call. Stamps
// instead of a reset spare each call a write per hashed position (a first wave hashes
// up to firstWave of them).
type probeAt struct{ gen, batch, idx uint32 }

// candidate is a worker that holds position 0 of the query.
type candidate struct {
	wid   uint32
	w     *worker.Worker // the worker wid named when the query found it
	gappy bool
	alive bool // held every landing so far
	drop  int  // index of the first landing it missed
	score int  // 0 while unresolved
	// lo and hi bound the positions that decide the score (see scanRange).
	lo, hi int
}

// byPrefix reports whether the query's words are prefix hashes (FindMatchesByPrefixIn).
func (q *query) byPrefix() bool { return q.ch == &chain.Given }

// query is a pooled per-call workspace: nothing in it survives a call except capacity,
// gallop's hint and the cached name keys (names).
type query struct {
	done      chan struct{}
	ns        uint32
	ch        *chain.Chain // the engine's chain, or chain.Given for a query by prefix hashes (byPrefix)
	pre       []uint64     // prefix hash per position
	sub       []shard.Batch
	at        []probeAt // per hashed position: where its probe is, if it was probed
	gen       uint32    // this call's stamp in at
	nshard    int       // the engine's shards: sub[s] and sub[nshard+s] go to shard s
	alt       int       // 0 or nshard: the half of sub that add fills
	wx, wstep int       // the landings so far end at wx; the next stride is wstep
	rounds    int       // rounds of probes answered (Stats.QueryRounds)
	asked     bool      // some batch went to a shard since the last gather
	landings  []int
	cands     []candidate
	seen      shard.IDSet      // the members of the last position read
	tgrp      []tierGroup      // collectTiers' scratch: per primary id, its components' scores
	tlist     []*worker.Worker // collectTiers' scratch: the multi-tier workers met, in order
	tpre      []uint64         // tierLengths' scratch: prefix hashes, as deep as it looked
	tstamp    uint32
	phits     []predict.Hit // addPredicted's scratch
	skeys     []matchKey    // collect's and sortByKeys' scratch
	names     []nameKey     // per worker id, the name key of the worker that had it (nameKey)
	// hint is the score gallop's last query on this workspace gave its largest group
	// of candidates, which bisect probes around first; it is the one thing that
	// survives a call besides capacity (a pooled workspace that the GC drops takes it
	// along, and the next query learns it again). nextHint and hintN are this call's
	// largest group so far: its score and size.
	hint, nextHint, hintN int
}

func (e *Engine) getQuery() *query {
	if q, _ := e.qpool.Get().(*query); q != nil {
		return q
	}
	// Two batches per shard: a round can send the next wave while the shards still
	// answer the one before (round).
	n := len(e.shards)
	q := &query{done: make(chan struct{}, 2*n), sub: make([]shard.Batch, 2*n), nshard: n}
	for i := range q.sub {
		q.sub[i].Done = q.done
	}
	return q
}

// FindMatches returns, appended to dst, every worker whose score for the query's
// content hashes is at least 1: the number of leading blocks it holds under exactly this
// prefix, and its size. Matches are ordered by score (highest first), then worker name.
// An empty query matches nothing. It returns ctx.Err() if ctx ends first, or ErrClosed.
func (e *Engine) FindMatches(ctx context.Context, content []uint64, dst []Match) ([]Match, error) {
	return e.findMatches(ctx, 0, content, &e.env.Chain, dst)
}

// FindMatchesIn is FindMatches in a prefix namespace (see Event.Namespace); "" is the
// default namespace. A namespace nothing was ever stored into matches nothing.
func (e *Engine) FindMatchesIn(ctx context.Context, namespace string, content []uint64, dst []Match) ([]Match, error) {
	return e.findMatchesIn(ctx, namespace, content, &e.env.Chain, dst)
}

// FindMatchesByPrefix is FindMatches for a query given by its prefix hashes instead
// of its content hashes: prefixes[i] is SPEC's rolling hash of blocks 0..i
// (prefixes[0] = content[0], prefixes[i] = hash.Next(prefixes[i-1], content[i]);
// hash.Prefixes), the sequence hashes Dynamo and Mooncake's Conductor send. The index
// is keyed by (position, prefix hash), so such a query is answered exactly as the
// content hashes it was made from would be, predictions included. It needs an engine
// on SPEC's chain (Config.SpecChain, or restored from a snapshot written with it) and
// returns ErrNotSpecChain otherwise: the keyed chain's prefixes are the engine's
// secret, and a rolling hash cannot be turned back into the blocks' contents.
func (e *Engine) FindMatchesByPrefix(ctx context.Context, prefixes []uint64, dst []Match) ([]Match, error) {
	return e.FindMatchesByPrefixIn(ctx, "", prefixes, dst)
}

// FindMatchesByPrefixIn is FindMatchesByPrefix in a prefix namespace (FindMatchesIn).
func (e *Engine) FindMatchesByPrefixIn(ctx context.Context, namespace string, prefixes []uint64, dst []Match) ([]Match, error) {
	if !e.env.Chain.Spec() {
		return dst, ErrNotSpecChain
	}
	return e.findMatchesIn(ctx, namespace, prefixes, &chain.Given, dst)
}

// SpecChain reports whether the engine names positions by SPEC's chain, the one
// FindMatchesByPrefix needs.
func (e *Engine) SpecChain() bool { return e.env.Chain.Spec() }

// findMatchesIn resolves a namespace and runs the query; ch is the engine's chain
// (words are content hashes) or chain.Given (words are prefix hashes).
func (e *Engine) findMatchesIn(ctx context.Context, namespace string, words []uint64, ch *chain.Chain, dst []Match) ([]Match, error) {
	ns := uint32(0)
	if namespace != "" {
		if ns = e.namespaceID(namespace, nsFind); ns == 0 {
			if e.closed.Load() {
				return dst, e.err()
			}
			return dst, nil
		}
	}
	return e.findMatches(ctx, ns, words, ch, dst)
}

func (e *Engine) findMatches(ctx context.Context, ns uint32, content []uint64, ch *chain.Chain, dst []Match) ([]Match, error) {
	if e.closed.Load() {
		return dst, e.err()
	}
	if err := ctx.Err(); err != nil {
		return dst, err
	}
	if len(content) == 0 {
		return dst, nil
	}
	if len(content) >= MaxDepth {
		return dst, fmt.Errorf("%w: %d blocks (limit %d)", ErrQueryTooLong, len(content), MaxDepth-1)
	}
	e.queries.Add(1)
	q := e.getQuery()
	ok := false
	defer func() {
		if ok {
			e.qpool.Put(q)
		} else {
			e.abandoned.Add(1) // shards may still write into q: let the GC have it
		}
	}()
	q.ns, q.ch = ns, ch
	start := len(dst)
	if e.walks() {
		var done bool
		if dst, done = e.walk(q, content, dst); done {
			ok = true
			dst = e.withGroups(q, content, dst, start)
			return e.withPredictions(q, content, dst, start), nil
		}
	}
	q.reset(content[0])
	if err := e.landings(ctx, q, content); err != nil {
		return dst, err
	}
	if err := e.deciders(ctx, q, len(content)); err != nil {
		return dst, err
	}
	e.noteDense(q.nearDense())
	e.countWork(q)
	dst = e.collect(q, content, dst)
	ok = true
	dst = e.withGroups(q, content, dst, start)
	return e.withPredictions(q, content, dst, start), nil
}

// countWork adds q's round trips and probes to the engine's counters: two atomic adds
// per query, where the rest of a sharded query costs a microsecond or more.
func (e *Engine) countWork(q *query) {
	if e.cfg.LockedIndex {
		return // no round trips; its walk and gallop probe the index directly
	}
	probes := 0
	for i := range q.sub {
		probes += len(q.sub[i].Probes) + len(q.sub[i].SFPs)
	}
	e.queryRounds.Add(uint64(q.rounds))
	e.queryProbes.Add(uint64(probes))
}

// withPredictions adds the predictions to an answer while the engine holds any.
func (e *Engine) withPredictions(q *query, content []uint64, dst []Match, start int) []Match {
	if e.preds.Live() == 0 {
		return dst
	}
	return e.addPredicted(q, q.ns, content, dst, start)
}

// extend computes the prefix hashes of content up to position hi, each position not yet
// probed. Every position a query probes or scans has been extended to, so the
// per-position arrays cost only as much as the prefix the query actually hashes.
func (q *query) extend(c *chain.Chain, content []uint64, hi int) {
	from := len(q.pre)
	if hi < from {
		return
	}
	q.pre = slices.Grow(q.pre, hi+1-from)[:hi+1]
	// (at's entries past what this call stamped hold older stamps or zeros)
	q.at = slices.Grow(q.at, hi+1-len(q.at))[:hi+1]
	c.Fill(q.pre, content, from)
}

// reset starts a query whose first content hash is c0.
func (q *query) reset(c0 uint64) {
	q.pre = append(q.pre[:0], c0)
	if q.gen++; q.gen == 0 { // the stamps wrapped: start over
		clear(q.at[:cap(q.at)])
		q.gen = 1
	}
	q.at = append(q.at[:0], probeAt{})
	q.rounds = 0
	for i := range q.sub {
		b := &q.sub[i]
		b.Start, b.Probes, b.Out = 0, b.Probes[:0], b.Out[:0]
		b.SDone, b.Scans, b.SFPs, b.SWids, b.SWin, b.SMiss = 0, b.Scans[:0], b.SFPs[:0], b.SWids[:0], b.SWin[:0], b.SMiss[:0]
		b.SXs, b.SCand = b.SXs[:0], b.SCand[:0]
	}
}

// add queues a probe of position x with its owner shard.
func (q *query) add(e *Engine, x int) {
	fp := e.fingerprint(shard.Key{Prefix: q.pre[x], Pos: uint32(x), NS: q.ns})
	s := e.ownerOf(fp)
	bi := q.alt + s
	b := &q.sub[bi]
	q.at[x] = probeAt{gen: q.gen, batch: uint32(bi), idx: uint32(len(b.Probes))}
	b.Probes = append(b.Probes, shard.Probe{FP: fp})
}

// probed reports whether position x (hashed) was probed by this call.
func (q *query) probed(x int) bool { return q.at[x].gen == q.gen }

// members returns the answer for a probed position.
func (q *query) members(x int) []uint32 {
	a := &q.at[x]
	b := &q.sub[a.batch]
	p := &b.Probes[a.idx]
	return b.Out[p.Off : p.Off+p.N]
}

func (q *query) stampMembers(x int) { q.seen.SetTo(q.members(x)) }
