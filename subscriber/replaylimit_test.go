package subscriber

import (
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvindex/kvindex/engine"
	"github.com/kvindex/kvindex/internal/fakevllm"
)

// slowRouter is a replay endpoint that answers each request with the end marker after
// delay, counting the requests it has in hand at once.
type slowRouter struct {
	l              net.Listener
	delay          time.Duration
	inFlight, peak atomic.Int64
	served         atomic.Int64
	wg             sync.WaitGroup
}

func newSlowRouter(t *testing.T, delay time.Duration) *slowRouter {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r := &slowRouter{l: l, delay: delay}
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			r.wg.Add(1)
			go func() {
				defer r.wg.Done()
				defer c.Close()
				r.serve(c)
			}()
		}
	}()
	t.Cleanup(func() { l.Close(); r.wg.Wait() })
	return r
}

func (r *slowRouter) serve(c net.Conn) {
	_ = c.SetDeadline(time.Now().Add(30 * time.Second))
	if _, err := c.Write(append(fakevllm.Greeting(), fakevllm.Ready("ROUTER")...)); err != nil {
		return
	}
	var greet [64]byte
	if _, err := io.ReadFull(c, greet[:]); err != nil {
		return
	}
	// The DEALER's READY (one short command frame), then its request [b"", seq8].
	readFrame := func() ([]byte, byte, error) {
		var h [2]byte
		if _, err := io.ReadFull(c, h[:]); err != nil {
			return nil, 0, err
		}
		b := make([]byte, h[1])
		_, err := io.ReadFull(c, b)
		return b, h[0], err
	}
	if _, _, err := readFrame(); err != nil {
		return
	}
	if _, _, err := readFrame(); err != nil {
		return
	}
	if seq, _, err := readFrame(); err != nil || len(seq) != 8 {
		return
	}
	n := r.inFlight.Add(1)
	for p := r.peak.Load(); n > p && !r.peak.CompareAndSwap(p, n); p = r.peak.Load() {
	}
	time.Sleep(r.delay) // the engine's own slowness, not a synchronisation
	r.inFlight.Add(-1)
	end := binary.BigEndian.AppendUint64(nil, ^uint64(0))
	r.served.Add(1) // before the reply: the replay returns once it has it
	if _, err := c.Write(fakevllm.Message([]byte{}, []byte{}, end, []byte{})); err != nil {
		return
	}
	_, _ = io.Copy(io.Discard, c)
}

type nopApply struct{}

func (nopApply) Apply(*engine.Event) error { return nil }

// TestReplayLimiterBoundsStorm: eight subscribers replaying at once through a limiter
// of two never have more than two requests at the engine, and none times out although
// the storm lasts longer than ReplayTimeout: a replay's timeout runs once it holds its
// slot.
func TestReplayLimiterBoundsStorm(t *testing.T) {
	// Each reply takes 400 ms and the timeout is 1 s: four rounds of two (1.6 s) outlast
	// the timeout, and a reply has 600 ms of slack for a loaded machine's scheduling (with
	// 120 and 300 ms it timed out under make test's parallel phases).
	const replyAfter, timeout = 400 * time.Millisecond, time.Second
	r := newSlowRouter(t, replyAfter)
	lim, err := NewReplayLimiter(2)
	if err != nil {
		t.Fatal(err)
	}
	const n = 8
	errs := make([]error, n)
	var wg sync.WaitGroup
	start := time.Now()
	for i := range n {
		s, err := New(Config{Endpoint: "tcp://127.0.0.1:1", ReplayEndpoint: "tcp://" + r.l.Addr().String(),
			Worker: fmt.Sprint("w", i), Index: nopApply{}, ReplayTimeout: timeout, Replays: lim})
		if err != nil {
			t.Fatal(err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = s.zmqReplay(context.Background(), 0, func(uint64, []byte) bool { return true })
		}()
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Errorf("replay %d: %v", i, err)
		}
	}
	if p := r.peak.Load(); p > 2 || r.served.Load() != n {
		t.Fatalf("peak %d requests at once (limit 2), %d served of %d", p, r.served.Load(), n)
	}
	if el := time.Since(start); el < timeout {
		t.Fatalf("the storm took %v: shorter than one ReplayTimeout, so it proved nothing", el)
	}
	if st := lim.Stats(); st.Running != 0 || st.Waiting != 0 || st.Waited == 0 || st.Limit != 2 {
		t.Fatalf("limiter stats %+v", st)
	}
	if _, err := NewReplayLimiter(0); err == nil {
		t.Fatal("a limit of 0 was accepted")
	}
}
