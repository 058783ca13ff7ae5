//go:build !race

package rwlock

import (
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// waiters is how many readers and writers wait in l's slow path now.
func (l *RWMutex) waiters() (r, w int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.rWait, l.wWait
}

// waitFor yields until l's slow path holds r readers and w writers waiting: the test's
// goroutines have queued (a state to reach, not a time to sleep). It fails the test if
// that takes more than ten seconds: the state is never reached.
func waitFor(t *testing.T, l *RWMutex, r, w int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		gr, gw := l.waiters()
		if gr == r && gw == w {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("waiting readers and writers: %d, %d; want %d, %d", gr, gw, r, w)
		}
		runtime.Gosched()
	}
}

func TestZeroValueUncontended(t *testing.T) {
	var l RWMutex
	for range 3 {
		l.Lock()
		require.Equal(t, int64(writer), l.state.Load())
		l.Unlock()
		l.RLock()
		l.RLock()
		require.Equal(t, int64(2), l.state.Load())
		l.RUnlock()
		l.RUnlock()
		require.Zero(t, l.state.Load())
	}
}

// TestHandOverToReaders: a reader that waits while a writer holds the lock gets it at
// the writer's release, before the same writer takes it again (the locked index's
// yield to queries in the middle of a batch relies on it).
func TestHandOverToReaders(t *testing.T) {
	for range 50 {
		var l RWMutex
		var entered atomic.Bool
		done := make(chan struct{})
		l.Lock()
		go func() {
			defer close(done)
			l.RLock()
			entered.Store(true)
			l.RUnlock()
		}()
		waitFor(t, &l, 1, 0)
		l.Unlock()
		l.Lock()
		require.True(t, entered.Load(), "the writer retook the lock before the waiting reader had it")
		l.Unlock()
		<-done
		require.Zero(t, l.state.Load())
	}
}

// TestWriterBlocksNewReaders: a writer waiting for readers to go is not passed by a
// reader that comes after it; that reader gets the lock at the writer's release.
func TestWriterBlocksNewReaders(t *testing.T) {
	for range 50 {
		var l RWMutex
		var wrote, sawWrite atomic.Bool
		var wg sync.WaitGroup
		l.RLock()
		wg.Go(func() {
			l.Lock()
			wrote.Store(true)
			l.Unlock()
		})
		waitFor(t, &l, 0, 1)
		wg.Go(func() {
			l.RLock()
			sawWrite.Store(wrote.Load())
			l.RUnlock()
		})
		waitFor(t, &l, 1, 1)
		require.False(t, wrote.Load())
		l.RUnlock()
		wg.Wait()
		require.True(t, sawWrite.Load(), "a reader that came after a waiting writer went first")
		require.Zero(t, l.state.Load())
	}
}

// TestWritersQueue: writers that meet a writer each get the lock in turn, and the
// word is clean after.
func TestWritersQueue(t *testing.T) {
	var l RWMutex
	var wg sync.WaitGroup
	n := 0
	l.Lock()
	for range 4 {
		wg.Go(func() {
			l.Lock()
			n++
			l.Unlock()
		})
	}
	waitFor(t, &l, 0, 4)
	l.Unlock()
	wg.Wait()
	require.Equal(t, 4, n)
	require.Zero(t, l.state.Load())
}

// TestExclusion runs readers and writers (some releasing and retaking in a loop, as the
// locked index's batches do) over shared plain memory: a writer must be alone, readers
// must see no writer and a consistent value. Under the race detector (make test) a
// missing happens-before edge is reported too.
func TestExclusion(t *testing.T) {
	var l RWMutex
	var writers, readers atomic.Int32
	var data [8]int // a writer sets every element to the same value
	iters := 20000
	if testing.Short() {
		iters = 5000
	}
	var wg sync.WaitGroup
	var bad atomic.Value
	fail := func(msg string) { bad.CompareAndSwap(nil, msg) }
	for g := range 3 {
		wg.Go(func() {
			l.Lock()
			for i := range iters {
				if writers.Add(1) != 1 || readers.Load() != 0 {
					fail("a writer was not alone")
				}
				for k := range data {
					data[k] = g*iters + i
				}
				writers.Add(-1)
				if i%4 == 0 {
					l.Unlock() // the batch's yield
					l.Lock()
				}
			}
			l.Unlock()
		})
	}
	for range 4 {
		wg.Go(func() {
			for range iters {
				l.RLock()
				readers.Add(1)
				if writers.Load() != 0 {
					fail("a reader met a writer")
				}
				for k := range data {
					if data[k] != data[0] {
						fail("a reader saw a torn write")
					}
				}
				readers.Add(-1)
				l.RUnlock()
			}
		})
	}
	wg.Wait()
	require.Nil(t, bad.Load())
	require.Zero(t, l.state.Load())
	r, w := l.waiters()
	require.Zero(t, r)
	require.Zero(t, w)
}

func TestMisusePanics(t *testing.T) {
	var l RWMutex
	require.PanicsWithValue(t, "rwlock: Unlock of an RWMutex not held for writing", l.Unlock)
	var m RWMutex
	require.PanicsWithValue(t, "rwlock: RUnlock of an RWMutex not held for reading", m.RUnlock)
	var w RWMutex
	w.Lock()
	require.PanicsWithValue(t, "rwlock: RUnlock of an RWMutex not held for reading", w.RUnlock)
}

// BenchmarkWriteCycle is one uncontended Lock and Unlock around one increment: this
// package's RWMutex beside sync.RWMutex and sync.Mutex (each through sync.Locker, so
// each pays the same indirect calls).
func BenchmarkWriteCycle(b *testing.B) {
	for _, c := range []struct {
		name string
		l    sync.Locker
	}{{"rwlock", new(RWMutex)}, {"sync.RWMutex", new(sync.RWMutex)}, {"sync.Mutex", new(sync.Mutex)}} {
		b.Run("impl="+c.name, func(b *testing.B) {
			n := 0
			for b.Loop() {
				c.l.Lock()
				n++
				c.l.Unlock()
			}
		})
	}
}

// BenchmarkReadCycle is RLock and RUnlock around one read, from every P at once.
func BenchmarkReadCycle(b *testing.B) {
	for _, c := range []struct {
		name string
		l    interface {
			RLock()
			RUnlock()
		}
	}{{"rwlock", new(RWMutex)}, {"sync.RWMutex", new(sync.RWMutex)}} {
		b.Run("impl="+c.name, func(b *testing.B) {
			shared := 1
			b.RunParallel(func(pb *testing.PB) {
				sum := 0
				for pb.Next() {
					c.l.RLock()
					sum += shared
					c.l.RUnlock()
				}
				_ = sum
			})
		})
	}
}
