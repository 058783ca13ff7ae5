package engine

import "github.com/kvindex/kvindex/engine/internal/worker"

// Stats is a snapshot of the engine's counters. Counters that shards own are published
// after every batch they apply, so take a Barrier first for exact figures.
type Stats struct {
	// Workers is the number of known workers.
	Workers int
	// Blocks is the number of (worker, tier, engine hash) triples held: the sum of sizes.
	Blocks int64
	// TierBlocks splits Blocks by tier (device, host, disk).
	TierBlocks [NumTiers]int64
	// Memberships is the number of (key, worker) pairs in the positional index (on the
	// locked index, at the positions it keeps: below 16 and every 64th).
	Memberships int64
	// IndexEntries is the number of distinct (position, prefix) keys in the index.
	IndexEntries int64
	// IndexBytes estimates the heap held by the shards' tables.
	IndexBytes int64
	// Events counts accepted events; rejected ones are counted by reason below.
	Events                 uint64
	RejectedParentNotFound uint64
	RejectedInvalid        uint64
	// SkippedRemovals counts removed hashes the worker did not hold; SkippedCopies the
	// hashes of copied events that no other tier of the worker held.
	SkippedRemovals, SkippedCopies uint64
	// Queries counts FindMatches calls with a non-empty query; Abandoned counts those
	// that ended early through their context or Close.
	Queries, Abandoned uint64
	// QueryRounds counts the rounds of probes that queries had answered by the shards
	// (each batch read on the querying goroutine or sent to its shard and waited for; a
	// wave sent before the answers to the one before counts with it), and QueryProbes
	// the positions they probed, both counted as each query ends; a query answered by
	// the direct walk (the locked index, and a one-shard engine that got its shard's
	// token) counts neither. Per query, they are the work that a query's latency follows on a
	// sharded engine, read without a clock.
	QueryRounds, QueryProbes uint64
	// WalkFallbacks counts the queries of a one-shard engine that did not get the
	// shard's token (the shard was more than a quarter of its ring behind, or did not
	// let the query in between two slices of event work) and ran jump search instead of
	// the direct walk. (A walk that meets gappy workers deeper than its limit also hands
	// over to jump search, uncounted here: that is the query's shape, not contention.)
	WalkFallbacks uint64
	// ProducerWaits counts how often an event had to wait for room in a full shard ring,
	// and ProducerWaitNanos how long, in total.
	ProducerWaits, ProducerWaitNanos uint64
	// Namespaces is the number of interned namespace names and NamespaceBytes their
	// accounted bytes (at most Config.NamespaceBytes); NamespacesDropped counts the names
	// sweeps dropped because nothing used them, NamespacesRefused the stored events and
	// predictions refused because the table was full (namespaces.go).
	Namespaces, NamespaceBytes           int64
	NamespacesDropped, NamespacesRefused uint64
	// DenseLandings is how many leading positions a sharded query's first wave probes
	// one by one: 8 while the recent queries' scores make that cheaper, else 16
	// (DESIGN.md, "The runtime").
	DenseLandings int
	// Shards has one entry per shard.
	Shards []ShardStats
}

// ShardStats describes one shard.
type ShardStats struct {
	// Applied counts deltas (membership changes and barrier tokens) applied; Batches
	// counts the batches they came in (on the locked index, the flushes of events that
	// changed the index: a removal inside a stride changes none); Probes counts query
	// probes answered.
	Applied, Batches, Probes uint64
	Entries, Memberships     int64
	// QueueLen is the ring's occupancy when Stats was called.
	QueueLen int
}

// Stats returns a snapshot of the counters.
func (e *Engine) Stats() Stats {
	st := Stats{
		Workers:                int(e.nlive.Load()),
		Events:                 e.events.Load(),
		RejectedParentNotFound: e.rejParent.Load(),
		RejectedInvalid:        e.rejInvalid.Load(),
		SkippedRemovals:        e.skippedRemovals.Load(),
		SkippedCopies:          e.skippedCopies.Load(),
		Queries:                e.queries.Load(),
		Abandoned:              e.abandoned.Load(),
		QueryRounds:            e.queryRounds.Load(),
		QueryProbes:            e.queryProbes.Load(),
		WalkFallbacks:          e.walkFallbacks.Load(),
		DenseLandings:          int(e.dense.Load()),
		Namespaces:             e.ns.count.Load(),
		NamespaceBytes:         e.ns.bytes.Load(),
		NamespacesDropped:      e.ns.dropped.Load(),
		NamespacesRefused:      e.ns.refused.Load(),
		Shards:                 make([]ShardStats, len(e.shards)),
	}
	if e.cfg.LockedIndex {
		// The locked shard's counters are its table's, and the block and event counts
		// are plain words its appliers change under the write lock: read under the
		// read lock.
		e.locked.RLock()
		defer e.locked.RUnlock()
		st.Events += e.lockedEvents
		st.SkippedRemovals += e.lockedSkipped
	}
	for t := range st.TierBlocks {
		st.TierBlocks[t] = e.env.Blocks(worker.Tier(t))
		st.Blocks += st.TierBlocks[t]
	}
	for i, s := range e.shards {
		rs := s.Ring().Stats()
		st.ProducerWaits += rs.FullWaits
		st.ProducerWaitNanos += rs.WaitNanos
		c := s.Counters()
		ss := ShardStats{
			Applied:     c.Applied,
			Batches:     c.Batches,
			Probes:      c.Probes,
			Entries:     c.Entries,
			Memberships: c.Memberships,
			QueueLen:    s.Ring().Len(),
		}
		st.Shards[i] = ss
		st.Memberships += ss.Memberships
		st.IndexEntries += ss.Entries
		st.IndexBytes += c.Bytes
	}
	return st
}
