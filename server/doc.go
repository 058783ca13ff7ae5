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
// The engine, the subscribers, the HTTP server (and, when configured, the gRPC server)
// and a Prometheus registry. Nothing else
// writes the engine: each worker's events come from its own subscriber goroutine, in
// order.
//
// # Who may call it
//
// New (validates; builds but starts nothing), Start (listens, starts the subscribers
// and the HTTP server), Shutdown (drains; idempotent; call it even after a failed
// Start). Errors delivers fatal failures. All methods are safe for concurrent use.
//
//	engines (vLLM/SGLang PUB + ROUTER) --zmq--> subscriber goroutines --Apply--> engine
//	HTTP clients --> net/http goroutines --FindMatchesIn / Status / Stats--> (read only)
//
// Shutdown order: /readyz turns 503, the gRPC server and then the HTTP server stop
// accepting and wait for in-flight calls (DrainTimeout, then they are cut), the
// subscribers stop, the engine closes.
//
// # Configuration (JSON; unknown fields are errors; zero values take defaults)
//
//	{
//	  "listen": "127.0.0.1:8080",       HTTP address
//	  "policy": "longest-prefix",       or "round-robin", "random"
//	  "block_size": 16,                 default for engines that set none
//	  "max_body_bytes": 1048576,        "max_query_blocks": 65536,
//	  "query_timeout": "2s",            "drain_timeout": "10s",
//	  "grace_period": "60s",            unreachable this long: worker removed ("-1s": never)
//	  "replay_timeout": "5s",           "reconnect_min": "100ms", "reconnect_max": "5s",
//	  "resync_interval": "30s",
//	  "max_message_bytes": 16777216,    a larger ZeroMQ message from an engine is refused
//	  "index": {"shards": 0, "jump_size": 0, "queue_size": 0,
//	            "prediction_ttl": "2s",             predictions without ttl_ms
//	            "predictions_per_worker": 64, "predicted_blocks": 1048576},
//	  "grpc": {"listen": "127.0.0.1:9090",    gRPC API address ("" or absent: no gRPC)
//	           "max_message_bytes": 4194304, "max_concurrent_streams": 128},
//	  "engines": [{
//	    "endpoint": "tcp://10.0.0.7:5557",          PUB endpoint of rank 0 ("": an engine
//	                                                without events, worker required)
//	    "replay_endpoint": "tcp://10.0.0.7:5558",   ROUTER endpoint of rank 0 ("" = no replay)
//	    "worker": "pod-7",                          default: the endpoint
//	    "model": "llama-3-8b",                      queries name it
//	    "block_size": 16,
//	    "dp_ranks": 2, "dp_rank_start": 0,          rank r: port + r, worker "pod-7#dp<r>"
//	    "topic": "", "bind": false,                 bind: the engine connects to us
//	    "media": ["", "GPU"], "skip_extra_keys": false,
//	    "kv_group_kinds": ["full_attention", "mla_attention"],   hybrid models: groups indexed
//	    "kv_groups": [0],                           or by group_idx (overrides the kinds)
//	    "hash_check": {"seed": "0", "algo": "sha256", "sample_every": 1}
//	                                                check vLLM's block hashes (algo: the
//	                                                engine's prefix_caching_hash_algo,
//	                                                "sha256" or "sha256_cbor")
//	  }],
//	  "diagnose": {"no_events_after": "2m", "idle_after": "5m", "window": "1m",
//	    "parent_miss_rate": 0.05, "unmatched_rate": 0.95, "min_samples": 8,
//	    "log_interval": "5m"}
//	}
//
// Worker ids: the configured worker (or the endpoint) when dp_ranks is 0; with dp_ranks
// set, every rank r is "<worker>#dp<r>", rank 0 included. Engines of one model must share
// a block size; worker ids and endpoints must be unique.
//
// # HTTP API
//
//	POST /v1/match    {"model": "llama-3-8b", "tokens": [1, 2, ...]}
//	                  or {"model": ..., "content_hashes": [123, "456", "0x1c8"]}
//	                  optional: "namespace" ("lora=NAME", "salt=SALT", kvevents' format)
//	                  or "lora_name" / "cache_salt"; "policy"; with tokens, "extra_keys":
//	                  per-block lists of multimodal identifiers (extrakeys.go); "record":
//	                  true records the pick as a prediction (as /v1/routed, default TTL).
//	   200 {"model": "llama-3-8b", "namespace": "model=llama-3-8b;", "blocks": 3,
//	        "matches": [{"worker": "pod-7#dp0", "score": 3, "size": 1200, "predicted": 0,
//	                     "state": "live"}],
//	        "pick": {"worker": "pod-7#dp0", "policy": "longest-prefix", "score": 3,
//	                 "reason": "longest cached prefix"}, "recorded": true}
//	POST /v1/routed   {"model", "worker", "tokens" | "content_hashes", "ttl_ms"} (and the
//	                  namespace fields): the caller sent this request to worker, one of
//	                  the model's; the index counts it as a prediction (engine.Predict)
//	                  for ttl_ms (0: index.prediction_ttl, at most 600000).
//	   200 {"model", "namespace", "worker", "blocks", "ttl_ms"}
//	GET /v1/workers   {"workers": [{"worker", "endpoint", "model", "dp_rank", "state",
//	                  "synced", "connected", "size", "last_seq", "gaps": {"detected",
//	                  "recovered", "unrecoverable"}, "restarts", "replays", "duplicates",
//	                  "batches", "events": {...}, "rejected": {reason: n}, "lag_seconds",
//	                  "idle_seconds", "last_error", "diagnostics": {"problems": [{"code",
//	                  "message", "hint"}], "live_since", "last_event", "hash_check",
//	                  "skipped_kv_groups", ...}}],
//	                  "models": [{"model", "block_size", "queries", "unmatched",
//	                  "problems"}]}
//	GET /healthz      200 {"status": "ok"} while the index answers (a barrier), else 503
//	GET /readyz       200 {"ready": true} once every engine rank has synced or been
//	                  removed after the grace period (latched),
//	                  503 {"ready": false, "waiting": [...]} before, and while draining
//	GET /metrics      Prometheus text format
//
// Errors are {"error": "...", "code": "..."} with 400 (bad_json, unknown_model,
// bad_query, bad_policy, bad_namespace, query_too_long, bad_worker, unknown_worker,
// bad_prediction), 404, 405, 413 (body_too_large) or 503. Request bodies are read
// strictly: an unknown field, a key given twice, a wrong type or trailing data is
// bad_json.
//
// An engine without an endpoint ({"worker": W, "model": M}, or --engine
// worker=W,model=M) publishes no events: it runs no subscriber, is always pickable, and
// is known to the index only through predictions (state "approximate"). Queries name their namespace as the subscribers apply events:
// subscriber.Namespace(model, ns), so models never match each other.
//
// # gRPC API
//
// api/kvindexv1/kvindex.proto, served beside HTTP when "grpc"."listen" is set (kvindex
// serve --grpc ADDR), from the same engine and subscribers:
//
//	kvindex.v1.Index/Match     MatchRequest{model, tokens | content_hashes, namespace,
//	                           lora_name, cache_salt, policy} -> MatchResponse, as /v1/match;
//	                           errors INVALID_ARGUMENT, UNAVAILABLE, RESOURCE_EXHAUSTED
//	kvindex.v1.Index/Workers   -> WorkersResponse, as /v1/workers
//	kvindex.v1.Index/Routed    RoutedRequest{model, worker, tokens | content_hashes,
//	                           namespace, lora_name, cache_salt, ttl_ms} -> RoutedResponse,
//	                           as /v1/routed
//	grpc.health.v1.Health/Check  service "": liveness (/healthz);
//	                           service "kvindex.v1.Index": readiness (/readyz)
//
// The port is as exposed as the HTTP one, so a peer's resources are bounded: messages
// both ways (max_message_bytes, refused before they are decoded), streams per
// connection (max_concurrent_streams, announced in HTTP/2 SETTINGS), the header list
// (16 KiB), pings (more often than every 10 s closes the connection), and, as over
// HTTP, query blocks and query time. Calls are counted in /metrics as
// kvindex_grpc_requests_total{method, code}. There is no TLS of its own. Not in this version: a
// "routed" call for the index's predictions (the engine makes none yet).
//
// # Diagnostics
//
// Each worker's problems (subscriber.Problems: no_events, events_stopped,
// block_size_mismatch, parent_not_found, hash_mismatch) and each model's
// (unmatched_queries) appear in /v1/workers with a message and a hint, in /metrics as
// kvindex_worker_problem{worker,model,problem} and kvindex_model_problem{model,problem}
// (1 while active), and in the log: a warning when a problem appears, repeated at most
// every log_interval while it lasts, and an info line when it is over (checked every 10
// s). README.md, "When routing silently stops using the cache", says what to do about
// each.
//
// A worker is eligible for a pick while its subscriber is live or stale (connected and
// synced). "size" in /v1/workers is filled when the index implements WorkerSizer, else
// null; /v1/match always reports the matching workers' sizes.
package server
