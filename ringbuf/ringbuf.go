package ringbuf

import (
	"errors"
	"fmt"
	"runtime"
	"sync/atomic"
	"time"
)

// ErrClosed is returned by Push and PushBatch when the ring is closed before
// the item could be enqueued.
var ErrClosed = errors.New("ringbuf: closed")

// ErrCapacity is returned (wrapped) by New for a capacity that is not a power
// of two in [2, MaxCapacity].
var ErrCapacity = errors.New("ringbuf: capacity must be a power of two >= 2")

// MaxCapacity is the largest capacity New accepts. It only exists so that an
// absurd request fails with ErrCapacity instead of panicking in make.
const MaxCapacity = 1 << 30

const (
	// cacheLineSize is the padding unit keeping the producer-written,
	// consumer-written and read-only parts of a Ring on separate cache lines.
	cacheLineSize = 64

	// closedBit is set in Ring.tail by Close. Keeping it in the same word as
	// the reservation counter makes "closed" and "reserved a slot" mutually
	// exclusive: a producer's reserving CAS fails once the bit is set.
	closedBit = uint64(1) << 63

	// pushSpins bounds how many times a producer that found the ring full
	// yields and re-checks before it parks.
	pushSpins = 4

	// maxReserve bounds how many slots PushBatch reserves with one CAS,
	// which bounds the cells scanned per reservation attempt.
	maxReserve = 64

	ptrSize = 4 << (^uintptr(0) >> 63)
	// readOnlySize is the size of Ring's read-only fields: a slice header,
	// mask and three channels.
	readOnlySize = 3*ptrSize + 8 + 3*ptrSize
)

// slot is one cell of the ring. seq encodes the cell's state relative to a
// position p that maps to it (p&mask == index), modulo 2^32:
//
//	seq == p     free: the cell may be filled with the item for position p
//	seq == p+1   full: the item for position p is published
//	seq == p+cap consumed: free for position p+cap (next lap)
//
// The low 32 bits of the position are enough: every seq a producer or the
// consumer compares lies within a capacity (at most MaxCapacity, 2^30) of
// the position it compares it with, so the difference, read as a signed
// 32-bit number, has the sign the full difference has. A 4-byte seq makes a
// cell of a 12-byte item 16 bytes, four to a cache line.
type slot[T any] struct {
	seq atomic.Uint32
	val T
}

// Ring is a bounded lock-free multi-producer single-consumer FIFO queue.
// See the package documentation for the rules on who may call what.
// A Ring must be created with New and must not be copied.
type Ring[T any] struct {
	// Read-only after New.
	slots []slot[T]
	mask  uint64
	bell  chan struct{} // doorbell, capacity 1
	wake  chan struct{} // tokens for parked producers, capacity = capacity
	done  chan struct{} // closed by Close
	_     [cacheLineSize - readOnlySize]byte

	// tail is the next position to reserve (low 63 bits) plus closedBit.
	// Written (CAS) by producers, Or'ed by Close.
	tail atomic.Uint64
	_    [cacheLineSize - 8]byte
	// head is the next position to pop. Written only by the consumer; read
	// by Len and by the consumer's drain-after-close check.
	head atomic.Uint64
	_    [cacheLineSize - 8]byte
	// sleeping is 1 while the consumer may be (about to be) blocked on the
	// doorbell. Written by the consumer on empty/non-empty transitions and
	// CAS'ed 1->0 by the producer that rings the bell; read by every push.
	sleeping atomic.Uint32
	_        [cacheLineSize - 4]byte
	// Slow-path (parking) state, only touched when the ring is full.
	waiters   atomic.Int64
	fullWaits atomic.Uint64
	waitNanos atomic.Uint64
	_         [cacheLineSize - 24]byte
}

