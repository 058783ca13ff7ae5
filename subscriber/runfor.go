package subscriber

import (
	"context"
	"sync"
	"time"
)

// RunFor runs every subscriber of subs (Run, each on a goroutine of its own) for d, or
// until ctx ends, then calls atEnd before it stops them: a Run that has not failed is
// still running then (unless ctx has ended), so its Status is the run's last, not
// StateStopped (`kvindex doctor` diagnoses each publisher there). It returns once every
// Run has returned, with the first error of a Run in subs' order, whatever the
// schedule. atEnd may be nil.
func RunFor(ctx context.Context, subs []*Subscriber, d time.Duration, atEnd func()) error {
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	errs := make([]error, len(subs)) // errs[i] is written by subs[i]'s goroutine only
	for i, s := range subs {
		wg.Go(func() { errs[i] = s.Run(runCtx) })
	}
	timer := time.NewTimer(d)
	select {
	case <-timer.C:
	case <-ctx.Done():
		timer.Stop()
	}
	if atEnd != nil {
		atEnd()
	}
	cancel()
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}
