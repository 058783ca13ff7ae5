package parallel

import (
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestEachCallsEveryIndexOnce: do and done run once for every index, whatever the
// number of workers (none asked for, fewer than the jobs, more than the jobs), each do
// writing only its own slot, and done's calls one at a time (it appends to a slice with
// no lock of its own: the race detector reports it if two ever overlap).
func TestEachCallsEveryIndexOnce(t *testing.T) {
	for _, c := range []struct{ n, workers int }{{0, 3}, {1, 0}, {5, -1}, {7, 3}, {3, 8}, {100, 4}} {
		ran := make([]int, c.n)
		var finished []int
		Each(c.n, c.workers, func(i int) { ran[i]++ }, func(i int) {
			if ran[i] != 1 {
				t.Errorf("n %d workers %d: done(%d) before its do returned", c.n, c.workers, i)
			}
			finished = append(finished, i)
		})
		for i, k := range ran {
			if k != 1 {
				t.Errorf("n %d workers %d: do(%d) ran %d times", c.n, c.workers, i, k)
			}
		}
		slices.Sort(finished)
		if len(finished) != c.n || (c.n > 0 && (finished[0] != 0 || finished[c.n-1] != c.n-1 || len(slices.Compact(finished)) != c.n)) {
			t.Errorf("n %d workers %d: done saw %v", c.n, c.workers, finished)
		}
	}
	Each(3, 2, func(int) {}, nil) // done may be nil
}

// TestEachOrder: one worker runs the indices in increasing order (the reports hand
// their jobs out in the order they list them).
func TestEachOrder(t *testing.T) {
	var order []int
	Each(10, 1, func(i int) { order = append(order, i) }, nil)
	if want := []int{0, 1, 2, 3, 4, 5, 6, 7, 8, 9}; !slices.Equal(order, want) {
		t.Fatalf("order %v, want %v", order, want)
	}
}

// TestEachConcurrency: the workers run at once, and never more of them than asked for.
// Every do of the first round waits until all four have started, which only four
// workers at once can do; a fifth at once would show in the peak.
func TestEachConcurrency(t *testing.T) {
	const workers = 4
	var running, peak, started atomic.Int32
	all := make(chan struct{})
	Each(3*workers, workers, func(int) {
		n := running.Add(1)
		for p := peak.Load(); n > p && !peak.CompareAndSwap(p, n); p = peak.Load() {
		}
		if started.Add(1) == workers {
			close(all)
		}
		select {
		case <-all:
		case <-time.After(time.Minute):
			t.Error("the workers never ran at once")
		}
		running.Add(-1)
	}, nil)
	if p := peak.Load(); p != workers {
		t.Fatalf("peak %d goroutines in do, want %d", p, workers)
	}
}

// TestBeside: a and b run at once (b waits for a word from a, which only a concurrent a
// can send), and what a wrote is visible once Beside returns.
func TestBeside(t *testing.T) {
	ready := make(chan struct{})
	var fromA, fromB int
	Beside(func() { fromA = 1; close(ready) }, func() {
		select {
		case <-ready:
		case <-time.After(time.Minute):
			t.Error("a never ran beside b")
		}
		fromB = 2
	})
	if fromA != 1 || fromB != 2 {
		t.Fatalf("a wrote %d, b %d; want 1, 2", fromA, fromB)
	}
}

// TestSerialize: the workers of a pool all call the serialised function, which adds to
// a plain int (the race detector reports two calls at once), and every call counts.
func TestSerialize(t *testing.T) {
	sum := 0
	add := Serialize(func(n int) { sum += n })
	Each(100, 4, func(i int) { add(i) }, nil)
	if sum != 99*100/2 {
		t.Fatalf("sum %d, want %d", sum, 99*100/2)
	}
}
