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
// # Configuration (JSON; unknown fields are errors; zero values take defaults)
//
//	{
//	  "listen": "127.0.0.1:8080",       HTTP address
//	  "probe_listen": "",               /healthz and /readyz only, plain HTTP (probes.go)
//	  "policy": "longest-prefix",       or "round-robin", "random"
//	  "block_size": 16,                 default for engines that set none
//	  "max_body_bytes": 1048576,        at most 64 MiB; "max_query_blocks": 65536,
//	  "max_matches": 1024,              matches in one answer at most (top_k asks fewer)
//	  "auth": {"tls_cert_file": "", "tls_key_file": "",   TLS for HTTP and gRPC (auth.go)
//	           "client_ca_file": "",                       mutual TLS: client certificates
//	           "token_file": "",                           bearer tokens, one a line
//	           "admin_token_file": "",                     the admin role's tokens
//	           "allow_unauthenticated": false},            needed on a non-loopback address
//	                                                       that authenticates nobody
//	  "limits": {"max_connections": 1024,         per API (HTTP, gRPC); closed on accept past it
//	             "max_source_connections": 64,    ... per source IP
//	             "max_unauthenticated_connections": 512, "handshake_timeout": "10s",
//	             "in_flight_bytes": 134217728,    request bytes held at once, HTTP and gRPC
//	             "conn_in_flight_bytes": 16777216, ... per connection (admit.go)
//	             "client_in_flight_bytes": 67108864, ... per source IP
//	             "min_body_rate": 65536, "body_grace": "2s", "call_timeout": "30s",
//	             "max_connection_age": "10m"},
//	  "runtime_engines": {"max_engines": 4096, "allow_bind": false,   engines added at
//	             "ipc_dir": "", "dial_allow": []},                   runtime (runtime.go)
//	  "query_timeout": "2s",            "drain_timeout": "10s",
//	  "grace_period": "60s",            unreachable this long: worker removed ("-1s": never)
//	  "replay_timeout": "5s",           "reconnect_min": "100ms", "reconnect_max": "5s",
//	  "resync_interval": "30s",         "tail_check": "5s" (a quiet stream's one catch-up)
//	  "max_message_bytes": 16777216,    a larger ZeroMQ message from an engine is refused
//	  "max_concurrent_replays": 32,     replays at once over all engines (a stall makes
//	                                    every engine's subscriber replay at the same time)
//	  "index": {"shards": 0, "jump_size": 0, "queue_size": 0,
//	            "locked": false,            true: one locked index, no shard goroutines
//	            "prediction_ttl": "2s",             predictions without ttl_ms
//	            "predictions_per_worker": 64, "predicted_blocks": 1048576,
//	            "spec_chain": false},       true: SPEC's XXH3 prefix chain, key-free snapshots
//	  "grpc": {"listen": "127.0.0.1:9090",    gRPC API address ("" or absent: no gRPC)
//	           "max_message_bytes": 4194304, "max_concurrent_streams": 128},
//	  "tiers": {"NVME": "disk"},        media -> "device" | "host" | "disk", over the
//	                                    defaults (# Tiers); at most 64
//	  "tier_weights": [1, 0.75, 0.25],  a device, host and disk block's value in
//	                                    "weighted" (# Tiers)
//	  "engines": [{
//	    "endpoint": "tcp://10.0.0.7:5557",          PUB endpoint of rank 0 ("": an engine
//	                                                without events, worker required)
//	    "replay_endpoint": "tcp://10.0.0.7:5558",   ROUTER endpoint of rank 0 ("" = no replay)
//	    "worker": "pod-7",                          default: the endpoint
//	    "model": "llama-3-8b",                      queries name it
//	    "block_size": 16,
//	    "dp_ranks": 2, "dp_rank_start": 0,          rank r: port + r, worker "pod-7#dp<r>"
//	    "dp_rank": 1,                               or: this one rank, on endpoint itself
//	                                                (worker "pod-7#dp1"; not with dp_ranks)
//	    "topic": "", "bind": false,                 bind: the engine connects to us
//	    "media": ["", "GPU"],                       only these media ("*": all; default:
//	                                                every medium with a tier)
//	    "skip_extra_keys": false,
//	    "kv_group_kinds": ["full_attention", "mla_attention"],   hybrid models: groups indexed
//	    "kv_groups": [0],                           or by group_idx (overrides the kinds)
//	    "kv_hybrid": false,                         or every group under its reuse rule
//	    "kv_group_specs": [{"kind": "full", "block_size": 16},   declared, in group_idx
//	      {"kind": "sliding_window", "block_size": 16, "window": 4096}],   order (implies
//	                                                kv_hybrid; kept across warm restarts)
//	    "hash_check": {"seed": "0", "algo": "sha256", "sample_every": 1}
//	                                                check vLLM's block hashes (algo: the
//	                                                engine's prefix_caching_hash_algo,
//	                                                "sha256" or "sha256_cbor")
//	  }],
//	  "discovery": {                    engines found at runtime (# Engines that change
//	                                    at runtime)
//	    "file": {"path": "/etc/kvindex/engines.json", "interval": "1s"},
//	    "kubernetes": {"selector": "app=vllm", "namespace": "llm",   default: kvindex's own
//	      "port_annotation": "kvindex.io/kv-events-port",          the PUB port (required)
//	      "replay_port_annotation": "kvindex.io/kv-replay-port",
//	      "model_annotation": "kvindex.io/model", "dp_ranks_annotation": "kvindex.io/dp-ranks",
//	      "require_ready": false, "max_pods": 10000,
//	      "engine": {"model": "llama-3-8b", "block_size": 16},     every pod's engine
//	      "api_server": "", "token_file": "", "ca_file": ""}},     in-cluster defaults
//	  "diagnose": {"no_events_after": "2m", "idle_after": "5m", "window": "1m",
//	    "parent_miss_rate": 0.05, "unmatched_rate": 0.95, "min_samples": 8,
//	    "log_interval": "5m"},
//	  "trust": {"off": false,           true: the index scores every worker (# Trust states)
//	    "interval": "1s"}               how often problems are diagnosed for it
//	}
//
// Worker ids: the configured worker (or the endpoint) when dp_ranks is 0; with dp_ranks
// set, every rank r is "<worker>#dp<r>", rank 0 included. Engines of one model must share
// a block size; worker ids and endpoints must be unique.
//
// # Tiers
//
// Engines that offload publish events per medium; each medium maps to a storage tier
// of the index. The defaults (subscriber.DefaultTiers):
//
//	device   "" (no medium), "GPU"
//	host     "CPU" (vLLM's offloading connector), "CPU_TIER1", "CPU_PINNED" (SGLang)
//	disk     "STORAGE" (vLLM 0.27+), "FS", "OBJ" (vLLM 0.26), "DISK" (vLLM, SGLang),
//	         "CPU_TIER2", "EXTERNAL" (SGLang)
//
// "tiers" adds or changes entries (--tiers MEDIUM=TIER,...); an engine's "media", when
// given, lists the only media it accepts, each needing a tier ("*": every medium,
// those without a tier on the device tier). Events of other media are dropped
// (rejected reason "medium"). Tiers hold independent copies: vLLM removes a block per
// medium, and the copies on the other tiers stay. vLLM's offloading connector names
// what it offloaded by engine hash only (token_ids empty, no parent): such a store on a
// host or disk medium copies the worker's own blocks of those hashes to that tier
// (kind "copied" in the counters); one on the device is dropped ("hash_only"). A copy
// of a hash the worker no longer holds on any tier (its device removal arrived first)
// has no position to take and is skipped, counted in
// kvindex_index_skipped_copies_total: a steadily growing count means host or disk
// prefixes are under-counted. So is an offloaded block size that is a multiple of the
// device's: vLLM names such a block by one of the device blocks it spans, and only
// that one is copied.
//
// Every medium with a tier is indexed by default. A fleet that does not offload
// publishes device media only and sees nothing change. One that offloads now sees its
// host and disk blocks counted: "score" includes them (so a router that sorts by
// "score" itself may prefer a long disk prefix to a shorter device one: sort by
// "weighted", take the server's order, or read tiers[0]), and "media": ["", "GPU"]
// restores the device-only index. Predicted blocks (/v1/routed) count as device blocks.
//
// A match's "tiers" are its leading blocks held in device memory, in device or host
// memory, and on any tier (cumulative; tiers[2] == score). "weighted" values each
// leading block at the weight of the fastest tier holding it: w[0]*tiers[0] +
// w[1]*(tiers[1]-tiers[0]) + w[2]*(tiers[2]-tiers[1]), with the weights "tier_weights"
// (three numbers in [0, 1]; default NVIDIA Dynamo's 1, 0.75, 0.25; llm-d uses 1 for
// GPU, 0.4 for CPU and shared storage, 0.2 for object stores) or a request's own
// "tier_weights". Matches come best first: weighted descending, then score descending,
// then worker id; the longest-prefix pick is the first pickable one, ties going to the
// smaller size.
//
// # HTTP API
//
//	POST /v1/match    {"model": "llama-3-8b", "tokens": [1, 2, ...]}
//	                  or {"model": ..., "content_hashes": [123, "456", "0x1c8"]}
//	                  optional: "namespace" ("lora=NAME", "salt=SALT", kvevents' format)
//	                  or "lora_name" / "cache_salt"; "policy"; with tokens, "extra_keys":
//	                  per-block lists of multimodal identifiers (extrakeys.go); "record":
//	                  true records the pick as a prediction (as /v1/routed, default TTL);
//	                  "tier_weights": [1, 0.5, 0] this request's weights (# Tiers);
//	                  "pick": true counts the pick as routed (its load goes against the
//	                  worker until /v1/finished names "request_id", given or returned in
//	                  the pick); "load": {"pod-7": {"waiting": 3, "kv_util": 0.4, ...}}
//	                  the caller's own view of the workers' load (pick.go, WorkerLoad;
//	                  a worker the model does not serve is 400 unknown_worker);
//	                  "top_k": at most this many matches (default and cap max_matches).
//	                  The policies "cost" and "scorer" (package route, the code kvindex
//	                  sim runs) weigh that load against the cache.
//	   200 {"model": "llama-3-8b", "namespace": "model=llama-3-8b;", "blocks": 3,
//	        "matches": [{"worker": "pod-7#dp0", "score": 3, "tiers": [1, 3, 3],
//	                     "weighted": 2.5, "size": 1200, "predicted": 0, "state": "live",
//	                     "trust": "exact"}],
//	        "tier_weights": [1, 0.75, 0.25],
//	        "pick": {"worker": "pod-7#dp0", "policy": "longest-prefix", "score": 3,
//	                 "weighted": 2.5, "reason": "longest cached prefix"},
//	        "recorded": true, "matches_total": 1}
//	POST /v1/routed   {"model", "worker", "tokens" | "content_hashes", "ttl_ms"} (and the
//	                  namespace fields): the caller sent this request to worker, one of
//	                  the model's; the index counts it as a prediction (engine.Predict)
//	                  for ttl_ms (0: index.prediction_ttl, at most 600000).
//	                  With "request_id" it also counts the request's load, as "pick".
//	   200 {"model", "namespace", "worker", "blocks", "ttl_ms"}
//	POST /v1/finished {"request_id", "first_token": false}: the request got its first
//	                  token (its prefill leaves the load) or is done (all of it leaves).
//	   200 {"request_id", "known"}
//	GET /v1/workers   {"workers": [{"worker", "endpoint", "model", "dp_rank", "state",
//	                  "trust", "synced", "connected", "size", "last_seq", "gaps": {"detected",
//	                  "recovered", "unrecoverable"}, "restarts", "replays", "duplicates",
//	                  "batches", "events": {...}, "rejected": {reason: n}, "lag_seconds",
//	                  "idle_seconds", "last_error", "diagnostics": {"problems": [{"code",
//	                  "message", "hint"}], "live_since", "last_event", "hash_check",
//	                  "skipped_kv_groups", ...}, "digest": {"sum", "blocks",
//	                  "namespaces": {ns: {"sum", "blocks"}}}}],
//	                  "models": [{"model", "block_size", "queries", "unmatched",
//	                  "problems"}]}
//	POST /v1/workers/{worker}/resync (a NATS replica only; else 501 not_supported):
//	                  the replica forgets the worker and replays its messages from the
//	                  stream's start up to its position (fabric.Replica.Resync); 503
//	                  resync_failed, the worker untouched, on a stream whose retention
//	                  dropped its first messages
//	   200 {"worker", "messages", "applied", "complete", "digest"}
//	GET /healthz      200 {"status": "ok"} while the index answers (a barrier), else 503
//	GET /readyz       200 {"ready": true} once every engine rank has synced, or
//	                  connected once and then been removed after the grace period
//	                  (latched); a rank that never connected keeps it 503 (a wrong
//	                  endpoint: "waiting" names it with its last error, and its
//	                  subscriber logs "publisher unreachable" from the first attempt),
//	                  503 {"ready": false, "waiting": [...]} before, and while draining
//	GET /metrics      Prometheus text format; per tier: kvindex_tier_blocks{tier},
//	                  kvindex_index_skipped_copies_total, events_applied_total{kind="copied"}
//
// Errors are {"error": "...", "code": "..."} with 400 (bad_json, unknown_model,
// bad_query, bad_policy, bad_namespace, bad_tier_weights, bad_top_k, bad_load,
// bad_request_id, bad_extra_keys, query_too_long, bad_worker, unknown_worker, bad_ttl,
// bad_prediction), 409 (duplicate_request_id), 401 (unauthenticated: auth.token_file), 404, 405, 413 (body_too_large), 429 (too_many_in_flight:
// the connection's in-flight bytes) or 503 (overloaded: the server's in-flight bytes;
// namespaces_full: the namespace table, until a sweep; both with Retry-After). Request bodies are read
// strictly: an empty body, an unknown field, a key given twice, a wrong type or trailing
// data is bad_json (messages name the field and the JSON it takes); an empty tokens or
// content_hashes list is bad_query, on /v1/match, /v1/routed and gRPC alike.
//
// # Replica digests
//
// Each /v1/workers entry (and gRPC Worker: digest, digest_blocks, namespace_digests)
// carries the order-independent digest of what the index holds for the worker
// (engine.Digest: each entry's namespace, tier, KV-cache group, engine hash and
// position, summed; "sum" in 16 hex digits), over all of it and per namespace, and
// /metrics has kvindex_worker_digest{worker}, its top 52 bits (exact in a float64). Two
// replicas that applied the same events for a worker report the same digest, whatever
// their shard counts, chain keys or the order their workers' events interleaved in;
// kvindex doctor --compare SOURCE1 SOURCE2 (each a serve URL or a snapshot file) prints
// the workers whose digests differ, and with --resync has SOURCE1, a NATS replica,
// rebuild each of them from the stream (POST /v1/workers/{worker}/resync; the replica
// applies nothing else meanwhile). A replica given a peer (ReplicaOptions.Peer, serve
// --peer URL) compares its digests with the peer's every PeerInterval, for the workers
// both have applied to the same worker sequence (so lag is never a difference), and
// with PeerResync (--peer-resync) rebuilds a worker found differing in two checks in a
// row (peercheck.go; kvindex_replica_peer_checks_total{result},
// kvindex_replica_peer_mismatches_total, kvindex_replica_resyncs_total{result}). A
// server that follows its engines over ZeroMQ
// rebuilds a stale worker from the engine's replay by itself (its subscribers'
// resync.interval), and answers the resync endpoint 501.
//
// An engine without an endpoint ({"worker": W, "model": M}, or --engine
// worker=W,model=M) publishes no events: it runs no subscriber, is always pickable, and
// is known to the index only through predictions (state "approximate"). Queries name their namespace as the subscribers apply events:
// subscriber.Namespace(model, ns), so models never match each other.
//
// # Engines that change at runtime
//
// The engine list is not fixed at start (engines.go). Each engine belongs to one
// source, which alone adds, changes and removes it: the configuration ("config";
// kvindex serve re-reads its --config file on SIGHUP and applies the difference), the
// admin API ("api"), or a discovery source: "file", a JSON file of engines (an array of
// "engines" entries, or {"engines": [...]}; kvindex serve --engines-file) polled every
// discovery.file.interval and applied when its contents change; "kubernetes", the pods
// that match a label selector in one namespace, listed and then watched with the
// pod's own service account (package internal/kube: a list-and-watch client of the
// API's REST endpoints, not client-go, whose cold build would take most of CI's time),
// each running pod with an IP and the port annotation an engine (endpoint
// tcp://POD_IP:PORT, worker the pod's name, the rest from "engine" and the model and
// dp-ranks annotations; a pod deleted, terminating or no longer matching is removed);
// or a program calling SetEngines with a name of its own. The admin API:
//
//	GET    /v1/engines        {"engines": [{"key", "source", "workers", "engine"}]}
//	POST   /v1/engines        one "engines" entry of the configuration (strict JSON):
//	                          201 {"engine": {...}, "added": true}; 200 with "added":
//	                          false when that very engine is already served (a retry)
//	DELETE /v1/engines/{key}  200 {"removed": key, "workers": [...]}, once its workers
//	                          have left the index; key is the engine's worker (else its
//	                          endpoint, percent-encoded: tcp:%2F%2Fh:5557)
//
// Errors: 400 bad_json, bad_engine (invalid, or claiming a served worker id or
// endpoint, or another block size for a served model); 404 unknown_engine; 409
// engine_exists (the key is served with another spec or by another source),
// engine_source (DELETE of an engine the configuration or discovery owns); 503
// shutting_down. The admin API is served beside the rest of the API, behind the same
// listener: anyone who can reach it can make the server dial an endpoint.
//
// A change touches only the engines it names: an added engine's subscribers start at
// once (a new subscriber replays the engine's buffer from the start), a removed
// engine leaves the answers first, then its subscribers stop and its workers leave the
// index, and a changed engine (same key, another spec) is removed, then added. Every
// other engine's subscriber keeps running. /metrics counts kvindex_engines{source} and
// kvindex_engine_changes_total{source, change} (added, removed, replaced, rejected).
// A discovery source that cannot be read (a file that no longer parses) changes
// nothing, and is counted in kvindex_discovery_up{source} and
// kvindex_discovery_errors_total{source}; an engine it lists that the server rejects
// (invalid, or claiming another engine's worker id or endpoint) is logged and counted
// (change "rejected") while its other engines apply. At start, a discovery file that
// is missing, does not parse or lists an invalid engine fails New; /readyz waits for
// every source's first list. kvindex serve --snapshot plans the discovery file's
// engines with the configured ones (they resume from their cursors after a restart);
// engines added later (the admin API, Kubernetes, /register) are not in a snapshot's
// plan: after a restart they sync from scratch once they are added again.
//
// # Mooncake indexer API
//
// kvcache-ai/Mooncake's indexer RFC (#1403; Mooncake Conductor's and NVIDIA Dynamo's
// standalone indexer's API), beside /v1/match (mooncake.go has the details):
//
//	POST /register       {"endpoint", "replay_endpoint", "type": "vLLM" | "SGLang",
//	                     "modelname", "lora_name", "tenant_id", "instance_id" (string or
//	                     number), "block_size", "dp_rank", "additionalsalt"}: one rank of
//	                     an instance becomes an engine (source "mooncake", worker
//	                     "<instance_id>#dp<rank>", model "modelname" or, with a salt S,
//	                     "modelname@S")
//	   200 {"status": "registered successfully", "instance_id": ...}
//	POST /unregister     {"instance_id", "tenant_id", "dp_rank"}: that rank, or every
//	                     rank without dp_rank
//	   200 {"status": "unregistered successfully", "removed_instances": ["inst|tenant|rank"]}
//	POST /query          {"model", "token_ids", "block_size", "lora_name" | "lora_id",
//	                     "cache_salt", "tenant_id", "instance_id", "medium"}
//	POST /query_by_hash  the same with "block_hashes" (per-block content hashes, package
//	                     hash's; "block_hash" too) instead of token_ids; "seq_hashes"
//	                     (rolling hashes) are refused with a 400 saying what to send
//	   200 {"default": {"vllm-prefill-node1": {"longest_matched": 256, "GPU": 128,
//	        "CPU": 256, "DISK": 256, "DP": {"0": 128, "1": 256}}}}
//
// Counts are tokens (blocks times the model's block size). Every instance of the
// model under the tenant is listed, 0 where nothing matched; an instance's ranks, from
// /register or from an engine's dp_ranks, fold into one entry with each rank in "DP".
// GPU, CPU and DISK are the leading tokens held on that medium or a faster one
// (cumulative, as Dynamo reads the RFC). Errors are the HTTP API's, in its shape and
// codes: 400 bad_json, unknown_model, bad_engine, bad_query (an empty token_ids or
// block_hashes included), query_too_long; 404 unknown_engine; 409 engine_exists,
// engine_source; 503 unavailable.
//
// # gRPC API
//
// api/kvindexv1/kvindex.proto, served beside HTTP when "grpc"."listen" is set (kvindex
// serve --grpc ADDR), from the same engine and subscribers:
//
//	kvindex.v1.Index/Match     MatchRequest{model, tokens | content_hashes, namespace,
//	                           lora_name, cache_salt, policy, record, tier_weights,
//	                           pick, request_id, load}
//	                           -> MatchResponse (matches with tiers and weighted), as
//	                           /v1/match;
//	                           errors INVALID_ARGUMENT, ALREADY_EXISTS, UNAVAILABLE,
//	                           RESOURCE_EXHAUSTED
//	kvindex.v1.Index/Workers   -> WorkersResponse, as /v1/workers
//	kvindex.v1.Index/Routed    RoutedRequest{model, worker, tokens | content_hashes,
//	                           namespace, lora_name, cache_salt, ttl_ms, request_id}
//	                           -> RoutedResponse, as /v1/routed
//	kvindex.v1.Index/Finished  FinishedRequest{request_id, first_token} ->
//	                           FinishedResponse{known}, as /v1/finished
//	grpc.health.v1.Health/Check  service "": liveness (/healthz);
//	                           service "kvindex.v1.Index": readiness (/readyz)
//
// The port is as exposed as the HTTP one, so a peer's resources are bounded: messages
// both ways (max_message_bytes, refused before they are decoded), streams per
// connection (max_concurrent_streams, announced in HTTP/2 SETTINGS), the header list
// (16 KiB), pings (more often than every 10 s closes the connection), and, as over
// HTTP, query blocks and query time. Calls are counted in /metrics as
// kvindex_grpc_requests_total{method, code}. TLS and client authentication are the
// HTTP API's (auth).
//
// Match and Routed run the HTTP handlers' pipeline (match.go): a transport only decodes
// the request and encodes the answer, so both check a request in one order and refuse
// it with one message (HTTP's error, the gRPC status's message), the HTTP status and
// code going with INVALID_ARGUMENT (400), ALREADY_EXISTS (409), RESOURCE_EXHAUSTED
// (namespaces_full, too_many_in_flight) or UNAVAILABLE (503)
// (TestPipelineSameOverHTTPAndGRPC). The Mooncake /query shares its engine step and
// trust states.
//
// # Diagnostics
//
// Each worker's problems (subscriber.Problems: no_events, events_stopped,
// block_size_mismatch, parent_not_found, hash_mismatch) and each model's
// (unmatched_queries) appear in /v1/workers with a message and a hint, in /metrics as
// kvindex_worker_problem{worker,model,problem} and kvindex_model_problem{model,problem}
// (1 while active), and in the log: a warning when a problem appears, repeated at most
// every log_interval while it lasts, and an info line when it is over (checked every 10
// s). docs/diagnostics.md, "When routing silently stops using the cache", says what to do about
// each.
//
// # Trust states
//
// Every match says where its score came from ("trust"; gRPC Match.trust), and every
// /v1/workers entry the worker's diagnosed state (kvindex_worker_trust{worker,state}: 1
// for it, 0 for the others). The states, from the subscriber's state and its problems
// (trust.go decides; the problems are re-diagnosed every trust.interval):
//
//	exact        the stream is healthy: subscriber live, none of the problems below.
//	             Score: the index's, with predictions filling in until the worker's
//	             events arrive ("predicted" says how much), as always.
//	degraded     the stream delivers, but the index holds only part of the worker's
//	             blocks: subscriber stale (history that could not be replayed), or
//	             stores rejected (parent_not_found, block_size_mismatch). What the index
//	             holds the worker holds, so the score is the index merged with the
//	             predictions (the longer of the two): a lower bound.
//	approximate  the index cannot vouch for the worker: no events at all (an engine
//	             without an endpoint, no_events), events stopped while it serves
//	             (events_stopped), block hashes that do not follow from its tokens
//	             (hash_mismatch: the engine cached under inputs the index does not
//	             see), or no usable stream (connecting, syncing, disconnected). Score:
//	             its predictions alone (/v1/routed, "record"), all of it "predicted";
//	             the index's blocks for it count for nothing, and without a live
//	             prediction sharing the query's first block it is not among the matches.
//
// A worker is exact again as soon as the cause is over: its subscriber live again (a
// reconnection, a resync after a gap, the engine clearing its cache or restarting) and
// the problem gone from the diagnostics (an event arrives; a window passes without a
// mismatch or a rejected store). A change of a worker's problem-driven state is logged;
// kvindex_trust_fallback_matches_total{trust} counts the matches scored below exact.
// The Mooncake API's counts are scored the same way (its shape has no field to name
// the state). A worker fed by a relay (serve --nats) is exact: the relay, which runs its
// subscriber, vouches for its stream.
//
// The fallback is on by default: a worker the diagnostics flag is otherwise scored from
// a state known to be wrong (an events_stopped worker keeps the credit of blocks it
// evicted long ago, and a router routes to it forever), and the thresholds behind the
// flags are minutes long, so a healthy fleet never sees it. "trust": {"off": true}
// (kvindex serve --no-trust-fallback) scores every worker from the index again: its
// matches then say "exact" (engines without events still "approximate"), while
// /v1/workers and kvindex_worker_trust keep the diagnosed state.
//
// A worker is eligible for a pick while its subscriber is live or stale (connected and
// synced). "size" in /v1/workers is filled when the index implements WorkerSizer, else
// null; /v1/match always reports the matching workers' sizes.
package server
