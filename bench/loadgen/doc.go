// Command loadgen measures kvindex serve under load on the loopback interface: the test
// publisher (testdata/publisher/publisher.py, vLLM's protocol over libzmq) streams
// trace-driven KV events into an in-process server while loadgen drives POST /v1/match
// and the gRPC Index.Match (--apis http,grpc: both, alternating at each level, in the
// same run) at several concurrencies, and reports requests/s and latency percentiles.
//
// Everything is bounded: each concurrency level runs for --duration or --max-requests,
// whichever ends first; the publisher stops after its own --publisher-seconds; only
// 127.0.0.1 is used.
//
// Usage (from the repository root):
//
//	go run ./bench/loadgen --out bench/loadgen/RESULTS.md
//
// What it owns: one publisher process, one in-process server (package server) and the
// client goroutines of the level being measured; Run returns after stopping them all.
// Who may call it: the command line, and TestSmoke through Run.
package main
