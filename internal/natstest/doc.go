// Package natstest runs NATS servers for tests: the nats-server binary at the pinned
// Version, one child process per server, on 127.0.0.1 and a port the kernel picks.
//
// Tests of fabric, server and the CLI need a NATS server with JetStream. Linked into
// their test binaries, nats-server's Go package is compiled once without and once with
// the race detector: 131 s and 107 s of CPU on a cold build cache of a 2-core machine,
// about a fifth of make test's CPU. A child process costs none of that, and a test
// cannot share memory with it, so the race detector loses nothing.
//
// Which binary: KVINDEX_NATS_SERVER when set; else nats-server in GOPATH/bin (make
// tools installs it there) or on PATH, when it reports Version; else Binary installs
// Version once into the user's cache folder with `go install` (the 131 s of CPU above, once) and
// reuses it from then on. A binary of another version is never used: the tests pin
// the server's behaviour as much as the client's.
//
// Concurrency: Start, Stop and Restart are called on the test's goroutine. Each
// server has one goroutine of its own, which copies the process's log into a bounded
// buffer (shown when the server fails to start or the test fails) and ends when the
// process exits; Stop waits for it, so goleak sees nothing left behind.
package natstest
