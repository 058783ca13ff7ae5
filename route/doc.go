// Package route holds the routing policies a KV-aware LLM router runs on top of the
// index: which worker gets a request, given how much of its prefix each worker holds
// (engine.Engine.FindMatches) and how loaded each one is. `kvindex sim` runs exactly
// this code against its simulated fleet, and `kvindex serve` runs it for /v1/match's
// "pick": the figures the simulator prints are the figures of these policies.
//
// # What it owns
//
//   - Policy and its implementations. Cost follows NVIDIA Dynamo's KV router: the
//     worker with the least overlap-weighted prefill blocks (the request's blocks it
//     does not hold, plus the prefill the router already sent it) plus decode blocks
//     (the KV of the requests running there). Scorer follows llm-d's weighted scorers:
//     a prefix score (the share of the request's blocks the worker holds), a KV
//     utilisation score and a queue score, each in [0, 1], summed with weights; the
//     highest total wins. The baselines are Random, RoundRobin and LeastLoaded (fewest
//     prompt tokens queued and running). Every policy breaks ties uniformly with the
//     random number its caller passes in, so a router that herds identical requests
//     onto one worker can only do so because the load says so.
//   - Tracker: the load a router knows from its own decisions (Routed, FirstToken,
//     Finished), per worker: requests and prompt tokens in flight, prefill tokens not
//     yet computed, KV blocks of the running requests. Dynamo's router tracks its own
//     requests the same way; each router replica knows only its own.
//   - Queue: Dynamo's router queue, which holds requests at the router while every
//     worker's prefill tokens in flight exceed a threshold times its batched-token
//     budget, and releases the oldest as load drops.
//   - ApproxCache: llm-d's approximate prefix cache, for engines that publish no KV
//     events: an LRU per worker, of the blocks the router sent there, bounded by an
//     estimate of the worker's capacity.
//
// Inputs are plain values (Candidate: an overlap in blocks and a Load), so a router
// that gets its load elsewhere (the engines' own metrics, a sidecar) fills Load itself.
//
// # Who may call it
//
// Anyone. Policies are immutable values, safe for concurrent use, except RoundRobin,
// whose counter is atomic. Tracker and ApproxCache guard their state with a mutex and
// are safe for concurrent use; the simulator calls them from one goroutine.
//
// # The numbers
//
// Cost's default overlap weight is 1, Dynamo's default (kv-overlap-score-weight):
// prefill blocks and decode blocks count the same. Queue's default threshold is 16 batched-token budgets of
// prefill, Dynamo's router_queue_threshold; the Tracker counts no output blocks unless
// told to (Dynamo's router_track_output_blocks, off). Scorer's default weights are 2 for
// the prefix, 1 for KV utilisation and 1 for the queue, the weights of llm-d's
// benchmarked "precise" and "approximate" configurations
// (llm-d-kv-cache-manager, benchmarking/37-capacity). ApproxCache has no default
// capacity: a router configures it from the workers it fronts.
package route