// Stats are cumulative counters of a Ring.
type Stats struct {
	// Pushes is the number of items enqueued (by TryPush, Push and
	// PushBatch) since New.
	Pushes uint64
	// FullWaits is the number of times a producer found the ring full
	// (after its bounded spin) and parked.
	FullWaits uint64
	// WaitNanos is the total time producers spent parked.
	WaitNanos uint64
}

// New returns an empty ring holding up to capacity items. capacity must be a
// power of two >= 2 (and <= MaxCapacity); otherwise New returns an error
// wrapping ErrCapacity.
func New[T any](capacity int) (*Ring[T], error) {
	if capacity < 2 || capacity > MaxCapacity || capacity&(capacity-1) != 0 {
		return nil, fmt.Errorf("ringbuf: invalid capacity %d: %w", capacity, ErrCapacity)
	}
	r := &Ring[T]{
		slots: make([]slot[T], capacity),
		mask:  uint64(capacity - 1),
		bell:  make(chan struct{}, 1),
		wake:  make(chan struct{}, capacity),
		done:  make(chan struct{}),
	}
	for i := range r.slots {
		r.slots[i].seq.Store(uint32(i))
	}
	// A consumer that selects on Doorbell before its first PopBatch must
	// still be woken by the first push.
	r.sleeping.Store(1)
	return r, nil
}

// Cap returns the capacity of the ring.
func (r *Ring[T]) Cap() int { return len(r.slots) }

// Len returns the approximate number of items in the ring (including items
// whose slot is reserved but not yet published). Under concurrency the value
// is stale as soon as it is returned; it is always within [0, Cap()].
func (r *Ring[T]) Len() int {
	h := r.head.Load() // load head first: tail only grows, so tail >= h.
	t := r.tail.Load() &^ closedBit
	n := int64(t - h)
	if n < 0 {
		return 0
	}
	if n > int64(len(r.slots)) {
		return len(r.slots)
	}
	return int(n)
}

// Closed reports whether Close has been called.
func (r *Ring[T]) Closed() bool { return r.tail.Load()&closedBit != 0 }

// Stats returns a snapshot of the ring's counters.
func (r *Ring[T]) Stats() Stats {
	return Stats{
		Pushes:    r.tail.Load() &^ closedBit,
		FullWaits: r.fullWaits.Load(),
		WaitNanos: r.waitNanos.Load(),
	}
}

// Close closes the ring. It is idempotent and may be called from any
// goroutine. After Close starts, no further item can be enqueued: TryPush
// returns false and Push/PushBatch return ErrClosed, including producers
// parked on a full ring, which are woken. Close also rings the doorbell.
// Items enqueued before Close stay poppable; a PopBatch that starts after
// Closed reported true and returns 0 means every successfully pushed item
// was popped (see the package documentation for the consumer loop).
func (r *Ring[T]) Close() {
	if r.tail.Or(closedBit)&closedBit != 0 {
		return // already closed by someone else
	}
	close(r.done)
	select {
	case r.bell <- struct{}{}:
	default:
	}
}

// Doorbell returns the channel the consumer may block on after PopBatch
// returned 0. Any push that completes after that PopBatch, and Close, make a
// receive possible. Spurious wake-ups are possible; the consumer must simply
// call PopBatch again. Only the consumer may receive from it.
func (r *Ring[T]) Doorbell() <-chan struct{} { return r.bell }

// reserve tries to reserve up to want (>= 1) consecutive positions. It
// returns the first reserved position and how many were reserved; n == 0
// with closed == false means the ring is full.
func (r *Ring[T]) reserve(want int) (pos uint64, n int, closed bool) {
	t := r.tail.Load()
	for {
		if t&closedBit != 0 {
			return 0, 0, true
		}
		// Count free cells from t. The consumer frees cells in position
		// order, so stopping at the first non-free cell loses nothing;
		// n can never exceed the capacity because the cell for
		// position t+cap is the cell for t, whose seq is not t+cap.
		for n = 0; n < want; n++ {
			p := t + uint64(n)
			if r.slots[p&r.mask].seq.Load() != uint32(p) {
				break
			}
		}
		if n == 0 {
			seq := r.slots[t&r.mask].seq.Load()
			if int32(seq-uint32(t)) < 0 {
				// The cell still holds the item of position t-cap:
				// at least cap items are in the ring.
				return 0, 0, false
			}
			// seq > t: another producer already took position t and
			// our tail snapshot is stale.
			t = r.tail.Load()
			continue
		}
		if r.tail.CompareAndSwap(t, t+uint64(n)) {
			return t, n, false
		}
		t = r.tail.Load()
	}
}

