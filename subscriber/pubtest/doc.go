// Package pubtest runs testdata/publisher/publisher.py, a Python publisher that speaks
// vLLM's KV-event protocol with the real libzmq (Debian's python3-zmq) and msgpack, for
// the interop tests of packages subscriber and server and for bench/loadgen.
//
// Who may call it: tests and benchmarks. A Publisher is safe for concurrent use (its
// commands are serialised); it owns the Python process, whose stdout one goroutine
// reads until the process exits.
//
// Require skips a test, visibly, when no python3 on the machine can import zmq and
// msgpack (testdata/publisher/install.sh installs them); KVINDEX_REQUIRE_PUBLISHER=1
// turns the skip into a failure, for CI. KVINDEX_PYTHON names the interpreter to use.
package pubtest
