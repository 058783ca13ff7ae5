// Package engine is kvindex's public API: the index that tells a router, for a request's
// per-block content hashes, how many leading blocks each inference worker holds.
//
// # First use
//
// New(Config{}) (every zero field is a default), then, for each worker, its cache events
// in the order it emitted them: Store or StoreUnder for blocks it cached, Remove for
// blocks it evicted, Clear when it dropped everything; an ingester applies a decoded
// batch with ApplyBatch. A router cuts a request's tokens into content hashes with
// hash.Blocks and asks FindMatches (or FindMatchesIn, for a model, adapter or salt
// namespace) who holds the longest prefix. Close releases the shard goroutines.
// Package subscriber feeds an Engine from vLLM/SGLang publishers; WriteSnapshot and
// Restore carry it across restarts. The Examples show each step. A router that sends a
// request to a worker may record it with Predict: until the worker's events arrive,
// queries count the prediction (Match.Predicted says how much of a score it is), and
// for workers that publish no events predictions are the whole index (predict.go).
// Engines that offload to host memory or disk publish events per tier (Event.Tier,
// EventCopied); a match then gives its length per tier (Match.Tiers) and a weighted
// score (Match.Weighted; tiers.go). Hybrid models (sliding-window or Mamba layers beside
// full attention) declare their KV-cache groups with an EventGroups event; a match is
// then the longest cut every group accepts (groups.go). Digest gives an
// order-independent digest of what a worker holds, per namespace too, so that replicas
// fed the same events can tell which workers they disagree on (digest.go).
//
// # What it owns
//
// An Engine owns the workers' state (which engine hashes each worker holds, at which
// position and prefix) and the positional index, partitioned over shard goroutines:
//
//	caller goroutines                         shard goroutines (one per Config.Shards)
//	Store/Remove/Clear/Apply/ApplyBatch       each owns a shard.Index (its token)
//	  worker mutex -> per-worker tables  ---> MPSC ring (bounded, backpressure) ---+
//	                                                                              v
//	FindMatches: prefix hashes, landings ---> token between two slices: read here,
//	                                          or query channel (probe batches) ---> answer
//	  <-------------- member lists (round 1), first misses per candidate (round 2)
//
// Ownership rules:
//
//   - Per-worker state (engine hash -> the key's block in a segment of consecutive
//     positions; per block the prefix, its engine hash count and held branch children;
//     the worker's hole count, digests, tier components and declared groups) is package
//     engine/internal/worker, owned by the goroutine holding that worker's mutex: the
//     caller applying one of its events, or a reader outside events (digests,
//     snapshots, a query's tiers and groups: lockWorker). On the locked index an
//     event's caller owns the worker by the index's write lock instead, from the moment
//     it locks the worker until it lets it go (lockLive, unlock), and readers outside
//     events take the worker's mutex and the read lock; queries read the tables of the
//     workers they score under the read lock (walkSparse), at the moment of the index
//     they read. A run of events (ApplyBatch), which lets the write lock go to queries
//     between events, also holds the worker's mutex and marks the worker busy, and a
//     single event that finds it busy waits for the run's end on that mutex
//     (lockLocked). Rejections (ErrParentNotFound, ErrInvalidEvent) are therefore
//     returned synchronously. The package takes a worker.Env (the seeds, the shard
//     count, the block counters, the registry's callback for tier components) instead
//     of the Engine; this package keeps the two protocols around it, events (apply.go)
//     and queries (query.go, walk.go, jump.go, answer.go, tune.go).
//   - Each key (namespace, position, prefix hash) belongs to one shard, chosen by its
//     fingerprint (a hash of the key keyed by the engine's random seed, which is also
//     the key's name in the shard's table). The table belongs to the holder of the
//     shard's token: the shard's goroutine, which applies the membership changes that
//     reach it through its ring, in each worker's event order, and answers the probe
//     batches sent on its channel; or a querying goroutine that takes the token between
//     two of the goroutine's slices of 16 changes to read its own batch there, which it
//     does unless the shard is a quarter of its ring behind (then it sends the batch
//     and waits, so that queries that never block cannot keep the CPUs from the events).
//     Package shard is that actor whole (table, run loop, deltas, barrier acks, probe
//     batches); on the locked index the engine's RWMutex is the token (shard.Env.Locked).
//   - A worker's size and gap flag are atomics written under its mutex and read by
//     queries without it.
//   - A worker that declared KV-cache groups keeps their blocks in its own per-group
//     tables (worker.Hybrid; the rules in groups.go), owned like the rest of its state by
//     the holder of its mutex;
//     queries read them under that mutex. The list of such workers is copied on write
//     under the registry's mutex and read by queries with one atomic load, so dense
//     workers pay nothing for groups.
//   - The predictions (predict.go; the table is package engine/internal/predict) are
//     one table behind an RWMutex, owned by its holder in every mode: Predict and the
//     events of workers with predictions write it, queries read it. An event takes it
//     after its worker's mutex, never before.
//   - The worker registry (names, ids, the free ids) belongs to the holder of regMu;
//     its id -> worker cells are atomics read by queries without it, and the array of
//     cells is replaced, never written past its length, when it grows.
//   - The namespace table's ids and free lists belong to the holder of its mutex, a
//     sweep to the holder of its sweep mutex; its name -> id map (a sync.Map) is read
//     without a lock (namespaces.go).
//   - A query's workspace (the pooled query, its probe batches) belongs to the calling
//     goroutine, except a batch while a shard answers it (shard.Batch); an outbox (the
//     deltas of the events being applied) belongs to whoever holds the worker it is
//     lent to. The barrier table belongs to the holder of its mutex (shard.Barriers).
//   - Counters (Stats) are atomics: each written by the owner of what it counts, read
//     by anyone.
//
// With -tags invariants (package internal/invariants) owner-only methods check that
// their goroutine holds the worker's mutex or the shard's token. TestOwnersRace (run
// by go test -race) checks the rules against the race detector: for a worker's state, a
// shard's table, a locked index's worker tables (an applier without the write lock
// beside a query), the predictions and the registry, two goroutines that are not the
// owner touching the state at once are reported as a data race, and the owner's own
// accesses are not.
//
// # Who may call what
//
// Every method of Engine is safe for concurrent use. A worker's events must be applied
// in the order the worker emitted them (calls for one worker are serialised by its
// mutex in arrival order). Barrier makes every event whose call returned before it
// visible to every query that starts after it returns; without a barrier, a query sees
// each shard's state at some moment during the query. A worker whose event is still on
// its way through the shards is scored from what the probes read of it, which may mix
// its state before and after that event: the shards apply an event's deltas each in its
// own time, and jump search takes the gap flag the event leaves (a query can then credit
// the worker with a block the event is removing, up to what it held before the event,
// or miss one it is storing). Answers at rest, and every answer after a Barrier, are
// exact; the locked index applies an event's table changes, deltas and flag under one
// write lock, so its queries see each worker between two of its events.
//
// # Exactness
//
// Answers equal the contract's reference model (a radix tree over content hashes
// rebuilt after every event) at every shard count and jump size, up to 64-bit collisions
// of the prefix chain or of the keyed fingerprint (DESIGN.md, "The prefix chain" and
// "Exactness of fingerprints"). The prefix chain is the engine's own, keyed by a secret
// per engine and computed about five times faster than SPEC's XXH3 chain (package engine/internal/chain;
// Config.SpecChain selects SPEC's, on which FindMatchesByPrefix answers a query given
// by its rolling prefix hashes, Dynamo's and Mooncake's sequence hashes). Every table keyed by client-steerable values is
// seeded per engine, so a client cannot aim keys at one probe run. The jump search only skips a stride for a
// worker whose held keys are prefix-closed (no holes), which the worker's state tracks
// exactly; DESIGN.md has the argument. Config.LockedIndex runs the index behind one
// readers-writer lock instead of shard goroutines, keeping only the positions its
// queries probe: a supported mode for small machines, whose events apply on their
// callers' goroutines and whose queries read the index and the workers' tables directly
// (Config.LockedIndex says when to choose it).
package engine
