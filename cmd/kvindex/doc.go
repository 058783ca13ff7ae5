// Command kvindex runs the kvindex index outside a program.
//
//	kvindex sim       simulate a fleet of vLLM engines under four routing policies
//	kvindex gen-ops   write the simulated event stream as an op log
//	kvindex replay    apply an op log and check every expected answer
//	kvindex bench     benchmark the engine against its baselines (and, with --peers, SMG's indexes) on an op log
//	kvindex serve     follow engines' KV events (ZeroMQ or NATS) and answer over HTTP
//	kvindex relay     follow engines once and publish their events to NATS JetStream
//	kvindex doctor    check engines for a few seconds: what they publish, what is wrong
//
// Each subcommand lives in its own file and registers itself in the commands table;
// `kvindex COMMAND -h` prints its flags. Exit status: 0 success, 1 failure, 2 bad usage.
package main