// publish1 makes the single reserved position pos visible to the consumer.
func (r *Ring[T]) publish1(pos uint64, v T) {
	c := &r.slots[pos&r.mask]
	c.val = v
	c.seq.Store(uint32(pos + 1)) // release: publishes c.val
	r.ringBell()
}

// ringBell wakes the consumer if it may be sleeping. In the common case (the
// consumer is busy) it costs one atomic load of a read-mostly word.
func (r *Ring[T]) ringBell() {
	if r.sleeping.Load() != 0 && r.sleeping.CompareAndSwap(1, 0) {
		select {
		case r.bell <- struct{}{}:
		default: // a token is already pending
		}
	}
}

// TryPush enqueues v if the ring is neither full nor closed, and reports
// whether it did. It never blocks. Safe for concurrent use by any number of
// producers.
func (r *Ring[T]) TryPush(v T) bool {
	pos, n, _ := r.reserve(1)
	if n == 0 {
		return false
	}
	r.publish1(pos, v)
	return true
}

// Push enqueues v, parking the calling goroutine while the ring is full. It
// returns ErrClosed, without enqueuing v, if the ring is or becomes closed
// before v is enqueued. Safe for concurrent use by any number of producers.
func (r *Ring[T]) Push(v T) error {
	for {
		pos, n, closed := r.reserve(1)
		if closed {
			return ErrClosed
		}
		if n == 1 {
			r.publish1(pos, v)
			return nil
		}
		r.waitSpace()
	}
}

// PushBatch enqueues the elements of vs in order, parking while the ring is
// full, and returns how many were enqueued. Runs of elements are reserved
// with a single CAS when space allows, but items of other producers may be
// interleaved between elements of vs. On ErrClosed, vs[:n] were enqueued and
// vs[n:] were not. Safe for concurrent use by any number of producers.
func (r *Ring[T]) PushBatch(vs []T) (int, error) {
	done := 0
	for done < len(vs) {
		pos, n, closed := r.reserve(min(len(vs)-done, maxReserve))
		if closed {
			return done, ErrClosed
		}
		if n == 0 {
			r.waitSpace()
			continue
		}
		for i, v := range vs[done : done+n] {
			p := pos + uint64(i)
			c := &r.slots[p&r.mask]
			c.val = v
			c.seq.Store(uint32(p + 1)) // release: publishes c.val
		}
		done += n
		r.ringBell()
	}
	return done, nil
}

// spaceOrClosed reports whether a reservation attempt may succeed or would
// observe the ring closed.
func (r *Ring[T]) spaceOrClosed() bool {
	t := r.tail.Load()
	if t&closedBit != 0 {
		return true
	}
	return int32(r.slots[t&r.mask].seq.Load()-uint32(t)) >= 0
}

// waitSpace returns once the ring may have space or is closed: after a short
// bounded spin it parks until the consumer frees a slot or Close is called.
// Spurious returns are allowed; callers re-try their reservation.
func (r *Ring[T]) waitSpace() {
	for range pushSpins {
		if r.spaceOrClosed() {
			return
		}
		runtime.Gosched()
	}
	// Announce ourselves before the final re-check. Paired with the
	// consumer's "free cell, then load waiters" this is a Dekker handshake:
	// either our re-check sees the freed cell, or the consumer sees
	// waiters > 0 and hands out a token.
	r.waiters.Add(1)
	if r.spaceOrClosed() {
		r.waiters.Add(-1)
		return
	}
	r.fullWaits.Add(1)
	start := time.Now()
	select {
	case <-r.wake:
	case <-r.done:
	}
	r.waitNanos.Add(uint64(time.Since(start)))
	r.waiters.Add(-1)
}

