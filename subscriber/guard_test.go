package subscriber_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/kvindex/kvindex/engine"
	"github.com/kvindex/kvindex/internal/fakevllm"
	"github.com/kvindex/kvindex/internal/freeport"
	"github.com/kvindex/kvindex/subscriber"
)

// Hostile peers of our own: raw TCP connections writing a real ZMTP 3.0 greeting, then
// frame headers zmq4 alone would act on (allocating their declared length).

// hostileCase is what a hostile peer sends after its greeting.
type hostileCase struct {
	name  string
	bytes []byte
}

func hostileCases(typ string) []hostileCase {
	var cs []hostileCase
	for _, exp := range []uint{50, 40, 31} {
		cs = append(cs,
			hostileCase{fmt.Sprintf("command 2^%d", exp), fakevllm.LongHeader(0x04, 1<<exp)},
			hostileCase{fmt.Sprintf("message 2^%d", exp), append(fakevllm.Ready(typ), fakevllm.LongHeader(0, 1<<exp)...)})
	}
	truncated := []byte{0x04, 8, 5, 'R', 'E', 'A', 'D', 'Y', 1, 'A'} // key, no value length
	oddKey := append([]byte{0x04, 25, 5, 'R', 'E', 'A', 'D', 'Y', 11}, "SoCket-TYpe\x00\x00\x00\x03PUB"...)
	// multi: a 1 MiB frame, then a header declaring 15 MiB and a byte: each frame is
	// under the 16 MiB cap, the message passes it when the second header arrives.
	multi := slices.Concat(fakevllm.Ready(typ), fakevllm.LongHeader(0x01, 1<<20), make([]byte, 1<<20), fakevllm.LongHeader(0, 15<<20+1))
	return append(cs,
		hostileCase{"truncated READY property", truncated},
		hostileCase{"READY with Socket-Type spelled oddly", oddKey}, // zmq4 alone: "unknown socket-type" panic
		hostileCase{"READY with an unknown socket type", fakevllm.Ready("FOO")},
		hostileCase{"many empty frames", append(fakevllm.Ready(typ), bytes.Repeat([]byte{0x01, 0}, 64)...)},
		hostileCase{"multi-part past the cap", multi})
}

// newGoodPub starts a well-behaved publisher listening on (bind) or dialling endpoint.
func newGoodPub(t *testing.T, endpoint string, bind bool) *fakevllm.Pub {
	t.Helper()
	addr := endpoint[len("tcp://"):]
	var p *fakevllm.Pub
	var err error
	if bind {
		p, err = fakevllm.ListenPub(addr)
	} else {
		p, err = fakevllm.DialPub(addr)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return p
}

// runSub runs a subscriber until the test ends.
func runSub(t *testing.T, cfg subscriber.Config) (*subscriber.Subscriber, *engine.Engine) {
	t.Helper()
	eng, err := engine.New(engine.Config{Shards: 2, JumpSize: 4})
	if err != nil {
		t.Fatal(err)
	}
	cfg.Index, cfg.Worker, cfg.BlockSize = eng, "w", 4
	cfg.ReconnectMin, cfg.ReconnectMax = time.Millisecond, 20*time.Millisecond
	if cfg.ReplayTimeout == 0 {
		cfg.ReplayTimeout = 2 * time.Second
	}
	s, err := subscriber.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	var runErr error
	go func() {
		defer wg.Done()
		runErr = s.Run(ctx)
	}()
	t.Cleanup(func() {
		cancel()
		wg.Wait()
		eng.Close()
		if runErr != nil {
			t.Errorf("Run: %v", runErr)
		}
	})
	return s, eng
}

// waitLive publishes until the subscriber is live with the publisher's block.
func waitLive(t *testing.T, s *subscriber.Subscriber, eng *engine.Engine, p *fakevllm.Pub) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for {
		st := s.Status()
		if st.State == subscriber.StateLive && st.Batches > 0 && eng.Stats().Workers == 1 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("subscriber not live with a good publisher: %+v", st)
		}
		p.Send()
		time.Sleep(5 * time.Millisecond) // pacing of a bounded probe loop
	}
}

// serveHostile runs fakevllm.ServeHostile on l and returns its closed channel. Called
// before runSub, its cleanup (close l, wait for ServeHostile) runs after the
// subscriber's has closed the connections, so no goroutine of it outlives the test.
func serveHostile(t *testing.T, l net.Listener, payload []byte) <-chan struct{} {
	t.Helper()
	closed := make(chan struct{}, 64)
	done := make(chan struct{})
	go func() {
		defer close(done)
		fakevllm.ServeHostile(l, payload, closed)
	}()
	t.Cleanup(func() {
		l.Close()
		for { // every connection's goroutine reports on closed before ServeHostile returns
			select {
			case <-closed:
			case <-done:
				return
			}
		}
	})
	return closed
}

