package ringbuf

import (
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/kvindex/kvindex/internal/testsize"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// deadlockGuard is only a failure timeout; no test sleeps to synchronise.
const deadlockGuard = 30 * time.Second

func mustNew[T any](t testing.TB, capacity int) *Ring[T] {
	t.Helper()
	r, err := New[T](capacity)
	require.NoError(t, err)
	return r
}

// waitFor polls cond (yielding, never sleeping) until it holds, failing the
// test after deadlockGuard.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(deadlockGuard)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		runtime.Gosched()
	}
}

func TestNewValidation(t *testing.T) {
	tests := []struct {
		capacity int
		ok       bool
	}{
		{-4, false}, {-1, false}, {0, false}, {1, false}, {2, true}, {3, false},
		{4, true}, {6, false}, {64, true}, {100, false}, {1024, true},
		{1<<20 + 1, false}, {MaxCapacity + 1, false},
	}
	for _, tt := range tests {
		t.Run(fmt.Sprint(tt.capacity), func(t *testing.T) {
			r, err := New[int](tt.capacity)
			if !tt.ok {
				require.Error(t, err)
				assert.ErrorIs(t, err, ErrCapacity)
				assert.Regexp(t, `^ringbuf: `, err.Error())
				assert.Nil(t, r)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tt.capacity, r.Cap())
			assert.Equal(t, 0, r.Len())
			assert.False(t, r.Closed())
			assert.Equal(t, Stats{}, r.Stats())
		})
	}
}

// TestLayout asserts the padding that keeps the read-only fields, the
// producers' tail, the consumer's head, the doorbell flag and the parking
// state each on a cache line of its own. Ring's size is a multiple of the
// cache line, so its size class (and hence every allocated Ring) is
// cache-line aligned too.
func TestLayout(t *testing.T) {
	var r Ring[int]
	assert.Equal(t, uintptr(readOnlySize), unsafe.Offsetof(r.done)+unsafe.Sizeof(r.done))
	assert.Equal(t, uintptr(1*cacheLineSize), unsafe.Offsetof(r.tail))
	assert.Equal(t, uintptr(2*cacheLineSize), unsafe.Offsetof(r.head))
	assert.Equal(t, uintptr(3*cacheLineSize), unsafe.Offsetof(r.sleeping))
	assert.Equal(t, uintptr(4*cacheLineSize), unsafe.Offsetof(r.waiters))
	assert.Less(t, unsafe.Offsetof(r.waitNanos), uintptr(5*cacheLineSize))
	assert.Equal(t, uintptr(5*cacheLineSize), unsafe.Sizeof(r))
	assert.Equal(t, unsafe.Sizeof(r), unsafe.Sizeof(Ring[[100]byte]{}), "layout must not depend on T")
	assert.Equal(t, uintptr(16), unsafe.Sizeof(slot[[3]uint32]{}), "a 12-byte item's cell: 4-byte seq")

	for range 100 {
		p := mustNew[int](t, 2)
		assert.Zero(t, uintptr(unsafe.Pointer(p))%cacheLineSize, "Ring not cache-line aligned")
	}
}

func TestWraparoundOrder(t *testing.T) {
	for _, capacity := range []int{2, 4} {
		t.Run(fmt.Sprint("cap=", capacity), func(t *testing.T) {
			r := mustNew[int](t, capacity)
			dst := make([]int, capacity+1)
			next, want := 0, 0
			for round := 0; round < 20000; round++ {
				// Alternate TryPush, Push and PushBatch with varying fill.
				k := 1 + round%capacity
				switch round % 3 {
				case 0:
					for i := 0; i < k; i++ {
						require.True(t, r.TryPush(next))
						next++
					}
				case 1:
					for i := 0; i < k; i++ {
						require.NoError(t, r.Push(next))
						next++
					}
				case 2:
					vs := make([]int, k)
					for i := range vs {
						vs[i] = next + i
					}
					n, err := r.PushBatch(vs)
					require.NoError(t, err)
					require.Equal(t, k, n)
					next += k
				}
				require.Equal(t, k, r.Len())
				// Pop with a buffer size that varies, to exercise partial pops.
				for r.Len() > 0 {
					m := r.PopBatch(dst[:1+round%len(dst)])
					require.Positive(t, m)
					for _, v := range dst[:m] {
						require.Equal(t, want, v)
						want++
					}
				}
			}
			assert.Equal(t, next, want)
			assert.Equal(t, uint64(next), r.Stats().Pushes)
			assert.Zero(t, r.PopBatch(dst))
		})
	}
}

