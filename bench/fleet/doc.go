// Package fleet load-tests kvindex serve with a simulated fleet of vLLM engines: N
// engines, each a real ZMTP PUB socket and replay ROUTER on 127.0.0.1, publish
// msgpack KV-event batches (the wire format of package kvevents) from a block-pool
// model into one serve, at a configured rate, while clients query /v1/match and the
// gRPC Index.Match. After each level it checks that nothing was lost: every worker
// applied its engine's last batch and holds exactly the blocks its engine's cache
// holds. `kvindex loadtest` is its command line; BENCHMARKS.md ("Fleet load test")
// has its figures.
//
// # What it owns
//
//	Fleet ──── N simEngines ── PUB listener ── per subscriber: reader (subscriptions)
//	   │           │                          └─ writer (queued live messages)
//	   │           ├── ROUTER listener ─── per DEALER: replay replies from the ring
//	   │           └── block pool + requester (owned by one driver goroutine)
//	   └─ D driver goroutines: publish to their engines in turn at rate/D
//	runner: queryLoad (open-loop match clients), prober (apply lag), sampler (serve's
//	        /proc), drain and check (/v1/workers against the engines' own counts)
//
// serve runs as a child process (the real binary, kvindex serve --config FILE: its RSS,
// CPU, file descriptors and goroutines are its own, read from /proc and /metrics) or
// in this process (server.Server; the figures then include the load generator), which
// is what the package's tests use: they need no binary.
//
// # Who may call it
//
// Run, once per Config; NewFleet, Drive, Stall/Resume and Close for a fleet of one's
// own (the tests). Drive must not run twice at once; Counts between Drives.
//
// # The engines
//
// An engine's PUB speaks ZMTP 3.0 (NULL mechanism) as libzmq does: it greets, sends
// READY (Socket-Type PUB), honours the subscriber's subscription messages (nothing
// goes to a connection before it subscribes, as a PUB filters), and queues live
// messages [topic, seq, payload] per connection up to FleetConfig.HWMBytes, dropping
// past it as a PUB at its high-water mark drops. Its ROUTER answers [b"", start_seq]
// with every buffered batch from start_seq on, [b"", topic, seq, payload] (vLLM
// v0.26.0's shape), then the end marker. Both are checked byte for byte by the
// subscriber's ZMTP guard, so a framing error here fails the run.
//
// Batches are vLLM's: one request per batch (a BlockRemoved of what its admission
// evicted, then a BlockStored of its new blocks with their token ids), in vLLM
// v0.26.0's map encoding by default. The block-pool model is in pool.go: multi-turn
// sessions over shared system prompts, LRU eviction of leaves, so caches fill and
// churn as a serving engine's do (a warm-up fills them before the first level).
//
// # What a level measures
//
// Published and applied batches per second, blocks applied per second, loss (batches
// published and never applied after the drain), gaps detected, recovered and not,
// replays run and served, PUB drops, workers not live, workers whose size differs from
// their engine's count; apply lag (a probe is a batch just published: its request's
// chain is polled on /v1/match until the engine's worker matches all of it, every
// ProbePoll at first and then every tenth of the time waited, so the lag is late by up
// to one poll, or 10%, and one query); match latency per API from
// each query's scheduled start (open loop: a queue behind a slow server counts); serve's
// peak RSS, fds and threads, goroutines at the end, CPU per wall second. A level holds
// with no loss, nothing stale, no size differing, lag p99 within MaxLag and the fleet
// publishing at least 95% of the offered rate.
//
// # Alternatives rejected
//
// zmq4's own PUB and ROUTER sockets for the engines: a zmq4 socket runs goroutines and
// a 10-slot channel per connection and allocates each frame; 2,048 of them would cost
// the load generator as much CPU as serve on a 2-core machine, and the point is to
// measure serve. The Python test publisher (subscriber/pubtest): one process per fleet
// and a command round trip per batch top out near a thousand batches a second. Package
// sim's mock engine: it models routing, not the wire, and changes with the simulator.
package fleet
