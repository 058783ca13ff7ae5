// Package fleet load-tests kvindex serve with a fleet of fake vLLM engines
// (internal/fakevllm): N engines, each a real ZMTP PUB socket and replay ROUTER on
// 127.0.0.1, publish msgpack KV-event batches from a block-pool model into one serve, at a configured rate, while clients query /v1/match and the
// gRPC Index.Match. After each level it checks that nothing was lost: every worker
// applied its engine's last batch and holds exactly the blocks its engine's cache
// holds. `kvindex loadtest` is its command line; BENCHMARKS.md ("Fleet load test")
// has its figures.
//
// # What it owns
//
//	runner: the fakevllm.Fleet and its drivers, queryLoad (open-loop match clients),
//	        prober (apply lag), sampler (serve's /proc), drain and check (/v1/workers
//	        against the engines' own counts)
//	queryProc: the query child (querychild.go, Config.QueryCommand), a process at
//	        serve's priority that runs the match clients of each level for the runner
//
// serve runs as a child process (the real binary, kvindex serve --config FILE: its RSS,
// CPU, file descriptors and goroutines are its own, read from /proc and /metrics) or
// in this process (server.Server; the figures then include the load generator), which
// is what the package's tests use: they need no binary.
//
// # Who may call it
//
// Run, once per Config (`kvindex loadtest`).
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
// each query's scheduled start (open loop: a queue behind a slow server counts), and
// from its send (without the generator's own lateness in starting it); serve's
// peak RSS, fds and threads, goroutines at the end, CPU per wall second. A level holds
// with no loss, nothing stale, no size differing, lag p99 within MaxLag and the fleet
// publishing at least 95% of the offered rate.
package fleet
