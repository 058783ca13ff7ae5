// Package sim simulates a fleet of vLLM-like engines behind routers and drives the
// kvindex engine with the KV-cache events they emit. It backs `kvindex sim` (time to
// first token, throughput, goodput and hit rates per routing policy, and the index's
// throughput, latency and memory), `kvindex gen-ops` (the zero-time model's event
// stream as a SPEC op log), and the benchmarks that want realistic traffic.
//
// It has two models of the same engines.
//
//	arrivals ──> router replicas ──(pick: package route)──> timed engines ──(events, at
//	 (trace,      own load, own                              step end, +EventDelay)──>
//	 Poisson)     predictions, own                                                  index
//	              approximate cache <───────────(FindMatches, exact)───────────────┘
//
// Simulate (fleet.go) runs under time. Each engine is a vLLM v1-style scheduler
// (sched.go): a token budget per step spent on the running requests first (one decode
// token each, or a prefill chunk), then on waiting requests in order while the block
// pool and max_num_seqs allow; a running request that cannot get its next block
// preempts the most recently admitted one (recompute). A step lasts what a CostModel
// says (costmodel.go: a roofline estimate of a named model and GPU, or a measured
// profile). Each request decodes its Output tokens; the full blocks its KV fills, its
// prompt's and its output's, are cached and published when the step that fills them
// ends. Router replicas (TimedConfig.Routers) each run a Routing: a policy of package
// route (Dynamo's cost, llm-d's scorer, or a baseline) fed by one source of cache
// knowledge (the exact index, the index plus the replica's own predictions, the
// predictions alone with Dynamo's 120 s TTL, or llm-d's LRU of the replica's own
// decisions) and by the load it knows (its own requests, or the engines' metrics
// refreshed every MetricsInterval). Outcomes are what users measure: TTFT, ITL, E2E,
// output throughput, goodput, KV use, queues, preemptions, and the hit rates.
//
// Run (run.go) is the zero-time model: a request is served in full the moment it
// arrives, one at a time, prefill only; it counts prefix hits and nothing else, and
// it alone simulates host tiers. gen-ops, the conformance logs and the differential
// test against Simulate (TestTimedMatchesZeroTimeAtVanishingLoad) use it.
//
// # What it owns
//
//   - Workloads: the built-in multi-turn conversations (Generate: each request's
//     output is its reply, which the next turn repeats), llm-d's shared-context shape
//     (SharedContext) and Mooncake FAST'25 traces (ReadTrace, FromTrace).
//   - Mock engines (mockengine.go): a prefix cache of Capacity blocks that follows
//     vLLM's v1 block pool as shared/conformance/README.md ("Trace-driven cluster")
//     describes it: longest-prefix reuse by the worker's own opaque engine hashes (at
//     most (tokens-1)/BlockSize blocks), allocation from a least-recently-freed queue
//     with one `removed` per evicted hashed block, one `stored` per prefill chunk with
//     the parent it hangs under, tail-first freeing. Both models share it.
//   - An optional host tier per engine (Config.HostCapacity, Run only).
//   - The references (reference.go): the infinite cache, one LRU of the fleet's
//     blocks, and the workload's reuse distances.
//   - The zero-time routing policies (policy.go: longest-prefix/exact with its
//     request-count cap, its +predict, approx-ttl, :weighted-tiers and :any-tier variants,
//     and the baselines; their earlier names kv-aware ... kv-any-tier still parse), and
//     the timed ones (routing.go), which are package route's.
//
// Events reach the index only through the engine's public API (Store, StoreUnder,
// Remove, Apply for host-tier events, FindMatches, Barrier, Predict), exactly as an
// ingester and a router would call it; Simulate applies a run of one engine's
// removals with one Remove call, as an ingester applies a batch. An Observer sees
// the stream; WriteOps uses one to write it as an op log whose queries carry the
// reference model's answers.
//
// # Who may call it
//
// Any package of this module and its commands. A Workload may be shared by concurrent
// Runs and Simulates (they only read it); everything else of one Run or Simulate —
// its engines, routers, Observer, callbacks — belongs to the goroutine that called it.
// Neither starts goroutines of its own beyond the index engines they create, which
// are closed before they return.
//
// # Determinism
//
// For a given workload, config and policy, a run makes the same routing decisions,
// emits the same events in the same order and reports the same outcomes every time:
// the routers take a Barrier before every FindMatches, so their answers do not depend
// on scheduling, random numbers come from generators seeded by Config.Seed, and the
// clock is simulated. Only wall times and memory figures vary. The workload generators
// are prefix-stable: the first k requests do not depend on how many were asked for.
package sim
