package subscriber

import (
	"context"
	"errors"
)

// ErrNotSyncing is Wait's answer when the subscriber will not sync: its Run returned
// (StateStopped) or its engine was removed after the grace period (StateRemoved).
var ErrNotSyncing = errors.New("subscriber: stopped or removed before syncing")

// Synced reports whether the subscriber has completed its first catch-up since it last
// connected (Status().Synced, without copying the counters): every batch the engine
// buffered has been handed to the index. A reconnect makes it false until the next
// catch-up. Safe for concurrent use.
func (s *Subscriber) Synced() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.pub.Synced
}

// Wait blocks until the subscriber is synced (Synced), ctx ends (ctx.Err()), or the
// subscriber stops or is removed first (ErrNotSyncing). It is woken by the owner when
// the state changes, never by polling, and costs the event path nothing while nobody
// waits. Synced means handed to the index: a caller that must read its answers calls
// the index's Barrier after Wait. Safe for concurrent use, by any number of callers.
func (s *Subscriber) Wait(ctx context.Context) error {
	for {
		s.mu.Lock()
		st := s.pub.State
		switch {
		case st == StateStopped || st == StateRemoved:
			s.mu.Unlock()
			return ErrNotSyncing
		case s.pub.Synced:
			s.mu.Unlock()
			return nil
		}
		if s.wake == nil {
			s.wake = make(chan struct{})
		}
		wake := s.wake
		s.mu.Unlock()
		select {
		case <-wake:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// wakeWaiters wakes every Wait when the published status answers them (synced,
// stopped or removed). Called by publish with mu held.
func (s *Subscriber) wakeWaiters() {
	if s.wake == nil {
		return
	}
	if st := s.pub.State; s.pub.Synced || st == StateStopped || st == StateRemoved {
		close(s.wake)
		s.wake = nil
	}
}
