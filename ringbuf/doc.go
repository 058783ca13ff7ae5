// Package ringbuf provides Ring, a bounded, lock-free, multi-producer
// single-consumer (MPSC) FIFO queue, used by the sharded index engine to hand
// index deltas from caller goroutines to the goroutine that owns a shard.
//
// # What it owns
//
// A Ring owns a fixed array of cells (capacity a power of two), the items
// stored in them between push and pop, and three channels: the doorbell
// (consumer wake-up, capacity 1), the producer wake-up tokens and the
// close signal. Items are moved in and out by value; a popped cell is zeroed
// so the ring never keeps a popped item's pointers alive.
//
// # Who may call what
//
//   - TryPush, Push, PushBatch: any number of goroutines concurrently
//     (producers). TryPush never blocks; Push and PushBatch park while the ring
//     is full (after a bounded spin of a few runtime.Gosched re-checks).
//   - PopBatch, TryPopBatch and receiving from Doorbell: exactly one goroutine
//     at a time (the consumer). Two concurrent pops corrupt the ring; this is
//     not detected.
//   - Close, Closed, Len, Cap, Stats: any goroutine.
//
// The consumer's sleep protocol is:
//
//	for {
//		closed := r.Closed() // before PopBatch, see below
//		n := r.PopBatch(buf)
//		if n > 0 {
//			handle(buf[:n])
//			continue
//		}
//		if closed {
//			return // drained for good
//		}
//		select {
//		case <-r.Doorbell():
//		case <-other:
//		}
//	}
//
// Any push that completes after the PopBatch that returned 0 makes a receive
// from Doorbell possible; so does Close. Wake-ups may be spurious. A consumer
// that polls for a while before it parks polls with TryPopBatch, which leaves
// the sleep flag alone (an empty PopBatch sets it, and every push after it
// then pays a CAS and a doorbell send, and leaves a stale token), and calls
// PopBatch once, right before the select.
//
// Closed must be read before the final PopBatch: a PopBatch that returns 0
// is only final if it started after Closed() returned true. Checking Closed()
// after an empty PopBatch races with a Close (and the pushes that completed
// just before it) that happened in between, and would drop those items.
//
// # Ordering and exactness
//
// Every successful push enqueues its item exactly once; every failed push
// (false, or ErrClosed) enqueues nothing (PushBatch reports the enqueued
// prefix). Items leave in reservation order, so the items of one producer
// goroutine leave in the order its pushes completed; items of different
// producers interleave arbitrarily, also between the elements of one
// PushBatch. Close is atomic with respect to reservation (the closed flag is
// a bit of the reservation counter): a push either reserved a cell before
// Close and succeeds, or fails. After Close, PopBatch waits for the handful of
// instructions a producer that reserved before Close needs to publish, so a
// PopBatch that starts after Closed() returned true and returns 0 means
// every successful push has been popped.
//
// # Memory model
//
// The design is Dmitry Vyukov's bounded queue with a per-cell sequence
// number. Positions are 63-bit counters that never wrap in practice; the
// cell for position p is cells[p & (cap-1)], and its sequence number is kept
// modulo 2^32 (every comparison is within a capacity of the position, so the
// low 32 bits decide it), which makes a cell of a 12-byte item 16 bytes. All atomics are Go
// sync/atomic operations, which are sequentially consistent; the
// happens-before edges below are the ones the implementation relies on.
//
//   - cell.seq: the cell's ownership token. A producer that reserved position
//     p writes cell.val and then stores seq = p+1; that store publishes the
//     write of val to the consumer, whose load of seq == p+1 happens before
//     its read of val. The consumer reads and zeroes val and then stores
//     seq = p+cap; that store publishes the emptied cell to the producer that
//     will load seq == p+cap for position p+cap before writing val. Hence
//     val is never accessed concurrently and needs no atomic access.
//   - tail: the next position to reserve, plus the closed bit (bit 63).
//     Producers reserve positions [t, t+n) with CompareAndSwap(t, t+n) after
//     observing seq == position for each of those cells; a successful CAS
//     makes those positions exclusively theirs. Close sets the closed bit
//     with Or, after which every reservation CAS fails. tail publishes no
//     data: the consumer never reads a cell because of tail, only because
//     of its seq. Tail doubles as the Stats().Pushes counter.
//   - head: the next position to pop. Written only by the consumer, so it
//     publishes nothing; it is atomic only so Len can read it.
//   - sleeping: the consumer's "I may block on the doorbell" flag. The
//     consumer stores 1 and then re-checks the next cell's seq; a producer
//     stores seq (publish) and then loads sleeping. Because both pairs are
//     sequentially consistent, at least one side sees the other (the Dekker
//     pattern): either the re-check finds the item, or the producer sees 1,
//     CAS-es it to 0 and performs a non-blocking send on the doorbell. A
//     busy consumer leaves sleeping at 0, so a push costs no channel
//     operation.
//   - waiters: the number of producers that may be parked. A producer adds
//     1, re-checks for space, and only then blocks on the token channel; the
//     consumer frees cells (seq stores) and then loads waiters, and if it is
//     positive sends up to min(freed, waiters) tokens without blocking. The
//     same Dekker argument rules out lost wake-ups. A dropped send means the
//     token buffer is full, i.e. nobody is blocked and the next parkers
//     return immediately and re-check. Close closes a channel every parked
//     producer also waits on.
//
// The tail, head, sleeping and waiters words each live on their own 64-byte
// cache line, away from the read-only fields, so producers' CAS traffic on
// tail does not slow down the consumer's head updates (layout asserted by
// TestLayout). Cells are not padded: adjacent cells can share a line.
//
// # Why MPSC and not SPSC per producer
//
// The producers are arbitrary caller goroutines of the engine's public API:
// their number is unknown and unbounded, they come and go, and a goroutine
// has no identity to hang a private queue on. SPSC-per-producer would need a
// registry of queues (allocation and synchronisation on the producer's first
// use, leaks when goroutines exit) and a consumer that scans all of them,
// losing the global arrival order. One MPSC ring per shard keeps a single
// bounded buffer with back-pressure, one place to sleep on, and FIFO order.
//
// # Performance
//
// All operations are allocation-free (asserted by TestAllocsSteadyState).
// Measured with
//
//	go test -run xxx -bench . -benchtime 200000x -count 3 ./ringbuf/
//
// on a shared 2-vCPU VM (Intel Xeon, linux/amd64, go1.26, other builds
// running concurrently, so expect ±30% noise; median of 3 shown). ns/op is
// per item moved from producer(s) to the consumer through a 1024-slot queue,
// consumer sleeping on Doorbell (ring) or blocked in receive (chan) when
// empty. All rows report 0 B/op and 0 allocs/op.
//
//	benchmark                          ring      chan
//	PushPop   producers=1 (pop 1)     97 ns     76 ns
//	PushPop   producers=4 (pop 1)    110 ns     80 ns
//	BatchPop  producers=1 (pop ≤64)   57 ns     97 ns
//	BatchPop  producers=4 (pop ≤64)   36 ns     62 ns
//	PushBatch producers=1 (16/64)     26 ns     95 ns  (chan: item by item)
//	PushBatch producers=4 (16/64)     32 ns    104 ns  (chan: item by item)
//	Uncontended TryPush+PopBatch      39 ns     54 ns  (one goroutine)
//
// The ring wins when the consumer pops in batches, which is how the shard
// loop uses it (one PopBatch replaces up to 64 channel receives) and when
// producers push in batches. Item-at-a-time consumption with a consumer that
// is faster than its producers (so it sleeps after almost every item) is
// dominated by the goroutine park/unpark and is no better than a channel.
package ringbuf
