package subscriber_test

import (
	"errors"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/kvindex/kvindex/engine"
	"github.com/kvindex/kvindex/internal/fakevllm"
	"github.com/kvindex/kvindex/internal/freeport"
	"github.com/kvindex/kvindex/subscriber"
)

// idleConns opens n connections to addr that greet as a PUB and then send nothing.
func idleConns(t *testing.T, addr string, n int) {
	t.Helper()
	for opened := 0; opened < n; {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			continue // not listening yet
		}
		t.Cleanup(func() { c.Close() })
		if _, err := c.Write(append(fakevllm.Greeting(), fakevllm.Ready("PUB")...)); err != nil {
			t.Fatal(err)
		}
		opened++
	}
}

// TestBoundSocketIdleLockout: eight idle connections fill a bound socket (before, they
// locked the real publisher out for as long as they stayed); the publisher that then
// connects takes the place of one idle for two seconds, and the worker goes live.
func TestBoundSocketIdleLockout(t *testing.T) {
	ep := freeport.Endpoint(t)
	s, eng := runSub(t, subscriber.Config{Endpoint: ep, Bind: true})
	addr := ep[len("tcp://"):]
	idleConns(t, addr, 8)
	// The publisher dials as libzmq does: again after a refused connection.
	deadline := time.Now().Add(15 * time.Second)
	for {
		pub := dialPub(t, addr)
		for range 40 {
			pub.Send()
			time.Sleep(5 * time.Millisecond) // pacing of a bounded probe loop
		}
		if st := s.Status(); st.State == subscriber.StateLive && st.Batches > 0 && eng.Stats().Workers == 1 {
			if st.PeersRefused == 0 || !strings.Contains(st.LastRefusal, "connection") {
				t.Fatalf("live without an eviction: %+v", st)
			}
			return
		}
		pub.Close()
		if time.Now().After(deadline) {
			t.Fatalf("the publisher never got in: %+v", s.Status())
		}
	}
}

// dialPub connects a well-behaved publisher to a bound subscriber at addr, once it
// listens.
func dialPub(t *testing.T, addr string) *fakevllm.Pub {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		p, err := fakevllm.DialPub(addr)
		if err == nil {
			t.Cleanup(p.Close)
			return p
		}
		if time.Now().After(deadline) {
			t.Fatal(err)
		}
		time.Sleep(5 * time.Millisecond) // bounded poll until the socket listens
	}
}

// TestBoundSocketAllowedPeers: with AllowedPeers, a peer outside them is closed on
// accept and counted, one inside is served; AllowedPeers needs Bind and valid prefixes.
func TestBoundSocketAllowedPeers(t *testing.T) {
	ep := freeport.Endpoint(t)
	s, _ := runSub(t, subscriber.Config{Endpoint: ep, Bind: true, AllowedPeers: []string{"10.9.9.9", "192.168.0.0/16"}})
	pub := dialPub(t, ep[len("tcp://"):])
	waitFor(t, 10*time.Second, "the loopback peer refused", func() bool {
		pub.Send()
		return s.Status().PeersRefused > 0
	})
	if st := s.Status(); st.Batches != 0 || st.LastRefusal == "" {
		t.Fatalf("a peer outside the allowed ones got through: %+v", st)
	}

	ep2 := freeport.Endpoint(t)
	s2, eng2 := runSub(t, subscriber.Config{Endpoint: ep2, Bind: true, AllowedPeers: []string{"127.0.0.0/8"}})
	waitLive(t, s2, eng2, dialPub(t, ep2[len("tcp://"):]))

	eng, err := engine.New(engine.Config{Shards: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer eng.Close()
	for _, cfg := range []subscriber.Config{
		{Endpoint: "tcp://127.0.0.1:1", AllowedPeers: []string{"127.0.0.1"}}, // dial mode
		{Endpoint: "tcp://127.0.0.1:1", Bind: true, AllowedPeers: []string{"not-an-ip"}},
		{Endpoint: "tcp://127.0.0.1:1", Bind: true, AllowedPeers: []string{"10.0.0.0/99"}},
	} {
		cfg.Worker, cfg.Index = "w", eng
		if _, err := subscriber.New(cfg); !errors.Is(err, subscriber.ErrConfig) {
			t.Errorf("%+v: %v, want ErrConfig", cfg.AllowedPeers, err)
		}
	}
}
