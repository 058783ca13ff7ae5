package subscriber

import (
	"bytes"
	"net"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/go-zeromq/zmq4/security/null"

	"github.com/kvindex/kvindex/internal/fakevllm"
)

// memConn is a net.Conn reading a fixed stream; writes are discarded.
type memConn struct{ r *bytes.Reader }

func (c memConn) Read(p []byte) (int, error)     { return c.r.Read(p) }
func (memConn) Write(p []byte) (int, error)      { return len(p), nil }
func (memConn) Close() error                     { return nil }
func (memConn) LocalAddr() net.Addr              { return &net.TCPAddr{} }
func (memConn) RemoteAddr() net.Addr             { return &net.TCPAddr{} }
func (memConn) SetDeadline(time.Time) error      { return nil }
func (memConn) SetReadDeadline(time.Time) error  { return nil }
func (memConn) SetWriteDeadline(time.Time) error { return nil }

// FuzzGuard feeds arbitrary streams to zmq4's own connection code through the guard:
// nothing may panic or allocate past the cap (zmq4 alone panics on a 2^50 frame header
// or a truncated READY property), and every message zmq4 hands on is within the caps.
func FuzzGuard(f *testing.F) {
	const maxMsg = 1 << 12
	hello := append(fakevllm.Greeting(), fakevllm.Ready("PUB")...)
	f.Add(append(append([]byte{}, hello...), fakevllm.Message([]byte("t"), make([]byte, 8), []byte{0x90})...))
	f.Add(append(fakevllm.Greeting(), fakevllm.LongHeader(0x04, 1<<50)...))
	f.Add(append(append([]byte{}, hello...), fakevllm.LongHeader(0, 1<<40)...))
	f.Add(append(append([]byte{}, hello...), fakevllm.Message(make([]byte, 300), make([]byte, 4000))...))
	f.Add(append(fakevllm.Greeting(), 0x04, 8, 5, 'R', 'E', 'A', 'D', 'Y', 1, 'A'))
	f.Add(append(append([]byte{}, hello...), bytes.Repeat([]byte{1, 0}, 40)...))
	f.Fuzz(func(t *testing.T, stream []byte) {
		g := &guard{self: zmq4.Sub, maxMsg: maxMsg, maxConns: 1, refused: func(error) {}}
		g.live.Add(1)
		gc := newGuardConn(memConn{bytes.NewReader(stream)}, g)
		c, err := zmq4.Open(gc, null.Security(), zmq4.Sub, zmq4.SocketIdentity("fuzz"), false, nil)
		if err != nil {
			return
		}
		for range 64 {
			msg, err := c.RecvMsg()
			if err != nil {
				return
			}
			total := 0
			for _, fr := range msg.Frames {
				total += len(fr)
			}
			if total > maxMsg || len(msg.Frames) > maxMessageFrames {
				t.Fatalf("message of %d bytes in %d frames passed the guard", total, len(msg.Frames))
			}
		}
	})
}
