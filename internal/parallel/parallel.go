package parallel

import "sync"

// Each calls do(i) for every i in [0, n), on min(workers, n) goroutines at once (at
// least one), handing the indices out in increasing order, and returns when every
// call has returned. done, when not nil, is called after each do(i) with the same i,
// one call at a time (a progress line needs no lock of its own), from the goroutine
// that ran do(i).
func Each(n, workers int, do func(i int), done func(i int)) {
	if n <= 0 {
		return
	}
	work := make(chan int)
	var mu sync.Mutex // serialises done
	var wg sync.WaitGroup
	for range min(max(workers, 1), n) {
		wg.Go(func() {
			for i := range work {
				do(i)
				if done != nil {
					mu.Lock()
					done(i)
					mu.Unlock()
				}
			}
		})
	}
	for i := range n {
		work <- i
	}
	close(work)
	wg.Wait()
}

// Beside runs a on a goroutine of its own and b on the caller's, and returns when both
// have returned.
func Beside(a, b func()) {
	var wg sync.WaitGroup
	wg.Go(a)
	b()
	wg.Wait()
}

// Serialize returns f behind a lock of its own: the calls of the function it returns run
// one at a time, whichever goroutines make them (a progress bar that the simulations
// running on Each's workers all advance).
func Serialize[T any](f func(T)) func(T) {
	var mu sync.Mutex
	return func(v T) {
		mu.Lock()
		defer mu.Unlock()
		f(v)
	}
}
