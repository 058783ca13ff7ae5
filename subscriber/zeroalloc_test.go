//go:build !race

// The race detector allocates: the count holds without it.

package subscriber

import (
	"context"
	"encoding/binary"
	"errors"
	"net"
	"testing"

	"github.com/kvindex/kvindex/engine"
)

// errPause ends a pausedConn's message: the guard's reader returns it, and the next
// read serves the next message.
var errPause = errors.New("pause")

// pausedConn serves one ZMTP message per read, then errPause once.
type pausedConn struct {
	net.Conn
	msgs [][]byte
	next int
	half bool // the current message was served: pause next
}

func (c *pausedConn) Read(p []byte) (int, error) {
	if c.half {
		c.half = false
		return 0, errPause
	}
	m := c.msgs[c.next%len(c.msgs)]
	c.next++
	c.half = true
	return copy(p, m), nil
}

// zmtpFrame appends a ZMTP 3 message frame holding body.
func zmtpFrame(dst []byte, more bool, body []byte) []byte {
	var flags byte
	if more {
		flags |= flagMore
	}
	if len(body) < 256 {
		dst = append(dst, flags, byte(len(body)))
	} else {
		dst = append(dst, flags|flagLong)
		dst = binary.BigEndian.AppendUint64(dst, uint64(len(body)))
	}
	return append(dst, body...)
}

// TestLiveMessageZeroAlloc: in steady state a live batch goes from the connection's
// bytes through the ZMTP guard, the subscriber (decode, checks, diagnosis) and
// engine.ApplyBatch without one allocation. The batches are those of BenchmarkIngest
// (13-block stores extending conversations, and the removal of the oldest 13 once
// 4,096 are held); one round over them first lets every buffer and table grow.
func TestLiveMessageZeroAlloc(t *testing.T) {
	e, err := engine.New(engine.Config{LockedIndex: true})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	s, err := New(Config{Endpoint: "tcp://127.0.0.1:1", Worker: "w", Index: e, BlockSize: 16})
	if err != nil {
		t.Fatal(err)
	}
	payloads := ingestBatches(4096 + 2048)
	pc := &pausedConn{}
	for seq, p := range payloads {
		var sb [8]byte
		binary.BigEndian.PutUint64(sb[:], uint64(seq))
		m := zmtpFrame(nil, true, []byte(s.cfg.Topic))
		m = zmtpFrame(m, true, sb[:])
		pc.msgs = append(pc.msgs, zmtpFrame(m, false, p))
	}
	g := &guard{self: s.subGuard.self, maxMsg: s.subGuard.maxMsg, maxConns: 1, refused: func(error) {}, sink: s.deliver}
	c := newGuardConn(pc, g)
	c.greeted, c.ready = true, true
	s.sess = &sessionState{ctx: context.Background(), gen: c.gen, fail: make(chan struct{}, 1)}
	s.up()
	step := func() {
		if err := c.deliver(); !errors.Is(err, errPause) {
			t.Fatalf("deliver: %v", err)
		}
	}
	for range 4096 { // a full cache: the removals start
		step()
	}
	if allocs := testing.AllocsPerRun(2000, step); allocs != 0 {
		t.Errorf("%v allocations per live batch, want 0", allocs)
	}
	st := s.Status()
	if st.Batches != uint64(pc.next) || st.Stored == 0 || st.Removed == 0 || st.Rejected != ([NumReasons]uint64{}) || s.sess.err != nil {
		t.Fatalf("batches %d of %d, stored %d, removed %d, rejected %v, err %v", st.Batches, pc.next, st.Stored, st.Removed, st.Rejected, s.sess.err)
	}
}
