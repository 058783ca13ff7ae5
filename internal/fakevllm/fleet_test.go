package fakevllm

import (
	"context"
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

// TestDriveInBackground: the fleet publishes on its own goroutine while its caller
// reads what it publishes (a probe, a sample prompt: `kvindex demo`'s queries); stop
// returns once the publishing has ended (the counts no longer move) and may be called
// twice; the end of the parent context ends it too, and another Drive may follow.
func TestDriveInBackground(t *testing.T) {
	f, err := NewFleet(FleetConfig{Engines: 2, Drivers: 1, Workload: Workload{BlockSize: 4, SystemBlocks: 3}})
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	stop := f.DriveInBackground(context.Background(), 1000)
	f.WantProbe(true)
	select {
	case p := <-f.Probes():
		if len(p.Content) == 0 || (p.Worker != WorkerName(0) && p.Worker != WorkerName(1)) {
			t.Errorf("probe %+v", p)
		}
	case <-time.After(time.Minute):
		t.Fatal("no batch published in a minute")
	}
	rng := rand.New(rand.NewPCG(1, 2))
	_, _ = f.SamplePrompt(rng, nil) // beside the driver, as the demo's queries read
	stop()
	stop()
	counts := f.Counts()
	var batches uint64
	for _, c := range counts {
		batches += c.Batches
	}
	if batches == 0 {
		t.Fatalf("counts %+v: nothing published", counts)
	}
	if again := f.Counts(); !slices.Equal(again, counts) {
		t.Fatalf("published after stop returned: %+v, then %+v", counts, again)
	}

	ctx, cancel := context.WithCancel(context.Background())
	stop = f.DriveInBackground(ctx, 1000)
	cancel()
	stop() // returns: the parent's end stopped the driver
	// No driver is left beside this one: the race detector reports two at once.
	f.Drive(context.Background(), 1000, time.Millisecond, false)
}
