package subscriber

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/kvindex/kvindex/internal/fakevllm"
	"github.com/kvindex/kvindex/internal/freeport"
)

// TestRunFor: the subscribers of a group follow their publishers (two fake vLLM
// engines publishing in the background) until the run's end, where atEnd finds every
// one running (it waits there for each to sync, which only a running subscriber does)
// and none stopped; once RunFor returns every one is stopped.
func TestRunFor(t *testing.T) {
	const bs = 4
	fl, err := fakevllm.NewFleet(fakevllm.FleetConfig{Engines: 2, Drivers: 1, Workload: fakevllm.Workload{BlockSize: bs, SystemBlocks: 3}})
	if err != nil {
		t.Fatal(err)
	}
	defer fl.Close()
	stopDriving := fl.DriveInBackground(context.Background(), 200)
	defer stopDriving()
	eng := newEngine(t)
	subs := make([]*Subscriber, fl.Engines())
	for i := range subs {
		pub, replay := fl.Endpoints(i)
		subs[i], err = New(Config{Endpoint: pub, ReplayEndpoint: replay, Worker: fakevllm.WorkerName(i), Model: fakevllm.Model,
			BlockSize: bs, Index: eng, ReconnectMin: time.Millisecond, ReconnectMax: 10 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
	}
	ends := 0
	err = RunFor(context.Background(), subs, 10*time.Millisecond, func() {
		ends++
		for _, s := range subs {
			if err := s.Wait(context.Background()); err != nil {
				t.Errorf("%s at the end of the run: Wait %v", s.Worker(), err)
			}
			if st := s.Status(); st.State == StateStopped || !st.Synced {
				t.Errorf("%s at the end of the run: state %v, synced %v", s.Worker(), st.State, st.Synced)
			}
		}
	})
	if err != nil || ends != 1 {
		t.Fatalf("RunFor: %v, atEnd called %d times", err, ends)
	}
	for _, s := range subs {
		if st := s.State(); st != StateStopped {
			t.Errorf("%s after RunFor: state %v, want stopped", s.Worker(), st)
		}
	}
}

// TestRunForEnds: a context that has ended ends the run at once (d is an hour), atEnd
// still runs, and a Run that fails (a subscriber that has run before) is RunFor's
// error, after the other has stopped.
func TestRunForEnds(t *testing.T) {
	eng := newEngine(t)
	newSub := func() *Subscriber {
		s, err := New(Config{Endpoint: freeport.Endpoint(t), Worker: "w", Index: eng, Grace: -1})
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	ran := newSub()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := ran.Run(ctx); err != nil {
		t.Fatal(err)
	}
	fresh := newSub()
	ends := 0
	err := RunFor(ctx, []*Subscriber{fresh, ran}, time.Hour, func() { ends++ })
	if !errors.Is(err, ErrRunning) || ends != 1 {
		t.Fatalf("RunFor: %v, atEnd called %d times; want ErrRunning, 1", err, ends)
	}
	if st := fresh.State(); st != StateStopped {
		t.Fatalf("the other subscriber after RunFor: state %v, want stopped", st)
	}
	if err := RunFor(ctx, nil, time.Hour, nil); err != nil {
		t.Fatalf("RunFor of no subscribers: %v", err)
	}
}
