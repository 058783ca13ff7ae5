// Package freeport hands tests loopback addresses that nothing listens on.
//
// Tests use them as the endpoint of an engine that is never reached, or as a
// port a child process will bind. The kernel may hand a just-closed ephemeral
// port out again at once, so two plain "listen on :0, close" calls can return
// the same address: a test that asks for three engines then sees two of them
// share an endpoint and fails by chance. Addr remembers every address it gave
// in this process (under one mutex; any goroutine may call it) and never gives
// one twice.
package freeport

import (
	"net"
	"sync"
	"testing"
)

// given is every address Addr has returned in this process, under its mutex.
var given = struct {
	sync.Mutex
	addrs map[string]struct{}
}{addrs: map[string]struct{}{}}

// Addr returns a "127.0.0.1:port" nothing listens on as it returns, distinct
// from every address Addr returned before in this process. It may call t.Fatal, so
// call it on t's goroutine.
func Addr(t testing.TB) string {
	t.Helper()
	given.Lock()
	defer given.Unlock()
	for {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		addr := l.Addr().String()
		l.Close()
		if _, dup := given.addrs[addr]; !dup {
			given.addrs[addr] = struct{}{}
			return addr
		}
	}
}

// Endpoint is Addr as a ZeroMQ "tcp://" endpoint.
func Endpoint(t testing.TB) string {
	t.Helper()
	return "tcp://" + Addr(t)
}
