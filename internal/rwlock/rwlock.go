//go:build !race

package rwlock

import (
	"sync"
	"sync/atomic"
)

// The lock's word: the readers holding it (the low 30 bits), whether a writer holds it,
// and whether someone waits in the slow path. Only the slow path (under mu) sets or
// clears waiting; while it is set, every fast path fails, so an unlock that has someone
// to wake always takes the slow path.
const (
	readerMask = 1<<30 - 1
	writer     = 1 << 30
	waiting    = 1 << 31
)

// RWMutex is a readers-writer lock: any number of readers or one writer. The zero value
// is unlocked. Like sync.RWMutex it must not be copied after first use, a goroutine that
// holds it for reading must not take it again for reading (a waiting writer blocks new
// readers), and a lock may be released by another goroutine than the one that took it.
//
// Unlike sync.RWMutex, a writer that meets no one takes and releases it with one
// compare-and-swap each (sync.RWMutex: a mutex and a reader-count add each way, four
// atomic instructions a cycle); readers take and release it with one add each, as
// sync.RWMutex's do. The scheduling is sync.RWMutex's: a waiting writer blocks new
// readers, and a writer's release hands the lock to every reader waiting then, before
// any other writer gets it (so a writer that releases and retakes it in a loop lets the
// waiting readers in each time).
type RWMutex struct {
	state atomic.Int64

	// The slow path's, under mu: how many readers and writers wait, the readers' cond
	// (a hand-over bumps gen and wakes them all, each already counted as a holder) and
	// the writers' (woken one at a time, each takes the lock itself).
	mu           sync.Mutex
	readers      sync.Cond
	writers      sync.Cond
	rWait, wWait int
	gen          uint64
}

// Lock takes l for writing, waiting until no one holds it.
func (l *RWMutex) Lock() {
	if l.state.CompareAndSwap(0, writer) {
		return
	}
	l.lockSlow()
}

// Unlock releases l, held for writing: every reader waiting then gets it, else one
// waiting writer may take it.
func (l *RWMutex) Unlock() {
	if l.state.CompareAndSwap(writer, 0) {
		return
	}
	l.unlockSlow()
}

// RLock takes l for reading, waiting while a writer holds it or waits for it.
func (l *RWMutex) RLock() {
	if s := l.state.Add(1); uint64(s) < writer { // no writer, no one waiting
		return
	}
	// A writer holds it or someone waits: take the count back (waking a writer that
	// waits for this reader to go) and queue.
	if s := l.state.Add(-1); s&waiting != 0 && s&(writer|readerMask) == 0 {
		l.wake()
	}
	l.rlockSlow()
}

// RUnlock releases l, held for reading; the last reader out wakes a waiting writer.
func (l *RWMutex) RUnlock() {
	s := l.state.Add(-1)
	if uint64(s) < readerMask { // readers left or none, no writer, no one waiting
		return
	}
	if s < 0 || s&readerMask == readerMask || s&writer != 0 && s&readerMask == 0 {
		panic("rwlock: RUnlock of an RWMutex not held for reading")
	}
	if s&waiting != 0 && s&(writer|readerMask) == 0 {
		l.wake()
	}
}

// initLocked points the conds at mu. Holder of mu.
func (l *RWMutex) initLocked() {
	if l.readers.L == nil {
		l.readers.L, l.writers.L = &l.mu, &l.mu
	}
}

// lockSlow is Lock with someone in the way: it waits on the writers' cond until l is
// free, then takes it, keeping waiting set while others wait.
func (l *RWMutex) lockSlow() {
	l.mu.Lock()
	l.initLocked()
	l.wWait++
	for {
		s := l.state.Load()
		if s&(writer|readerMask) == 0 {
			n := int64(writer)
			if l.wWait > 1 || l.rWait > 0 {
				n |= waiting
			}
			if l.state.CompareAndSwap(s, n) {
				break
			}
			continue
		}
		if s&waiting == 0 && !l.state.CompareAndSwap(s, s|waiting) {
			continue
		}
		l.writers.Wait()
	}
	l.wWait--
	l.mu.Unlock()
}

// unlockSlow is Unlock with waiting set (or a reader's passing count in the word): the
// waiting readers get l, counted as holders before they wake; with none, one waiting
// writer is woken to take it.
func (l *RWMutex) unlockSlow() {
	l.mu.Lock()
	l.initLocked()
	n := int64(l.rWait)
	for {
		s := l.state.Load()
		if s&writer == 0 {
			l.mu.Unlock()
			panic("rwlock: Unlock of an RWMutex not held for writing")
		}
		ns := s - writer + n
		if l.wWait > 0 {
			ns |= waiting
		} else {
			ns &^= waiting
		}
		if l.state.CompareAndSwap(s, ns) {
			break
		}
	}
	switch {
	case n > 0:
		l.rWait = 0
		l.gen++
		l.readers.Broadcast()
	case l.wWait > 0:
		l.writers.Signal()
	}
	l.mu.Unlock()
}

// rlockSlow is RLock with a writer holding l or waiting for it: it waits for the next
// writer's release, which counts it as a holder (unless l turns out free with no writer
// waiting, when it takes it at once).
func (l *RWMutex) rlockSlow() {
	l.mu.Lock()
	l.initLocked()
	for {
		s := l.state.Load()
		if s&writer == 0 && l.wWait == 0 {
			if l.state.CompareAndSwap(s, s+1) {
				l.settleLocked()
				l.mu.Unlock()
				return
			}
			continue
		}
		if s&waiting == 0 && !l.state.CompareAndSwap(s, s|waiting) {
			continue
		}
		break
	}
	l.rWait++
	for g := l.gen; l.gen == g; {
		l.readers.Wait()
	}
	l.mu.Unlock()
}

// wake runs when the word says l is free and someone waits: one waiting writer is
// woken (it takes l itself), or, with no writer waiting, the waiting flag goes.
func (l *RWMutex) wake() {
	l.mu.Lock()
	l.initLocked()
	if s := l.state.Load(); s&(writer|readerMask) == 0 && l.wWait > 0 {
		l.writers.Signal()
	}
	l.settleLocked()
	l.mu.Unlock()
}

// settleLocked clears waiting once no one waits. Holder of mu.
func (l *RWMutex) settleLocked() {
	if l.wWait > 0 || l.rWait > 0 {
		return
	}
	for {
		s := l.state.Load()
		if s&waiting == 0 || l.state.CompareAndSwap(s, s&^waiting) {
			return
		}
	}
}
