package subscriber

import (
	"runtime"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/kvindex/kvindex/engine"
)

// overlapIdx is a batch index that records how many callers it had at once.
type overlapIdx struct {
	in, most atomic.Int32
}

func (x *overlapIdx) Apply(*engine.Event) error { return nil }

func (x *overlapIdx) ApplyBatch(evs []engine.Event, errs []error) []error {
	n := x.in.Add(1)
	for m := x.most.Load(); n > m && !x.most.CompareAndSwap(m, n); m = x.most.Load() {
	}
	runtime.Gosched() // let another subscriber's batch in, were it allowed
	x.in.Add(-1)
	for range evs {
		errs = append(errs, nil)
	}
	return errs
}

// TestApplySlotsBound: however many subscribers apply batches at once, at most
// cap(applySlots) (GOMAXPROCS-1, at least 1) are inside the index together, so one P
// stays free of ingestion for queries.
func TestApplySlotsBound(t *testing.T) {
	if want := max(1, runtime.GOMAXPROCS(0)-1); cap(applySlots) != want {
		t.Fatalf("cap(applySlots) %d, want %d", cap(applySlots), want)
	}
	idx := &overlapIdx{}
	payloads := ingestBatches(64)
	var wg sync.WaitGroup
	for w := range 8 {
		s, err := New(Config{Endpoint: "tcp://127.0.0.1:1", Worker: "w" + string(rune('a'+w)), Index: idx, BlockSize: 16})
		if err != nil {
			t.Fatal(err)
		}
		wg.Go(func() {
			for seq, p := range payloads {
				if err := s.applyBatch(uint64(seq), p); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	if m := idx.most.Load(); m < 1 || int(m) > cap(applySlots) {
		t.Fatalf("%d batches in the index at once, want 1..%d", m, cap(applySlots))
	}
	if len(applySlots) != 0 {
		t.Fatalf("%d apply slots still held", len(applySlots))
	}
}

// plainIdx is an Index without ApplyBatch (as a relay's, which publishes each event).
type plainIdx struct{}

func (plainIdx) Apply(*engine.Event) error { return nil }

// TestApplySlotsOnlyBatchIndex: an Index without ApplyBatch takes no apply slot, so a
// relay's subscribers are not held up by each other's network waits: with every slot
// taken, a batch still goes through.
func TestApplySlotsOnlyBatchIndex(t *testing.T) {
	s, err := New(Config{Endpoint: "tcp://127.0.0.1:1", Worker: "w", Index: plainIdx{}, BlockSize: 16})
	if err != nil {
		t.Fatal(err)
	}
	for range cap(applySlots) {
		applySlots <- struct{}{}
	}
	defer func() {
		for range cap(applySlots) {
			<-applySlots
		}
	}()
	if err := s.applyBatch(0, ingestBatches(1)[0]); err != nil {
		t.Fatal(err)
	}
	if n := s.local.Stored; n != 1 {
		t.Fatalf("stored %d events, want 1", n)
	}
}