func TestTryPushFull(t *testing.T) {
	r := mustNew[int](t, 4)
	for i := 0; i < 4; i++ {
		require.True(t, r.TryPush(i))
	}
	assert.False(t, r.TryPush(99))
	assert.Equal(t, 4, r.Len())
	dst := make([]int, 1)
	require.Equal(t, 1, r.PopBatch(dst))
	assert.Equal(t, 0, dst[0])
	assert.True(t, r.TryPush(4))
	assert.False(t, r.TryPush(5))
	got := make([]int, 8)
	require.Equal(t, 4, r.PopBatch(got))
	assert.Equal(t, []int{1, 2, 3, 4}, got[:4])
	assert.Equal(t, uint64(5), r.Stats().Pushes)
	assert.Zero(t, r.Stats().FullWaits, "TryPush must never park")
}

func TestPopBatchZeroesSlots(t *testing.T) {
	r := mustNew[*int](t, 4)
	for round := 0; round < 3; round++ {
		vals := []*int{new(int), new(int), new(int)}
		n, err := r.PushBatch(vals)
		require.NoError(t, err)
		require.Equal(t, 3, n)
		dst := make([]*int, 4)
		require.Equal(t, 3, r.PopBatch(dst))
		for i := range vals {
			assert.Same(t, vals[i], dst[i])
		}
		for i := range r.slots {
			assert.Nil(t, r.slots[i].val, "slot %d retains a pointer", i)
		}
	}
}

func TestCloseSemantics(t *testing.T) {
	r := mustNew[int](t, 4)
	require.True(t, r.TryPush(1))
	require.NoError(t, r.Push(2))
	select { // drain the token rung by the first push
	case <-r.Doorbell():
	default:
	}
	r.Close()
	r.Close() // idempotent
	assert.True(t, r.Closed())
	assert.False(t, r.TryPush(3))
	assert.ErrorIs(t, r.Push(3), ErrClosed)
	n, err := r.PushBatch([]int{3, 4})
	assert.ErrorIs(t, err, ErrClosed)
	assert.Zero(t, n)
	n, err = r.PushBatch(nil)
	assert.NoError(t, err, "empty batch enqueues nothing and does not fail")
	assert.Zero(t, n)

	select {
	case <-r.Doorbell():
	default:
		t.Fatal("Close did not ring the doorbell")
	}
	dst := make([]int, 4)
	require.Equal(t, 2, r.PopBatch(dst), "items enqueued before Close stay poppable")
	assert.Equal(t, []int{1, 2}, dst[:2])
	assert.Zero(t, r.PopBatch(dst))
	assert.Equal(t, uint64(2), r.Stats().Pushes)
}

func TestConcurrentClose(t *testing.T) {
	r := mustNew[int](t, 2)
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(r.Close)
	}
	wg.Wait()
	assert.True(t, r.Closed())
}

func fill(t *testing.T, r *Ring[int], n int) {
	t.Helper()
	for i := 0; i < n; i++ {
		require.True(t, r.TryPush(i))
	}
}

func TestPushBlocksUntilClose(t *testing.T) {
	r := mustNew[int](t, 2)
	fill(t, r, 2)
	errc := make(chan error, 1)
	go func() { errc <- r.Push(42) }()
	waitFor(t, "producer to park", func() bool { return r.Stats().FullWaits == 1 })
	select {
	case err := <-errc:
		t.Fatalf("Push returned %v while the ring was full", err)
	default:
	}
	r.Close()
	select {
	case err := <-errc:
		assert.ErrorIs(t, err, ErrClosed)
	case <-time.After(deadlockGuard):
		t.Fatal("Close did not release the parked producer")
	}
	dst := make([]int, 4)
	assert.Equal(t, 2, r.PopBatch(dst), "the rejected item must not be enqueued")
	assert.Equal(t, []int{0, 1}, dst[:2])
	assert.Positive(t, r.Stats().WaitNanos)
}

