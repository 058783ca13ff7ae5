// Package server is kvindex serve: it follows every configured engine's KV-event stream
// (one subscriber per engine and data-parallel rank, package subscriber) into one index
// (package engine) and answers routing queries over HTTP.
//
// # First use
//
// From the command line, `kvindex serve --engine endpoint=tcp://HOST:5557,model=NAME`
// (or --config FILE, the JSON below). In a program, New(cfg, Options{}), Start, and
// Shutdown at the end; Options.Index serves an engine the program fills itself. A
// router then POSTs {"model": NAME, "tokens": [...]} to /v1/match and routes to
// "pick" (the Example), or calls the gRPC API (--grpc ADDR; package client).
//
// # What it owns
//
// The engine, the subscribers, the HTTP server (and, when configured, the gRPC server),
// the discovery goroutines (one per source), a Prometheus registry, and with
// Options.Snapshot the warm restart (snapshot.go: the index restored by New from one
// atomic file, written every interval and by Shutdown, each worker resuming from the
// checkpoint that travels with its blocks), with Options.Replica the NATS replica feed
// (replica.go: a fabric.Replica of a kvindex relay's stream, its snapshot, workers and
// kvindex_stream_* series). kvindex serve parses flags into Config and Options; the
// rest is here. Nothing else
// writes the engine: each worker's events come from its own subscriber goroutine, in
// order; removing an engine stops its subscriber before its workers leave the index.
//
// # Who may call it
//
// New (validates, takes a discovery file's first list; starts nothing), Start (listens,
// starts the subscribers, the discovery sources and the HTTP server), Shutdown (drains;
// idempotent; call it even after a failed Start), AddEngine, RemoveEngine, SetEngines and
// Reload (engines that change at runtime, below). Errors delivers fatal failures. All
// methods are safe for concurrent use.
//
//	engines (vLLM/SGLang PUB + ROUTER) --zmq--> subscriber goroutines --Apply--> engine
//	HTTP clients --> net/http goroutines --FindMatchesIn / Status / Stats--> (read only)
//	admin API, SIGHUP, discovery --SetEngines--> (engMu) new fleet; subscribers start/stop
//
// Shutdown order: /readyz turns 503 and engines stop changing, the gRPC server and then
// the HTTP server stop accepting and wait for in-flight calls (DrainTimeout, then they
// are cut), the discovery sources and the subscribers stop, the engine closes.
//
// # Lock order
//
// Handlers take no server lock on the query path: they read the fleet (an immutable
// snapshot behind an atomic pointer), the engine (safe for concurrent use) and the
// subscribers' statuses (each copied under its own lock, package subscriber). The
// mutexes, outermost first; a lock is only ever taken under one listed before it:
//
//	engMu (engines.go)      engine changes; under it: subscribers started and stopped
//	                        (their own locks), fleet published
//	logMu (diagnose.go)     the problem log; under it: subscribers' statuses
//	trust.mu (trust.go)     the trust refresh; under it: subscribers' statuses
//	queryWindow.mu,         leaves: nothing is taken under them
//	resyncGate.mu,
//	admission.mu (admit.go)
//
// engMu, logMu and trust.mu are never held together: the diagnose and trust loops read
// the fleet through its atomic pointer, never under engMu.
//
// # The relay
//
// relay.go composes kvindex relay as New composes serve: its subscribers hand their
// events to a fabric.Publisher instead of an engine, and its /metrics shares serve's
// per-worker series (workerSeries, metrics.go) and build-info gauge.
//
// # Reference
//
// The user reference (the configuration file, the HTTP, gRPC and Mooncake APIs, tiers,
// engines that change at runtime, diagnostics and trust states) is docs/serve.md.
package server
