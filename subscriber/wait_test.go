package subscriber

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/kvindex/kvindex/internal/fakevllm"
	"github.com/kvindex/kvindex/internal/freeport"
)

// TestWait: Wait answers a cancelled context before the subscriber runs, returns nil
// once the first catch-up is done (and Synced agrees), and ErrNotSyncing once Run has
// returned; a caller blocked in Wait on a subscriber that never syncs is woken by Run
// returning, not left behind.
func TestWait(t *testing.T) {
	pub, err := fakevllm.ListenPub("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	newSub := func(endpoint string) *Subscriber {
		s, err := New(Config{Endpoint: endpoint, ReplayEndpoint: "tcp://127.0.0.1:1", Worker: "w", Index: newEngine(t),
			ReconnectMin: time.Millisecond, ReconnectMax: 10 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		s.replay = (&fakePub{}).replay
		return s
	}
	run := func(s *Subscriber) (stop func()) {
		ctx, cancel := context.WithCancel(context.Background())
		var wg sync.WaitGroup
		wg.Go(func() {
			if err := s.Run(ctx); err != nil {
				t.Errorf("Run: %v", err)
			}
		})
		return func() { cancel(); wg.Wait() }
	}

	s := newSub("tcp://" + pub.Addr())
	done, cancel := context.WithCancel(context.Background())
	cancel()
	if err := s.Wait(done); !errors.Is(err, context.Canceled) || s.Synced() {
		t.Fatalf("before Run: Wait %v, Synced %v; want context.Canceled, false", err, s.Synced())
	}
	stop := run(s)
	if err := s.Wait(context.Background()); err != nil || !s.Synced() {
		t.Fatalf("running: Wait %v, Synced %v; want nil, true", err, s.Synced())
	}
	stop()
	if err := s.Wait(context.Background()); !errors.Is(err, ErrNotSyncing) {
		t.Fatalf("after Run: Wait %v, want ErrNotSyncing", err)
	}

	// No publisher, and a replay endpoint that never answers: the waiter blocks until
	// Run returns.
	never := newSub(freeport.Endpoint(t))
	never.replay = func(ctx context.Context, _ uint64, _ func(uint64, []byte) bool) error {
		<-ctx.Done()
		return ctx.Err()
	}
	stop = run(never)
	waited := make(chan error, 1)
	go func() { waited <- never.Wait(context.Background()) }()
	stop()
	if err := <-waited; !errors.Is(err, ErrNotSyncing) {
		t.Fatalf("waiter of a stopped subscriber: %v, want ErrNotSyncing", err)
	}
}