// TestPushBlocksUntilPop: a producer parked on a full ring is released by the cells a
// pop frees, PopBatch's and TryPopBatch's alike.
func TestPushBlocksUntilPop(t *testing.T) {
	for _, pop := range []struct {
		name string
		f    func(*Ring[int], []int) int
	}{{"PopBatch", (*Ring[int]).PopBatch}, {"TryPopBatch", (*Ring[int]).TryPopBatch}} {
		t.Run(pop.name, func(t *testing.T) {
			r := mustNew[int](t, 2)
			fill(t, r, 2)
			errc := make(chan error, 1)
			go func() { errc <- r.Push(42) }()
			waitFor(t, "producer to park", func() bool { return r.Stats().FullWaits == 1 })
			dst := make([]int, 1)
			require.Equal(t, 1, pop.f(r, dst))
			assert.Equal(t, 0, dst[0])
			select {
			case err := <-errc:
				assert.NoError(t, err)
			case <-time.After(deadlockGuard):
				t.Fatalf("a %s did not release the parked producer", pop.name)
			}
			all := make([]int, 4)
			require.Equal(t, 2, pop.f(r, all))
			assert.Equal(t, []int{1, 42}, all[:2])
		})
	}
}

func TestPushBatchBlocksUntilClose(t *testing.T) {
	r := mustNew[int](t, 4)
	fill(t, r, 2)
	type res struct {
		n   int
		err error
	}
	resc := make(chan res, 1)
	go func() {
		n, err := r.PushBatch([]int{10, 11, 12, 13, 14})
		resc <- res{n, err}
	}()
	waitFor(t, "batch producer to park", func() bool { return r.Stats().FullWaits == 1 })
	r.Close()
	var got res
	select {
	case got = <-resc:
	case <-time.After(deadlockGuard):
		t.Fatal("Close did not release the parked batch producer")
	}
	assert.ErrorIs(t, got.err, ErrClosed)
	assert.Equal(t, 2, got.n)
	dst := make([]int, 8)
	require.Equal(t, 4, r.PopBatch(dst))
	assert.Equal(t, []int{0, 1, 10, 11}, dst[:4])
}

func TestPushBatchLargerThanCapacity(t *testing.T) {
	r := mustNew[int](t, 4)
	const total = 1000
	vs := make([]int, total)
	for i := range vs {
		vs[i] = i
	}
	type res struct {
		n   int
		err error
	}
	resc := make(chan res, 1)
	go func() {
		n, err := r.PushBatch(vs)
		resc <- res{n, err}
	}()
	dst := make([]int, 3)
	want := 0
	deadline := time.After(deadlockGuard)
	for want < total {
		n := r.PopBatch(dst)
		for _, v := range dst[:n] {
			require.Equal(t, want, v)
			want++
		}
		if n == 0 {
			select {
			case <-r.Doorbell():
			case <-deadline:
				t.Fatalf("stuck after %d items", want)
			}
		}
	}
	got := <-resc
	require.NoError(t, got.err)
	assert.Equal(t, total, got.n)
}

// hammer runs producers goroutines, each pushing perProducer items encoded
// as producer<<32 | seq through mixed push methods, while a single consumer
// sleeping on the doorbell checks per-producer FIFO order and a checksum.
func hammer(t *testing.T, capacity, producers, perProducer, popBatch int) {
	hammerFrom(t, mustNew[uint64](t, capacity), producers, perProducer, popBatch)
}

// hammerFrom is hammer on a ring the caller made (startAt moves its positions).
func hammerFrom(t *testing.T, r *Ring[uint64], producers, perProducer, popBatch int) {
	start := r.Stats().Pushes
	var wg sync.WaitGroup
	var wantSum atomic.Uint64
	for p := 0; p < producers; p++ {
		wg.Go(func() {
			var sum uint64
			batch := make([]uint64, 0, 7)
			for i := 0; i < perProducer; {
				v := uint64(p)<<32 | uint64(i)
				switch (p + i) % 4 {
				case 0:
					if err := r.Push(v); err != nil {
						t.Errorf("Push: %v", err)
						return
					}
					sum += v
					i++
				case 1:
					if r.TryPush(v) {
						sum += v
						i++
					} else {
						runtime.Gosched()
					}
				default:
					batch = batch[:0]
					for j := i; j < perProducer && len(batch) < cap(batch); j++ {
						batch = append(batch, uint64(p)<<32|uint64(j))
					}
					n, err := r.PushBatch(batch)
					if err != nil || n != len(batch) {
						t.Errorf("PushBatch = %d, %v", n, err)
						return
					}
					for _, b := range batch {
						sum += b
					}
					i += n
				}
			}
			wantSum.Add(sum)
		})
	}

	next := make([]uint64, producers)
	var gotSum uint64
	total := producers * perProducer
	got := 0
	dst := make([]uint64, popBatch)
	deadline := time.After(deadlockGuard)
	for got < total {
		n := r.PopBatch(dst)
		if n == 0 {
			select {
			case <-r.Doorbell():
			case <-deadline:
				t.Fatalf("consumer stuck after %d/%d items (len=%d, stats=%+v)", got, total, r.Len(), r.Stats())
			}
			continue
		}
		for _, v := range dst[:n] {
			p, seq := v>>32, v&(1<<32-1)
			require.Less(t, p, uint64(producers))
			require.Equal(t, next[p], seq, "producer %d out of order", p)
			next[p]++
			gotSum += v
		}
		got += n
	}
	wg.Wait()
	assert.Zero(t, r.PopBatch(dst), "extra items")
	assert.Equal(t, wantSum.Load(), gotSum, "checksum")
	assert.Equal(t, uint64(total), r.Stats().Pushes-start)
	for p := range next {
		assert.Equal(t, uint64(perProducer), next[p])
	}
	t.Logf("stats: %+v", r.Stats())
	r.Close()
}

