// Package sim simulates a fleet of vLLM-like engines behind a router and drives the
// kvindex engine with the KV-cache events they emit. It backs `kvindex sim` (time to
// first token, throughput, hit rates and index throughput per routing policy) and
// `kvindex gen-ops` (the zero-time model's event stream as a SPEC op log), and the
// benchmarks that want realistic traffic.
//
// It has two models. Simulate runs under time: each engine is a continuous-batching
// scheduler (sched.go) whose steps last what a cost model says (costmodel.go), behind
// router replicas running the policies of package route (fleet.go). Run is the
// zero-time model: a request is served in full the moment it arrives, one at a time,
// which counts prefix hits and nothing else; gen-ops, the conformance logs and the
// differential test against Simulate use it.
//
// # What it owns
//
//   - Workloads: a built-in generator of multi-turn conversations (Generate) and Mooncake
//     FAST'25 traces (ReadTrace, FromTrace). A Workload is a sequence of requests, each
//     its input length in tokens and the content hashes (package hash) of its full blocks.
//   - Mock engines: each worker is a prefix cache of Capacity blocks that follows vLLM's
//     v1 block pool as shared/conformance/README.md ("Trace-driven cluster") describes
//     it: longest-prefix reuse by the worker's own opaque engine hashes (at most
//     (tokens-1)/BlockSize blocks), allocation from a least-recently-freed queue with one
//     `removed` per evicted hashed block, one `stored` per prefill chunk with the parent
//     it hangs under, and tail-first freeing when the request finishes. A request
//     finishes right after prefill; decode is not modelled, so there is exactly one
//     running request in the fleet at a time and nothing else pins blocks.
//   - An optional host tier per engine (Config.HostCapacity): an LRU of blocks the device
//     evicted, offloaded with a host-tier `stored` under their parent and dropped with a
//     host-tier `removed`; a request whose prefix continues there loads those blocks back
//     (stored on the device again) at Config.HostLoadCost of recomputing them.
//   - Routing policies (kv-aware, kv-aware-predict, approximate, kv-weighted, kv-any-tier,
//     random, round-robin, least-loaded) and the metrics: hit rates per tier, the
//     infinite-cache ceiling, prefill work, load balance, and the index's throughput,
//     latency and memory.
//   - Simulated time: requests arrive at their trace timestamps (or evenly at
//     Config.Rate), the events a request causes reach the index Config.EventDelay later,
//     in emission order, and the index's predictions expire on the same clock.
//
// Events reach the index only through the engine's public API (Store, StoreUnder,
// Remove, Apply for host-tier events, FindMatches, Barrier), exactly as an ingester
// would call it. An Observer sees
// the same stream; WriteOps uses one to write the stream as an op log whose queries carry
// the reference model's answers.
//
// # Who may call it
//
// Any package of this module and its commands. Nothing here is safe for concurrent use:
// a Workload may be shared by concurrent Runs (they only read it), but one Run, one
// Observer and one WriteOps each belong to the goroutine that called them. Run starts no
// goroutines of its own; the engine it creates is closed before Run returns.
//
// # Determinism
//
// For a given workload, Config and policy, a run makes the same routing decisions and
// emits the same events in the same order every time: the kv-aware routers take a
// Barrier before every FindMatches, so their answers do not depend on scheduling, and
// the clock is simulated. Only the
// timings and memory figures vary. The built-in generator is prefix-stable: the first k
// requests of a workload do not depend on how many requests were asked for.
package sim
