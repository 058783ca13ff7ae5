// Package worker is the engine's per-worker bookkeeping: for each inference worker,
// which engine hashes it holds, at which key (namespace, position, prefix hash), and the
// key segments that tell whether its held keys are prefix-closed (its holes), with its
// tier components and its declared KV-cache groups. The engine (package engine) keeps
// the two protocols around it: events (apply.go: locking a worker, checking an event,
// handing the deltas it leaves in the worker's Outbox to the shards' rings) and queries
// (query.go and its phases: reading the published atomics, and a worker's tables under its mutex).
//
// # What it owns, and who may call what
//
// One owner, in every mode (sharded or locked index, with or without tiers and groups):
// a Worker's tables (seq table, key segments and key index, holes, digests), its tier
// components' (tiers.go) and its groups' (groups.go) belong to the goroutine that holds
// the Worker's mutex (Lock; a component's: its primary's). Every method says which
// kind it is:
//
//   - "Holder of w's mutex": the owner only. On the event side that is the caller
//     applying one of the worker's events, which also holds the Outbox lent to the
//     worker (SetOutbox) and the deltas in it; a query that reads a worker's tables
//     (the engine's tierLengths and hybridMatch) takes the mutex too. In an invariants
//     build (package internal/invariants) CheckOwner and MustCheck panic when the
//     calling goroutine does not hold it.
//   - "Concurrent": any goroutine, without the mutex. These read only what is immutable
//     after creation (Name, ID, Tier) or published atomically by the owner at its
//     flush (Publish: Size and Gappy, which queries read to score and to decide whether
//     they may jump over a stride; the tier link and its components, TotalSize), and
//     Env's read-only fields.
//
// The locked exception: on the engine's locked index (Config.LockedIndex) the owner
// publishes (Publish) under the engine's write lock together with the deltas, so that a
// query under the read lock sees a worker's gap flag and its memberships of one moment.
// Ownership does not change: the write lock is taken by the mutex's holder, inside its
// hold.
//
// Env is the engine's side of the contract (pebble's commitEnv is the model): the
// seeds, the shard count, the block counters Publish updates and Register, the
// registry callback that names a new tier component. A worker keeps no pointer to it;
// every method that needs it takes it, by pointer.
//
// # The numbers behind the layout
//
// Per held engine hash a worker keeps a 12-byte seq slot and its control byte
// (tables.go) and, per key, a block of a segment (keys.go): its prefix and a meta
// byte, 9 bytes in the segment's chunk of an arena, with a 20-byte header and a 6-byte
// key-index slot per segment (a run of up to 64 consecutive positions of one chain,
// inside one stride). On the trace logs the arena and the headers come to 11.1-12.7
// bytes per membership, free chunks and growth slack included
// (BenchmarkReplayCeiling's exact-records-B/membership), and a segment averages 45-55
// blocks. A Worker is 352 bytes (a size class) whatever it holds: its Outbox (176
// bytes, and the delta buffers behind it) is lent only while it applies events, so
// 100,000 idle workers keep none. Each membership change leaves as one 12-byte
// shard.Delta. A store or removal reads the home seq groups of each 16 engine hashes
// of its run before it changes the first of them (seqTable.touch; the engine's
// ApplyBatch reads ahead across a run of removed events with TouchSeqs; package
// shard's doc, "Runs of changes", has the measurement), so that the run's cache misses
// overlap. The event path allocates nothing in steady state (the engine's tests assert
// 0 allocations per event), so its methods take the Env by pointer and use no
// interface and no closure per block.
//
// Nor a call per block where a run goes through: Go's ABI leaves every register to the
// caller to save, so a call in a loop reloads the loop's state after it. A store's run
// inserts its seqs 16 at a time (seqTable.insertRun, after one reserve for the run) and
// steps its prefixes inline (chain.Mults); a removal deletes 16 seqs at a time
// (seqTable.delRun) and drops a chain's tail, evicted leaf first, from its segment as one
// range (Worker.dropTailRun); a removal of one seq, the trace logs' usual event, takes
// its own short path (removeOne). One pass of the conversation trace on the locked
// index, from empty (scripts/instructions.sh, cachegrind): coalesced events 128.6M ->
// 84.9-92.8M instructions, one call per event 242.5M -> 196.3-201.4M.
package worker