// startAt puts an empty, unused ring at position base instead of 0, as if base items
// had passed through it: the cell of position p keeps seq uint32(p), so a test can take
// a ring across the positions where the cells' 32-bit sequence numbers wrap without
// pushing 2^32 items first.
func startAt[T any](r *Ring[T], base uint64) {
	c := uint64(len(r.slots))
	for k := range r.slots {
		// the first position at or after base whose cell is k
		p := base + (uint64(k)-base%c+c)%c
		r.slots[k].seq.Store(uint32(p))
	}
	r.tail.Store(base)
	r.head.Store(base)
}

// TestSequenceWrap runs the ring across the positions where the cells' 32-bit sequence
// numbers wrap (2^32, and 2^33 with the reservation counter's bit 32 set): FIFO order,
// Len, full and empty rings, and concurrent producers must not notice.
func TestSequenceWrap(t *testing.T) {
	for _, base := range []uint64{1<<32 - 37, 1<<33 - 5} {
		for _, capacity := range []int{2, 64} {
			t.Run(fmt.Sprintf("base=%d/cap=%d", base, capacity), func(t *testing.T) {
				r := mustNew[uint64](t, capacity)
				startAt(r, base)
				dst := make([]uint64, capacity)
				next, want := uint64(0), uint64(0)
				pop := func(dst []uint64) int { // pops into dst and checks FIFO order
					m := r.PopBatch(dst)
					for _, v := range dst[:m] {
						require.Equal(t, want, v)
						want++
					}
					return m
				}
				for round := 0; round < 200; round++ {
					for r.TryPush(next) {
						next++
					}
					require.Equal(t, capacity, r.Len(), "full ring")
					pop(dst[:1+round%capacity])
					if round%2 == 0 {
						for pop(dst) > 0 {
						}
						require.Zero(t, r.Len(), "empty ring")
					}
				}
				require.Equal(t, base+next, r.Stats().Pushes)
				r2 := mustNew[uint64](t, capacity)
				startAt(r2, base)
				hammerFrom(t, r2, 8, 2000, 5)
			})
		}
	}
}

func TestHammer(t *testing.T) {
	// 24 configurations; under the race detector (make test) 5,000 items each still
	// interleave every producer with the consumer thousands of times.
	per := testsize.Pick(20000, 5000)
	if testing.Short() {
		per = 2000
	}
	for _, capacity := range []int{2, 64} {
		for _, producers := range []int{1, 4, 16, 64} {
			for _, popBatch := range []int{1, 5, 128} {
				name := fmt.Sprintf("cap=%d/producers=%d/pop=%d", capacity, producers, popBatch)
				t.Run(name, func(t *testing.T) {
					hammer(t, capacity, producers, per/producers, popBatch)
				})
			}
		}
	}
}

