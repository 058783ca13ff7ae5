package subscriber

import (
	"encoding/binary"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/go-zeromq/zmq4/security/null"

	"github.com/kvindex/kvindex/internal/fakevllm"
)

// countingConn counts the reads of the connection under the guard.
type countingConn struct {
	net.Conn
	reads atomic.Int64
}

func (c *countingConn) Read(p []byte) (int, error) {
	c.reads.Add(1)
	return c.Conn.Read(p)
}

// TestGuardReadsBuffered: zmq4 reads each frame header and body separately; through
// the guard a backlog of small live messages costs far fewer reads of the connection
// (system calls, on a socket) than frames. Without the guard's buffer it took five or
// more per message.
func TestGuardReadsBuffered(t *testing.T) {
	const n = 200
	a, b := net.Pipe()
	defer a.Close()
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { // the peer's reader: discards our greeting and READY
		defer wg.Done()
		_, _ = io.Copy(io.Discard, b)
	}()
	go func() { // the peer's writer: greeting, READY, then n messages in one write
		defer wg.Done()
		out := append(fakevllm.Greeting(), fakevllm.Ready("PUB")...)
		var seq [8]byte
		for i := range n {
			binary.BigEndian.PutUint64(seq[:], uint64(i))
			out = append(out, fakevllm.Message([]byte{}, seq[:], realBatch(600))...)
		}
		_, _ = b.Write(out)
	}()
	cc := &countingConn{Conn: a}
	g := &guard{self: zmq4.Sub, maxMsg: DefaultMaxMessageBytes, handshake: 5 * time.Second, maxConns: 1, refused: func(error) {}}
	g.live.Add(1)
	gc := newGuardConn(cc, g)
	zc, err := zmq4.Open(gc, null.Security(), zmq4.Sub, zmq4.SocketIdentity("t"), false, nil)
	if err != nil {
		t.Fatal(err)
	}
	before := cc.reads.Load()
	for i := range n {
		m, err := zc.RecvMsg()
		if err != nil || len(m.Frames) != 3 || binary.BigEndian.Uint64(m.Frames[1]) != uint64(i) {
			t.Fatalf("message %d: %v, %d frames", i, err, len(m.Frames))
		}
	}
	if reads := cc.reads.Load() - before; reads > n/4 {
		t.Fatalf("%d reads of the connection for %d messages of 3 frames", reads, n)
	}
	gc.Close()
	b.Close()
	wg.Wait()
}
