// Package shard is one shard of the engine's positional index, the whole actor: its
// table from a key (namespace, position, prefix hash) to the set of workers that hold
// at least one block with that key (Index), the goroutine that owns it (Loop.Run), the
// deltas that reach it through its ring (Delta: membership changes and barrier
// tokens, encoded in 12 bytes), the barrier acknowledgements (Barriers), and the probe
// batches queries send it (Batch, with the scan scratch each batch carries).
//
//	event appliers (worker mutex held) --Delta--> ring --+
//	Barrier callers ---------------------OpBarrier-----> |--> Loop.Run: Index
//	queriers: Batch --> Queries channel, or Serve/Hold ->+      acks Barriers, answers Batch.Done
//
// # Ownership
//
// One owner, in every mode: the holder of the shard's table token. On a sharded engine
// that is Loop.Run's goroutine, which applies the ring's deltas in slices of 16 and
// answers the batches sent on its channel, or, between two slices, a querying
// goroutine that took the token to read its own batch (Loop.Serve) or, on a one-shard
// engine, to walk the table directly (Loop.Hold until Loop.Let). The locked engine
// (engine.Config.LockedIndex) runs no Run: its RWMutex is the token, written by event
// appliers under the write lock (Loop.ApplyLocked), read by any number of queriers
// under the read lock (Loop.Index); a scan's scratch belongs to the batch and not to
// the shard, as a querier that reads its own batch (Loop.Serve) needs. An Index has no
// locks and no atomics; a Loop's counters are atomics written by the table's holder
// and read by anyone (Loop.Counters, Loop.Applied); a locked shard's are its table's
// and two plain counts, written under the write lock and read under the read lock. A
// Batch belongs to its querier except while a shard answers it. Barriers and the ring
// are safe for concurrent use. In a -tags invariants build (package
// internal/invariants) the token's holder is recorded and every method that touches
// the table checks it, and the table checks its structure after every change
// (checkInvariants).
//
// # What it stores, and what it does not
//
// The index stores membership, not multiplicity: a worker that covers one prefix through
// three engine hashes is one member. The engine's per-worker state counts engine hashes
// per key and sends Add only on a key's 0 -> 1 transition for that worker and Remove only
// on 1 -> 0, so the index never sees duplicates. Add and Remove still report whether they
// changed anything, so the engine can assert that invariant in tests.
//
// # Layout
//
// A flat, pointer-free, open-addressing table with linear probing in Robin Hood order
// and backward-shift deletion (no tombstones, so probe lengths do not rot under churn),
// sized by package internal/table: any size, growing by half at load 13/16. It is keyed
// by a key's fingerprint (Hash: the engine's seeded hash of the whole key; keys come
// from prompts, so where they land must not be known outside), and a slot is 12 bytes:
//
//	fingerprint (two uint32 words) | m uint32
//
// m is 0 for an empty slot, the worker id + 1 for a key with one member (inline), or
// names the key's overflow set (top bit set) once a second member arrives; an overflow
// key's member count is its set's length. The fingerprint is split in two words so that
// a slot needs no 8-byte alignment (one uint64 and a uint32 would pad to 16). In the
// traces this project is tuned for, almost every key is held by one worker, so the
// common case allocates nothing per entry and the garbage collector has nothing to
// scan. A slot carries its own hash, so moving it (growth, deletion, Robin Hood swaps)
// needs no rehash. Two keys share a slot only if their
// fingerprints collide; DESIGN.md ("Exactness of fingerprints") gives the argument. See
// table_bench_test.go for the built-in map and github.com/dolthub/swiss measured on the
// same key and value shape.
//
// # Runs of changes
//
// The events the index is tuned for come in runs: on the trace-driven logs 98-99% of
// the events are removals that follow a removal by the same worker, and 98.5% of those
// remove the parent of the block removed just before (vLLM evicts a chain tail first).
// A run's changes still land one per key: keys are named by a seeded hash, so the
// blocks of one chain are spread over the whole table, and each change's probe starts
// with a cache miss (the conversation log's index is about 0.5 MB, the worker tables as
// much again: together past a core's L2). Profiled with an entry per position at steady
// state (the engine's locked index keeps only the positions its queries probe, so its
// events reach the table far less often; engine's BenchmarkEventRuns, 8 workers x 64
// chains of 64 blocks, a chain evicted tail first and one stored per batch), the table
// probes are most of the cost: the positional
// index 40% (add 23%, removal 17%), the workers' seq tables 33% (removal 21%, store
// 11%), most of it the first read of each probe.
//
// So apply reads ahead: before the changes of each group of touchGroup (16) deltas it
// reads their home slots (Index.touch), and the worker's store and removal do the same
// for the seq slots of each 16 engine hashes (package engine/internal/worker), as does
// the engine's ApplyBatch across a run of one worker's removed events of one block each
// (touchAhead), so that a run's misses overlap instead of following one another, and its
// probes then hit the cache. It changes no table, so exactness does not depend on it.
// Measured with the binaries before and after alternated in one run, process CPU time,
// on a 2-core machine shared with other work (load average 9-20):
//
//	engine's BenchmarkEventRuns, locked index unless said, -test.benchtime 10000x, CPU ns
//	per block op, medians of 3-6 rounds (a run evicted one removed event per block / coalesced):
//	  32k memberships:  per event 151 -> 141, coalesced 133 -> 121
//	  512k memberships: per event 495 -> 240, coalesced 484 -> 231
//	  512k, one shard:  per event 560 -> 403, coalesced 542 -> 317
//	kvindex replay --locked --ops trace_conversation.jsonl [--batch=false] --repeat 21
//	--json, block ops (query blocks included) per CPU second, medians of 6 rounds:
//	  one call per event 5.52M -> 7.91M, ApplyBatch 8.75M -> 8.89M,
//	  coalesced 9.88M -> 9.61M
//
// (coalesced: the log with each worker's consecutive removed events merged into one, and
// a stored event under the previous one's last block merged into it, as ChainIndex's
// coalesced driver is fed). On the conversation log, whose tables (about 1 MB) mostly
// fit the caches, the rounds spread by a third either way and no row differs beyond
// that; past the caches (512k) a run costs half as much.
//
// What it does not do is make a run cost one change per run: every block of a run still
// probes the seq table by its engine hash, and on the sharded index the positional
// index by its key. The worker side changes a run's segment once (a store's run joins
// its segment in one growth; a chain's tail evicted leaf first leaves it as one range,
// Worker.dropTailRun), and the locked index changes its positional index at the head
// and the anchors only. One holding change per run in the index as well needs a
// positional index that names segments, so that a query's probe of (position, prefix)
// finds the segment covering it, as SMG's ChainIndex, a run-compressed index
// (bench/peers/README.md), removes a contiguous range with one holding change. Jump
// search and the per-key membership would then read through a segment; the index does
// not do that yet.
package shard
