package subscriber_test

import (
	"math/rand/v2"
	"net"
	"os"
	"runtime"
	"runtime/debug"
	"testing"
	"time"

	"github.com/kvindex/kvindex/internal/fakevllm"
	"github.com/kvindex/kvindex/internal/freeport"
	"github.com/kvindex/kvindex/internal/refmodel"
	"github.com/kvindex/kvindex/subscriber"
	"github.com/kvindex/kvindex/subscriber/pubtest"
)

// TestSoak (make soak; KVINDEX_SOAK=DURATION, skipped otherwise): rounds of publisher
// churn against two ranks through real libzmq until the duration is spent: a stream
// with lost batches (gaps recovered by replay), a disconnection with batches published
// meanwhile, a publisher restart, and hostile peers against a third, bound subscriber.
// After every round the answers equal the reference model's; goroutines, open file
// descriptors and RSS (after FreeOSMemory) stay within a margin of what they were after
// the first round.
func TestSoak(t *testing.T) {
	d, err := time.ParseDuration(os.Getenv("KVINDEX_SOAK"))
	if err != nil {
		t.Skip("SKIP (set KVINDEX_SOAK=3m, or run make soak)")
	}
	h := newHarness(t, pubtest.Options{Ranks: 2, ConsecutivePorts: true, Bind: true}, nil)
	h.waitSynced()
	// The hostile side: a bound subscriber of its own worker, never fed anything valid.
	hostileEP := freeport.Endpoint(t)
	hs, _ := runSub(t, subscriber.Config{Endpoint: hostileEP, Bind: true})
	hostile := func(n int) {
		for range n {
			c, err := net.Dial("tcp", hostileEP[len("tcp://"):])
			if err != nil {
				continue // not listening yet
			}
			fakevllm.Hostile(c, fakevllm.LongHeader(0x04, 1<<50))
			c.Close()
		}
	}
	m := refmodel.New()
	r := rand.New(rand.NewPCG(99, 1))
	var queries [][]uint64
	// waitAll waits for every rank's last batch. A batch sent live in the moment after a
	// reconnection, before libzmq's PUB has the new subscription, is lost without a
	// trace until the next message reveals the gap (ZeroMQ's slow joiner): like a real
	// engine, the soak keeps publishing (empty batches) while it waits.
	waitAll := func(last []uint64) {
		t.Helper()
		for i, s := range h.subs {
			deadline := time.Now().Add(30 * time.Second)
			for n := 1; ; n++ {
				st := s.Status()
				if st.HasSeq && st.LastSeq >= last[i] {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("timed out waiting for %s at seq %d: %+v", s.Worker(), last[i], st)
				}
				time.Sleep(5 * time.Millisecond) // bounded poll of a condition
				// A heartbeat batch every 250 ms of waiting.
				if n%50 == 0 {
					seq, err := h.pub.Publish(i, true)
					if err != nil {
						t.Fatal(err)
					}
					last[i] = seq
				}
			}
			h.waitSeq(i, last[i])
		}
	}
	type sample struct {
		goroutines, fds int
		rssKB           int64
	}
	take := func() sample {
		debug.FreeOSMemory()
		fds, _ := os.ReadDir("/proc/self/fd")
		return sample{runtime.NumGoroutine(), len(fds), procKB(t, "VmRSS")}
	}
	var base sample
	start := time.Now()
	rounds := 0
	for ; rounds < 4 || time.Since(start) < d; rounds++ {
		var last []uint64
		var q [][]uint64
		switch rounds % 4 {
		case 0: // gaps
			q, last = h.stream(r, m, 400, 7)
		case 1: // cut off, then back
			if err := h.pub.Disconnect(1); err != nil {
				t.Fatal(err)
			}
			waitFor(t, 10*time.Second, "disconnect seen", func() bool { return !h.subs[1].Status().Connected })
			q, _ = h.stream(r, m, 300, 0)
			if err := h.pub.Reconnect(1); err != nil {
				t.Fatal(err)
			}
			q2, l := h.stream(r, m, 10, 0)
			q, last = append(q, q2...), l
		case 2: // restart: a new engine process, empty cache
			if err := h.pub.Restart(0); err != nil {
				t.Fatal(err)
			}
			m.Cleared(h.subs[0].Worker())
			q, last = h.stream(r, m, 300, 0)
		case 3: // hostile peers
			hostile(20)
			q, last = h.stream(r, m, 200, 0)
		}
		waitAll(last)
		queries = append(queries, q...)
		if len(queries) > 2000 {
			queries = queries[len(queries)-2000:]
		}
		h.check(m, queries)
		if rounds == 3 {
			base = take()
		}
	}
	end := take()
	st := hs.Status()
	t.Logf("%d rounds in %v: goroutines %d -> %d, fds %d -> %d, RSS %d -> %d kB; hostile peers refused %d",
		rounds, time.Since(start).Round(time.Second), base.goroutines, end.goroutines, base.fds, end.fds, base.rssKB, end.rssKB, st.PeersRefused)
	if end.goroutines > base.goroutines+10 || end.fds > base.fds+10 || end.rssKB > base.rssKB*3/2+32<<10 {
		t.Errorf("resources grew: %+v -> %+v", base, end)
	}
	if st.PeersRefused == 0 {
		t.Error("no hostile peer refused")
	}
	for _, s := range h.subs {
		if s := s.Status(); s.State != subscriber.StateLive {
			t.Errorf("%s ends %v: %+v", s.Worker, s.State, s)
		}
	}
}