// pop moves up to len(dst) published items into dst, in position order.
func (r *Ring[T]) pop(dst []T) int {
	h := r.head.Load()
	n := 0
	var zero T
	for n < len(dst) {
		p := h + uint64(n)
		c := &r.slots[p&r.mask]
		if c.seq.Load() != uint32(p+1) { // acquire: pairs with the producer's publish
			break
		}
		dst[n] = c.val
		c.val = zero                                  // do not retain garbage
		c.seq.Store(uint32(p + uint64(len(r.slots)))) // release: hands the cell to the next lap
		n++
	}
	if n > 0 {
		r.head.Store(h + uint64(n))
	}
	return n
}

// PopBatch moves up to len(dst) items into dst, oldest first, and returns how
// many it moved. It never blocks on producers, except that once the ring is
// closed it waits for the (few-instruction) publication of items whose slot
// was reserved before Close, so that a 0 from a PopBatch that started after
// Closed returned true means "drained for good". Vacated slots are zeroed. Only the single consumer goroutine may
// call PopBatch. After it returns 0 (with len(dst) > 0) the consumer may
// block on Doorbell.
func (r *Ring[T]) PopBatch(dst []T) int {
	if len(dst) == 0 {
		return 0
	}
	n := r.pop(dst)
	if n == 0 {
		// Announce that we may sleep, then re-check: a producer that
		// publishes after our re-check is guaranteed to see sleeping == 1
		// (sequentially consistent atomics) and rings the bell.
		r.sleeping.Store(1)
		n = r.pop(dst)
		for n == 0 {
			t := r.tail.Load()
			if t&closedBit == 0 || t&^closedBit == r.head.Load() {
				return 0
			}
			// Closed, but a producer reserved a slot before Close and
			// has not stored into it yet. It will do so without
			// blocking; wait for it so no successful push is lost.
			runtime.Gosched()
			n = r.pop(dst)
		}
	}
	r.popped(n)
	return n
}

// TryPopBatch is PopBatch for a consumer that is not about to block: it moves
// up to len(dst) items into dst and returns how many, but an empty ring leaves
// the consumer's sleep flag alone. PopBatch announces on every empty call that
// the consumer may block on Doorbell, so a consumer that polls an empty ring in
// a loop before it parks would have the next push after each poll pay a CAS
// and a doorbell send, and the doorbell would then hold a stale token that
// wakes the consumer's next real sleep for nothing. Such a consumer polls with
// TryPopBatch and calls PopBatch once, right before it blocks. Only the
// consumer may call it; after Close it may return 0 while items reserved
// before Close are still being published (PopBatch waits for them).
func (r *Ring[T]) TryPopBatch(dst []T) int {
	n := r.pop(dst)
	if n > 0 {
		r.popped(n)
	}
	return n
}

// popped does the consumer's part after n > 0 items left the ring: it clears
// a sleep announcement (the consumer is busy again) and hands wake-up tokens
// to producers parked on a full ring.
func (r *Ring[T]) popped(n int) {
	if r.sleeping.Load() != 0 {
		r.sleeping.Store(0)
	}
	// Dekker pair of waitSpace: cells were freed (seq stores in pop)
	// before this load.
	if w := r.waiters.Load(); w > 0 {
	wake:
		for k := min(int64(n), w); k > 0; k-- {
			select {
			case r.wake <- struct{}{}:
			default:
				// Buffer full: that many tokens are pending and
				// nobody is blocked receiving; the next parkers
				// will consume them and re-check.
				break wake
			}
		}
	}
}
