// Command kvindex runs the kvindex index outside a program: it simulates a fleet, replays
// and benchmarks op logs, and serves the index to routers over HTTP and gRPC.
//
//	kvindex sim       simulate a routed vLLM fleet under load: TTFT, throughput and hit rate per routing policy
//	kvindex gen-ops   write the simulated fleet's event stream as an op log (input of replay and bench)
//	kvindex replay    apply an op log and check every query's expected answer
//	kvindex bench     measure the engine against its baselines (and, with --peers, SMG's indexes) on an op log
//	kvindex serve     follow engines' KV events (ZeroMQ or NATS) and answer routing queries over HTTP and gRPC
//	kvindex demo      try serve locally: simulated vLLM engines publishing into a serve, and three curl lines to ask it
//	kvindex relay     follow engines' KV events (or an op log) and publish them to NATS JetStream
//	kvindex doctor    check engines for a few seconds: what they publish, what is wrong; or compare two replicas
//	kvindex tokenize  turn prompts and chats (JSON lines on stdin) into the token ids vLLM computes for them
//	kvindex loadtest  load-test serve with a simulated fleet of engines: ingest rate held with nothing lost
//	kvindex version   print the version, VCS revision and Go toolchain of this binary
//
// `kvindex COMMAND -h` prints a command's synopsis, description and flags to stdout and
// exits 0. Exit status otherwise: 0 success, 1 runtime failure, 2 bad usage. A flag that
// several commands share means the same in each. The lines above are the commands table
// of cli.go (a test keeps them equal).
package main
