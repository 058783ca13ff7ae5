package subscriber

import (
	"net"
	"os"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"
)

// emfileListener fails every Accept with EMFILE until its deadline, then reports
// itself closed.
type emfileListener struct {
	net.Listener
	until time.Time
	calls atomic.Int64
}

func (l *emfileListener) Accept() (net.Conn, error) {
	l.calls.Add(1)
	if time.Now().After(l.until) {
		return nil, net.ErrClosed
	}
	return nil, &net.OpError{Op: "accept", Net: "tcp", Err: os.NewSyscallError("accept4", syscall.EMFILE)}
}

// TestAcceptBacksOffWhenOutOfFDs: a bound socket's listener out of file descriptors
// is retried with backoff, not in a tight loop. zmq4's accept loop calls Accept again
// at once after any error, so before the backoff this test saw hundreds of thousands
// of calls in 200ms (a core spinning per bound engine).
func TestAcceptBacksOffWhenOutOfFDs(t *testing.T) {
	fake := &emfileListener{until: time.Now().Add(200 * time.Millisecond)}
	g := &guard{self: zmq4.Sub, maxMsg: DefaultMaxMessageBytes, handshake: time.Second, maxConns: maxBoundConns, refused: func(error) {}}
	l := &guardListener{Listener: fake, g: g}
	for { // zmq4's loop: retry whatever the error, stop when closed
		if _, err := l.Accept(); err == net.ErrClosed {
			break
		}
	}
	if n := fake.calls.Load(); n > 50 {
		t.Fatalf("%d Accept calls in 200ms of EMFILE", n)
	}
}
