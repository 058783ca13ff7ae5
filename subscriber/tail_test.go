package subscriber

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/kvindex/kvindex/internal/fakevllm"
)

// TestTailLossRecovered: the engine's last batch never arrives live (its PUB dropped
// it at the high-water mark) and nothing follows it; once the stream has been quiet for
// TailCheck, a catch-up fetches it from the replay buffer. Without the check the worker
// would miss it until the engine published again.
func TestTailLossRecovered(t *testing.T) {
	pub, err := fakevllm.ListenPub("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	e := newEngine(t)
	fp := &fakePub{}
	s, err := New(Config{Endpoint: "tcp://" + pub.Addr(), ReplayEndpoint: "tcp://127.0.0.1:1", Worker: "w", Index: e,
		TailCheck: 100 * time.Millisecond, ReconnectMin: time.Millisecond, ReconnectMax: 10 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	s.replay = fp.replay
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		if err := s.Run(ctx); err != nil {
			t.Errorf("Run: %v", err)
		}
	}()
	defer func() { cancel(); wg.Wait() }()
	waitFor := func(what string, ok func(Status) bool) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for !ok(s.Status()) || pub.Conns() == 0 {
			if time.Now().After(deadline) {
				t.Fatalf("%s: status %+v", what, s.Status())
			}
			time.Sleep(time.Millisecond) // polling a condition, with a deadline
		}
	}
	waitFor("synced", func(st Status) bool { return st.Synced && st.State == StateLive })
	// Batch 0 goes out live; batch 1 only reaches the engine's replay buffer.
	fp.add(0, fakevllm.Batch(0))
	fp.add(1, fakevllm.Batch(1))
	pub.Send()
	waitFor("tail fetched", func(st Status) bool { return st.HasSeq && st.LastSeq == 1 })
	st := s.Status()
	if st.TailChecks == 0 || st.GapsRecovered != 1 || st.State != StateLive || st.Batches != 2 {
		t.Fatalf("status %+v", st)
	}
	fp.mu.Lock()
	asked := len(fp.asked)
	fp.mu.Unlock()
	// An idle stream is checked once per burst, not again and again.
	time.Sleep(400 * time.Millisecond) // not a synchronisation: an absence takes time to show
	fp.mu.Lock()
	again := len(fp.asked) - asked
	fp.mu.Unlock()
	if again != 0 || s.Status().TailChecks != st.TailChecks {
		t.Fatalf("%d more replays while idle", again)
	}
}
