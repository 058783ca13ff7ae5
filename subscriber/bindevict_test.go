package subscriber_test

import (
	"net"
	"sync"
	"testing"
	"time"

	"github.com/kvindex/kvindex/internal/fakevllm"
	"github.com/kvindex/kvindex/internal/freeport"
	"github.com/kvindex/kvindex/subscriber"
)

// TestBoundGarbagePeersEvicted (issue 33, row 14): eight peers that fill a bound
// socket and each send a garbage message every 100 ms were never idle, so never
// evicted: the real publisher stayed locked out. Only a message shaped as a
// publisher's counts as activity now, so the garbage senders are evicted as idle ones
// are, the real publisher gets in and the worker goes live.
func TestBoundGarbagePeersEvicted(t *testing.T) {
	ep := freeport.Endpoint(t)
	s, eng := runSub(t, subscriber.Config{Endpoint: ep, Bind: true})
	addr := ep[len("tcp://"):]
	stop := make(chan struct{})
	var wg sync.WaitGroup
	defer func() {
		close(stop)
		wg.Wait()
	}()
	listenBy := time.Now().Add(10 * time.Second)
	for attackers := 0; attackers < subscriber.MaxBoundConns; {
		c, err := net.Dial("tcp", addr)
		if err != nil { // not listening yet
			if time.Now().After(listenBy) {
				t.Fatalf("the bound socket never listened: %v", err)
			}
			time.Sleep(time.Millisecond) // the retry's pace, not a synchronisation
			continue
		}
		attackers++
		wg.Add(1)
		go func() { // a hostile peer: a handshake, then garbage every 100 ms
			defer wg.Done()
			defer c.Close()
			if _, err := c.Write(append(fakevllm.Greeting(), fakevllm.Ready("PUB")...)); err != nil {
				return
			}
			tick := time.NewTicker(100 * time.Millisecond) // the attack's pace
			defer tick.Stop()
			for {
				select {
				case <-stop:
					return
				case <-tick.C:
					if _, err := c.Write(fakevllm.Message([]byte("junk"), []byte("garbage, not a batch"))); err != nil {
						return
					}
				}
			}
		}()
	}
	// The real publisher connects (again, as a PUB reconnects) until it is let in.
	deadline := time.Now().Add(20 * time.Second)
	for {
		p, err := fakevllm.DialPub(addr)
		if err != nil {
			t.Fatal(err)
		}
		for range 10 {
			p.Send()
			time.Sleep(20 * time.Millisecond) // pacing of a bounded probe loop
		}
		p.Close()
		if st := s.Status(); st.State == subscriber.StateLive && st.Batches > 0 && eng.Stats().Workers == 1 {
			if st.PeersRefused == 0 {
				t.Fatalf("live without evicting a garbage peer: %+v", st)
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the real publisher stayed locked out: %+v", s.Status())
		}
	}
}
