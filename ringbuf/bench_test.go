package ringbuf

import (
	"fmt"
	"sync"
	"testing"
)

const benchCap = 1024

// queue abstracts the two implementations compared by the benchmarks.
type queue interface {
	push(v uint64)
	// popBatch blocks until at least one item is available and moves up
	// to len(dst) items into dst.
	popBatch(dst []uint64) int
}

type ringQueue struct{ r *Ring[uint64] }

func (q ringQueue) push(v uint64) {
	if err := q.r.Push(v); err != nil {
		panic(err)
	}
}

func (q ringQueue) popBatch(dst []uint64) int {
	for {
		if n := q.r.PopBatch(dst); n > 0 {
			return n
		}
		<-q.r.Doorbell()
	}
}

type chanQueue struct{ c chan uint64 }

func (q chanQueue) push(v uint64) { q.c <- v }

// popBatch receives one item blocking, then drains without blocking: the
// closest a channel gets to a batch pop.
func (q chanQueue) popBatch(dst []uint64) int {
	dst[0] = <-q.c
	n := 1
	for n < len(dst) {
		select {
		case dst[n] = <-q.c:
			n++
		default:
			return n
		}
	}
	return n
}

func newQueue(b *testing.B, impl string) queue {
	switch impl {
	case "ring":
		return ringQueue{mustNew[uint64](b, benchCap)}
	case "chan":
		return chanQueue{make(chan uint64, benchCap)}
	}
	b.Fatalf("unknown impl %q", impl)
	return nil
}

// runPushPop moves b.N items from producers goroutines to one consumer that
// pops up to batch items at a time. ns/op is per item.
func runPushPop(b *testing.B, impl string, producers, batch int) {
	q := newQueue(b, impl)
	b.ReportAllocs()
	b.ResetTimer()
	var wg sync.WaitGroup
	for p := 0; p < producers; p++ {
		n := b.N / producers
		if p == 0 {
			n += b.N % producers
		}
		wg.Go(func() {
			for i := 0; i < n; i++ {
				q.push(uint64(i))
			}
		})
	}
	dst := make([]uint64, batch)
	for got := 0; got < b.N; {
		got += q.popBatch(dst)
	}
	wg.Wait()
	b.StopTimer()
	if rq, ok := q.(ringQueue); ok {
		s := rq.r.Stats()
		b.ReportMetric(float64(s.FullWaits)/float64(b.N), "parks/op")
	}
}

// BenchmarkPushPop: item-at-a-time consumer (ring: PopBatch with a 1-slot
// dst; chan: plain receive).
func BenchmarkPushPop(b *testing.B) {
	for _, producers := range []int{1, 4} {
		for _, impl := range []string{"ring", "chan"} {
			b.Run(fmt.Sprintf("producers=%d/impl=%s", producers, impl), func(b *testing.B) {
				runPushPop(b, impl, producers, 1)
			})
		}
	}
}

// BenchmarkBatchPop: consumer pops up to 64 items at a time (ring: one
// PopBatch; chan: one blocking receive plus non-blocking drains).
func BenchmarkBatchPop(b *testing.B) {
	for _, producers := range []int{1, 4} {
		for _, impl := range []string{"ring", "chan"} {
			b.Run(fmt.Sprintf("producers=%d/impl=%s", producers, impl), func(b *testing.B) {
				runPushPop(b, impl, producers, 64)
			})
		}
	}
}

// BenchmarkPushBatch: producers push runs of 16 with PushBatch, consumer
// pops up to 64; compared against a channel fed item by item.
func BenchmarkPushBatch(b *testing.B) {
	for _, producers := range []int{1, 4} {
		b.Run(fmt.Sprintf("producers=%d/impl=ring", producers), func(b *testing.B) {
			r := mustNew[uint64](b, benchCap)
			b.ReportAllocs()
			b.ResetTimer()
			var wg sync.WaitGroup
			for p := 0; p < producers; p++ {
				n := b.N / producers
				if p == 0 {
					n += b.N % producers
				}
				wg.Go(func() {
					var buf [16]uint64
					for n > 0 {
						k := min(n, len(buf))
						if _, err := r.PushBatch(buf[:k]); err != nil {
							panic(err)
						}
						n -= k
					}
				})
			}
			q := ringQueue{r}
			dst := make([]uint64, 64)
			for got := 0; got < b.N; {
				got += q.popBatch(dst)
			}
			wg.Wait()
		})
		b.Run(fmt.Sprintf("producers=%d/impl=chan", producers), func(b *testing.B) {
			runPushPop(b, "chan", producers, 64)
		})
	}
}

// BenchmarkUncontended: TryPush + PopBatch on one goroutine, the pure
// per-operation cost without cross-core traffic.
func BenchmarkUncontended(b *testing.B) {
	b.Run("impl=ring", func(b *testing.B) {
		r := mustNew[uint64](b, benchCap)
		dst := make([]uint64, 1)
		b.ReportAllocs()
		for i := 0; i < b.N; i++ {
			r.TryPush(uint64(i))
			r.PopBatch(dst)
		}
	})
	b.Run("impl=chan", func(b *testing.B) {
		c := make(chan uint64, benchCap)
		b.ReportAllocs()
		for i := 0; i < b.N; i++ {
			c <- uint64(i)
			<-c
		}
	})
}
