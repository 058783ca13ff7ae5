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
	"github.com/kvindex/kvindex/internal/cputime"
)

// errPause ends a pausedConn's message: the guard's reader returns it, and the next
// read serves the next message.
var errPause = errors.New("pause")

// pausedConn serves one ZMTP message per read, then errPause once. The messages are
// served in a loop, their sequence frames (8 bytes at seqAt) rewritten to count on.
type pausedConn struct {
	net.Conn
	msgs  [][]byte
	seqAt int
	next  int
	half  bool // the current message was served: pause next
}

func (c *pausedConn) Read(p []byte) (int, error) {
	if c.half {
		c.half = false
		return 0, errPause
	}
	m := c.msgs[c.next%len(c.msgs)]
	binary.BigEndian.PutUint64(m[c.seqAt:], uint64(c.next))
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

// liveRig is a subscriber fed live messages as the ZMTP guard reads them from a
// connection: step hands it the next recorded batch (BenchmarkIngest's), from the
// frame bytes through deliver to a locked engine.
type liveRig struct {
	e    *engine.Engine
	s    *Subscriber
	c    *guardConn
	pc   *pausedConn
	step func()
}

func newLiveRig(tb testing.TB) *liveRig {
	e, err := engine.New(engine.Config{LockedIndex: true})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { e.Close() })
	s, err := New(Config{Endpoint: "tcp://127.0.0.1:1", Worker: "w", Index: e, BlockSize: 16})
	if err != nil {
		tb.Fatal(err)
	}
	payloads := ingestBatches(4096 + 2048)
	topic := zmtpFrame(nil, true, []byte(s.cfg.Topic))
	pc := &pausedConn{seqAt: len(topic) + 2}
	for _, p := range payloads {
		m := zmtpFrame(append([]byte(nil), topic...), true, make([]byte, 8))
		pc.msgs = append(pc.msgs, zmtpFrame(m, false, p))
	}
	g := &guard{self: s.subGuard.self, maxMsg: s.subGuard.maxMsg, maxConns: 1, refused: func(error) {}, sink: s.deliver}
	c := newGuardConn(pc, g)
	c.greeted, c.ready = true, true
	s.sess = &sessionState{ctx: context.Background(), gen: c.gen, fail: make(chan struct{}, 1)}
	s.up()
	r := &liveRig{e: e, s: s, c: c, pc: pc}
	r.step = func() {
		if err := c.deliver(); !errors.Is(err, errPause) {
			tb.Fatalf("deliver: %v", err)
		}
	}
	return r
}

// TestLiveMessageZeroAlloc: in steady state a live batch goes from the connection's
// bytes through the ZMTP guard, the subscriber (decode, checks, diagnosis) and
// engine.ApplyBatch without one allocation. The batches are those of BenchmarkIngest
// (13-block stores extending conversations, and the removal of the oldest 13 once
// 4,096 are held); a warm-up lets every buffer and table grow first.
func TestLiveMessageZeroAlloc(t *testing.T) {
	r := newLiveRig(t)
	for range 4096 { // a full cache: the removals start
		r.step()
	}
	if allocs := testing.AllocsPerRun(2000, r.step); allocs != 0 {
		t.Errorf("%v allocations per live batch, want 0", allocs)
	}
	st := r.s.Status()
	if st.Batches != uint64(r.pc.next) || st.Stored == 0 || st.Removed == 0 || st.Rejected != ([NumReasons]uint64{}) || r.s.sess.err != nil {
		t.Fatalf("batches %d of %d, stored %d, removed %d, rejected %v, err %v", st.Batches, r.pc.next, st.Stored, st.Removed, st.Rejected, r.s.sess.err)
	}
}

// BenchmarkLiveMessage is serve's work per live batch short of the socket: the ZMTP
// frames parsed and copied by the guard, the owner lock, the decode, one ApplyBatch
// into a locked engine, the status published. Reported: CPU time per batch (the
// process's, as BenchmarkIngest) and allocations.
//
//	go test -run '^$' -bench LiveMessage -benchtime 20000x ./subscriber/
func BenchmarkLiveMessage(b *testing.B) {
	r := newLiveRig(b)
	for range 4096 {
		r.step()
	}
	b.ReportAllocs()
	c0, cpuOK := cputime.Process()
	for b.Loop() {
		if r.pc.next%len(r.pc.msgs) == 0 {
			b.StopTimer() // a new round of the same batches: start from an empty worker
			if err := r.e.Apply(&engine.Event{Kind: engine.EventCleared, Worker: "w"}); err != nil {
				b.Fatal(err)
			}
			b.StartTimer()
		}
		r.step()
	}
	b.StopTimer()
	if st := r.s.Status(); st.Batches != uint64(r.pc.next) || st.Duplicates != 0 {
		b.Fatalf("batches %d of %d, duplicates %d", st.Batches, r.pc.next, st.Duplicates)
	}
	if c1, ok := cputime.Process(); ok && cpuOK {
		b.ReportMetric(float64((c1-c0).Nanoseconds())/float64(b.N), "cpu-ns/batch")
	}
}