// TestDoorbellNoLostWakeup has a consumer that always sleeps on the doorbell
// when empty, and producers that push one item at a time with pauses
// (runtime.Gosched) so the consumer is frequently asleep. Every item must
// arrive; a lost wake-up shows as the deadlock guard firing.
func TestDoorbellNoLostWakeup(t *testing.T) {
	const producers, per = 4, 5000
	r := mustNew[int](t, 8)
	var wg sync.WaitGroup
	for p := 0; p < producers; p++ {
		wg.Go(func() {
			for i := 0; i < per; i++ {
				if err := r.Push(i); err != nil {
					t.Errorf("Push: %v", err)
					return
				}
				if i%3 == 0 {
					runtime.Gosched()
				}
			}
		})
	}
	got, sleeps := 0, 0
	dst := make([]int, 4)
	deadline := time.After(deadlockGuard)
	for got < producers*per {
		n := r.PopBatch(dst)
		got += n
		if n == 0 {
			sleeps++
			select {
			case <-r.Doorbell():
			case <-deadline:
				t.Fatalf("lost wake-up: consumer asleep with %d/%d items received, len=%d", got, producers*per, r.Len())
			}
		}
	}
	wg.Wait()
	t.Logf("consumer slept %d times", sleeps)
	r.Close()
}

// TestDoorbellSingleItems: one item at a time, the consumer acknowledges each
// on a channel, so every push happens while the consumer is (about to be)
// asleep on the doorbell.
func TestDoorbellSingleItems(t *testing.T) {
	r := mustNew[int](t, 2)
	ack := make(chan struct{})
	done := make(chan struct{})
	const total = 5000
	go func() {
		defer close(done)
		dst := make([]int, 2)
		deadline := time.After(deadlockGuard)
		for want := 0; want < total; {
			n := r.PopBatch(dst)
			if n == 0 {
				select {
				case <-r.Doorbell():
				case <-deadline:
					t.Errorf("lost wake-up at item %d", want)
					return
				}
				continue
			}
			for _, v := range dst[:n] {
				if v != want {
					t.Errorf("got %d want %d", v, want)
				}
				want++
				ack <- struct{}{}
			}
		}
	}()
	for i := 0; i < total; i++ {
		require.NoError(t, r.Push(i))
		select {
		case <-ack:
		case <-done:
			t.FailNow()
		}
	}
	<-done
	r.Close()
}

// TestCloseWhilePushing: producers push until they see ErrClosed; the
// consumer drains until Closed() && PopBatch == 0. Every successful push must
// have been popped exactly once, none of the rejected ones.
func TestCloseWhilePushing(t *testing.T) {
	for iter := 0; iter < 20; iter++ {
		r := mustNew[uint64](t, 4)
		const producers = 6
		var wg sync.WaitGroup
		var okSum, okCount atomic.Uint64
		start := make(chan struct{})
		for p := 0; p < producers; p++ {
			wg.Go(func() {
				<-start
				for i := uint64(0); ; i++ {
					v := uint64(p)<<32 | i
					var err error
					if i%2 == 0 {
						err = r.Push(v)
					} else {
						var n int
						n, err = r.PushBatch([]uint64{v})
						if n == 1 && err != nil {
							t.Errorf("PushBatch enqueued and failed")
						}
					}
					if errors.Is(err, ErrClosed) {
						return
					}
					if err != nil {
						t.Errorf("Push: %v", err)
						return
					}
					okSum.Add(v)
					okCount.Add(1)
				}
			})
		}
		close(start)
		var gotSum, gotCount uint64
		dst := make([]uint64, 3)
		deadline := time.After(deadlockGuard)
		closer := make(chan struct{})
		go func() {
			// Close from another goroutine, mid-stream.
			defer close(closer)
			defer r.Close()
			limit := time.Now().Add(deadlockGuard)
			for r.Stats().Pushes < 2000 {
				if time.Now().After(limit) {
					t.Error("producers made no progress")
					return
				}
				runtime.Gosched()
			}
		}()
		for {
			closed := r.Closed() // documented consumer loop: read before PopBatch
			n := r.PopBatch(dst)
			for _, v := range dst[:n] {
				gotSum += v
			}
			gotCount += uint64(n)
			if n > 0 {
				continue
			}
			if closed {
				break // drained for good
			}
			select {
			case <-r.Doorbell():
			case <-deadline:
				t.Fatal("consumer stuck")
			}
		}
		wg.Wait()
		<-closer
		require.Equal(t, okCount.Load(), gotCount, "iteration %d", iter)
		require.Equal(t, okSum.Load(), gotSum, "iteration %d", iter)
		require.Equal(t, gotCount, r.Stats().Pushes)
	}
}