// TestHostilePublisherDialMode: whatever listens on the engine's endpoint sends a
// greeting and a frame header declaring 2^50, 2^40 or 2^31 bytes (zmq4 alone panics,
// runs out of memory or allocates 2 GiB). The subscriber refuses it, counts it, closes
// the connection, and redials; once a good publisher takes the endpoint it is live.
func TestHostilePublisherDialMode(t *testing.T) {
	for _, hc := range hostileCases("PUB") {
		t.Run(hc.name, func(t *testing.T) {
			l, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			ep := "tcp://" + l.Addr().String()
			closed := serveHostile(t, l, hc.bytes)
			s, eng := runSub(t, subscriber.Config{Endpoint: ep})
			for i := 0; i < 2; i++ { // refused, redialled, refused again
				<-closed
			}
			l.Close()
			waitFor(t, 30*time.Second, "refusals counted", func() bool { return s.Status().PeersRefused >= 2 })
			if st := s.Status(); st.State == subscriber.StateLive && st.Batches > 0 {
				t.Fatalf("live on a hostile peer: %+v", st)
			}
			waitLive(t, s, eng, newGoodPub(t, ep, true))
		})
	}
}

// TestHostilePeerBindMode: anyone who can connect to a bound SUB sends the same
// headers; the subscriber survives and a good publisher connecting later is applied.
func TestHostilePeerBindMode(t *testing.T) {
	for _, hc := range hostileCases("PUB") {
		t.Run(hc.name, func(t *testing.T) {
			ep := freeport.Endpoint(t)
			s, eng := runSub(t, subscriber.Config{Endpoint: ep, Bind: true})
			addr := ep[len("tcp://"):]
			for i := 0; i < 3; i++ {
				var c net.Conn
				waitFor(t, 10*time.Second, "bound socket listening", func() bool {
					var err error
					c, err = net.Dial("tcp", addr)
					return err == nil
				})
				fakevllm.Hostile(c, hc.bytes) // returns once the subscriber closed it
				c.Close()
			}
			waitFor(t, 30*time.Second, "refusals counted", func() bool { return s.Status().PeersRefused >= 3 })
			waitLive(t, s, eng, newGoodPub(t, ep, false))
		})
	}
}

// TestSilentPeerCutOff: a peer that accepts the connection and never greets is cut off
// after the handshake bound (zmq4 alone waits forever in Dial, and Run with it).
func TestSilentPeerCutOff(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	closed := make(chan struct{}, 64)
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				_ = c.SetDeadline(time.Now().Add(30 * time.Second))
				_, _ = io.Copy(io.Discard, c)
				closed <- struct{}{}
			}()
		}
	}()
	s, _ := runSub(t, subscriber.Config{Endpoint: "tcp://" + l.Addr().String(), ReplayTimeout: 50 * time.Millisecond})
	<-closed
	waitFor(t, 10*time.Second, "connect failure recorded", func() bool { return s.Status().LastError != "" })
}

// TestTooManyBoundConnections: a bound socket holds at most a few connections; more
// are refused (each could make zmq4 hold one capped frame).
func TestTooManyBoundConnections(t *testing.T) {
	ep := freeport.Endpoint(t)
	s, _ := runSub(t, subscriber.Config{Endpoint: ep, Bind: true})
	addr := ep[len("tcp://"):]
	var conns []net.Conn
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	// Complete handshakes so each connection is held by zmq4.
	for len(conns) < 12 {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			continue // not listening yet
		}
		conns = append(conns, c)
		if _, err := c.Write(append(fakevllm.Greeting(), fakevllm.Ready("PUB")...)); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, 10*time.Second, "extra connections refused", func() bool { return s.Status().PeersRefused >= 4 })
}

func TestMaxMessageBytesConfig(t *testing.T) {
	eng, err := engine.New(engine.Config{Shards: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer eng.Close()
	for _, n := range []int{-1, 1, subscriber.MaxMaxMessageBytes + 1} {
		_, err := subscriber.New(subscriber.Config{Endpoint: "tcp://127.0.0.1:1", Worker: "w", Index: eng, MaxMessageBytes: n})
		if !errors.Is(err, subscriber.ErrConfig) {
			t.Errorf("MaxMessageBytes %d: err %v, want ErrConfig", n, err)
		}
	}
}

// TestHostileReplaySocket: the replay endpoint answers the DEALER with a frame header
// declaring 2^50 bytes. The replay fails, the peer is refused and counted, and the live
// stream's batches are still applied; a worker missing the history before them stays
// stale with its replay short, retried (each retry refused again) until an endpoint
// answers.
func TestHostileReplaySocket(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := serveHostile(t, l, append(fakevllm.Ready("ROUTER"), fakevllm.LongHeader(0, 1<<50)...))
	ep := freeport.Endpoint(t)
	pub := newGoodPub(t, ep, true)
	s, eng := runSub(t, subscriber.Config{Endpoint: ep, ReplayEndpoint: "tcp://" + l.Addr().String()})
	<-closed
	waitFor(t, 30*time.Second, "replay refused", func() bool {
		st := s.Status()
		return st.PeersRefused >= 1 && st.ReplayFailures >= 1
	})
	waitFor(t, 30*time.Second, "live batches applied", func() bool {
		pub.Send()
		return s.Status().Batches > 0 && eng.Stats().Workers == 1
	})
	// Whether history is missing depends on the first live batch the SUB received
	// (a PUB drops what it sends before the subscription arrives): from seq 0 nothing
	// is, and the worker is live; from a later one the refused replay leaves it short,
	// and stale. Either way the state says which.
	if st := s.Status(); st.ReplayShort == (st.State == subscriber.StateLive) {
		t.Fatalf("a worker whose replay was refused: state %s with its replay short %v: %+v", st.State, st.ReplayShort, st)
	}
}
