// Package bench measures index implementations side by side, in one process, on the same
// op stream: the sharded engine at several shard counts, the engine's LockedIndex
// baseline (the same positional index behind one readers-writer lock) and the classic
// mutex-guarded radix tree of package radix.
//
// # What is measured
//
//	op stream ([]oplog.Op) ──NewWorkload──▶ Workload: events (engine.Event, pre-converted),
//	                                         query contents, workers, checked queries
//
//	per Impl:  Verify            sequential replay, every query with an expected answer
//	                             checked after a Sync (an implementation that is wrong is
//	                             not worth timing)
//	           MeasureEvents     all events on a fresh index, one Apply call per event,
//	                             then Sync; with P producer goroutines, each owning a
//	                             disjoint set of workers, so per-worker order is
//	                             preserved; events/s, block ops/s (stored blocks and
//	                             removed seqs; queries are not counted, and not run),
//	                             mallocs/event; median of passes
//	           MeasureQueries    Q goroutines issuing the stream's queries for a fixed
//	                             time, either at rest (after a full pass) or under load:
//	                             one streamer applies the events in a loop meanwhile;
//	                             queries/s, p50/p99/p999 latency, events/s while loaded,
//	                             and for a sharded engine round trips and probes per
//	                             query (engine.Stats.QueryRounds, QueryProbes)
//	           MeasureMemory     heap growth (after GC) over one full pass divided by the
//	                             memberships held at its end (the sum of worker sizes)
//
// Block ops here are the ones the peer drivers count: the blocks of stored events and
// the seqs of removed ones. `kvindex replay` reports a different quantity under the same
// name: its block ops also count every query's content blocks (the trace-driven log has
// 263,010 event block ops and 160,845 query blocks), its clock also runs over the queries
// and barriers, and it applies the events between two queries with one ApplyBatch call.
// Its block ops/s is therefore about 1.6x this harness's for the same engine speed: on the
// trace-driven log, `kvindex replay --locked --batch=false` gave 8.0-8.6M of its block ops
// per second, which is 5.0-5.4M event block ops/s, where MeasureEvents gave 5.4M (one run,
// alternated); batching (`--batch=true`, 9.8-10.1M) explains the rest.
//
// Parsing and conversion happen once, before any timing. The only time spent outside
// the implementations inside a timed region is the loop over the pre-converted events
// (and, for queries, two clock reads per call).
//
// # Bounded load
//
// The streamer under load starts on an empty index and loops over the stream; before
// every loop but the first it sends a remove_worker for every worker, so that each loop
// means what the first one did. The queries wait (on a channel) until the first loop has
// filled the index; the timed window then runs until Options.Duration has passed or the
// streamer has done Options.MaxLoops more loops, whichever comes first. The query side
// also stops when the streamer does, so no query is ever measured against an idle index
// by accident. Queries that land just after a reset see a partly filled index, as a
// router does after its workers restart.
//
// # Caveats
//
// Allocation counts come from runtime.MemStats and are process-wide: they include the
// shard goroutines' allocations (which is right: they are the cost of an event) and,
// under load, the streamer's. Bytes per membership include fixed costs (rings, goroutine
// stacks, scratch) that small workloads do not amortise. On a machine with few cores the
// engine's shard goroutines compete with the producers and queriers for CPUs.
//
// # What it showed
//
// BENCHMARKS.md has the tables, each with its command (`kvindex bench --ops
// ../shared/conformance/trace_conversation.jsonl --shards 1,2,4,8 --markdown` for the
// trace-driven log). In short: the radix tree answers queries fastest, because it stops
// walking where the last worker drops out while the engine pays a scatter/gather round
// trip; the sharded engine keeps events flowing while queries run, where the baselines'
// one lock starves the writer; the engine allocates nothing per event, the tree five.
//
// # Peers
//
// Peer, RunPeer and CompareRounds put other projects' indexes in the same table: a peer is
// a replay driver binary of bench/peers (Rust, for SMG's ChainIndex and PositionalIndexer,
// built by `make bench-peers` from sources the user supplies, never by CI) that runs the
// measurements above on the op log itself, one thread for the events, and prints them as
// JSON. CompareRounds runs every Go implementation (one producer) and every peer once per
// round, rounds alternating, verification in the first round only; WritePeerTable prints
// the medians, one row per implementation (`kvindex bench --ops LOG --peers DIR`). Memory
// is measured differently on the two sides and the table says which: live Go heap growth
// for ours, a counting allocator's live bytes and RSS growth for the peers.
//
// Like for like: each side also replays the log coalesced (Workload.Coalesced: consecutive
// removals of one worker in one call, a store that extends the one before it merged into
// it; the drivers' --coalesce merges by the same rule), and every events pass reads the
// process's CPU clock beside the wall clock. WritePeerTable then gives every
// implementation's per-event and coalesced rates in wall and CPU time, and its ratios to
// ChainIndex's per event to per event and coalesced to coalesced (a batching replay of
// ours is never set against a peer that applies one event per call), find-matches p50 at
// rest to its p50, and bytes per membership (our heap, a peer's RSS) to its RSS.
//
// Nothing here is imported by the engine: the package is a benchmark-only dependency of
// cmd/kvindex.
package bench