func TestAllocsSteadyState(t *testing.T) {
	r := mustNew[int](t, 64)
	dst := make([]int, 8)
	allocs := testing.AllocsPerRun(1000, func() {
		for i := 0; i < 8; i++ {
			if !r.TryPush(i) {
				t.Fatal("full")
			}
		}
		if r.PopBatch(dst) != 8 {
			t.Fatal("short pop")
		}
		// Empty pop arms the doorbell so the next push takes the ring path.
		if r.PopBatch(dst) != 0 {
			t.Fatal("not empty")
		}
		<-r.Doorbell()
		if err := r.Push(1); err != nil {
			t.Fatal(err)
		}
		if n, err := r.PushBatch(dst[:3]); n != 3 || err != nil {
			t.Fatal(n, err)
		}
		if r.PopBatch(dst) != 4 {
			t.Fatal("short pop")
		}
	})
	assert.Zero(t, allocs)
}

func TestLen(t *testing.T) {
	r := mustNew[string](t, 8)
	for i := 0; i < 8; i++ {
		assert.Equal(t, i, r.Len())
		require.True(t, r.TryPush("x"))
	}
	assert.Equal(t, 8, r.Len())
	assert.Equal(t, 8, r.Cap())
	r.Close()
	assert.Equal(t, 8, r.Len())
	assert.Equal(t, 8, r.PopBatch(make([]string, 10)))
	assert.Equal(t, 0, r.Len())
}

func TestPopBatchEmptyDst(t *testing.T) {
	r := mustNew[int](t, 2)
	require.True(t, r.TryPush(1))
	assert.Zero(t, r.PopBatch(nil))
	assert.Equal(t, 1, r.Len())
}

// TestPopBatchWaitsForInFlightAfterClose drives the window between a
// producer's reservation and its publication by hand.
func TestPopBatchWaitsForInFlightAfterClose(t *testing.T) {
	r := mustNew[int](t, 4)
	require.True(t, r.TryPush(1))
	pos, n, closed := r.reserve(1) // a producer stalled before publishing
	require.Equal(t, 1, n)
	require.False(t, closed)

	dst := make([]int, 4)
	require.Equal(t, 1, r.PopBatch(dst))
	assert.Zero(t, r.PopBatch(dst), "not closed: an unpublished slot is not waited for")
	assert.Equal(t, 1, r.Len())

	r.Close()
	assert.False(t, r.TryPush(3))
	popped := make(chan int, 1)
	go func() { popped <- r.PopBatch(dst) }()
	// PopBatch must not return before the stalled producer publishes.
	for range 100 {
		runtime.Gosched()
		select {
		case k := <-popped:
			t.Fatalf("PopBatch returned %d before the in-flight item was published", k)
		default:
		}
	}
	r.publish1(pos, 2)
	select {
	case k := <-popped:
		require.Equal(t, 1, k)
		assert.Equal(t, 2, dst[0])
	case <-time.After(deadlockGuard):
		t.Fatal("PopBatch did not see the published item")
	}
	assert.Zero(t, r.PopBatch(dst))
}

// TestTryPopBatchLeavesSleepFlag: a consumer polling an empty ring with
// TryPopBatch does not announce that it may sleep, so the pushes that follow
// its polls ring no doorbell; the PopBatch before it parks does announce, and
// the next push rings. TryPopBatch pops in order like PopBatch.
func TestTryPopBatchLeavesSleepFlag(t *testing.T) {
	r := mustNew[int](t, 8)
	dst := make([]int, 8)
	require.Zero(t, r.PopBatch(dst)) // announces: New starts the consumer asleep anyway
	require.True(t, r.TryPush(1))
	<-r.Doorbell() // the first push after an announcement rings
	for i := 0; i < 3; i++ {
		require.Equal(t, 1, r.TryPopBatch(dst))
		assert.Equal(t, i+1, dst[0])
		require.Zero(t, r.TryPopBatch(dst))
		require.True(t, r.TryPush(i+2))
		select {
		case <-r.Doorbell():
			t.Fatalf("poll %d: a push after an empty TryPopBatch rang the doorbell", i)
		default:
		}
	}
	require.Equal(t, 1, r.TryPopBatch(dst))
	require.Zero(t, r.PopBatch(dst))
	require.True(t, r.TryPush(9))
	select {
	case <-r.Doorbell():
	default:
		t.Fatal("a push after an empty PopBatch did not ring the doorbell")
	}
	require.Equal(t, 1, r.TryPopBatch(dst))
	assert.Equal(t, 9, dst[0])
}
