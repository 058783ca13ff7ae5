package guard

import (
	"sync"
	"sync/atomic"
)

// Budget is a byte budget taken and given back by many goroutines.
type Budget struct {
	limit int64
	used  atomic.Int64
}

// NewBudget returns a budget of limit bytes.
func NewBudget(limit int64) *Budget { return &Budget{limit: limit} }

// Take reserves n bytes if they fit.
func (b *Budget) Take(n int64) bool {
	for {
		u := b.used.Load()
		if u+n > b.limit {
			return false
		}
		if b.used.CompareAndSwap(u, u+n) {
			return true
		}
	}
}

// Give returns n bytes taken before.
func (b *Budget) Give(n int64) { b.used.Add(-n) }

// Used is what is taken now.
func (b *Budget) Used() int64 { return b.used.Load() }

// Limit is the budget's size.
func (b *Budget) Limit() int64 { return b.limit }

// Shares holds one budget per client while the client holds bytes of it: an entry is
// made by the first Take and dropped by the Give that returns its last byte, so the map
// holds at most one entry per request in flight.
type Shares struct {
	limit int64
	mu    sync.Mutex
	m     map[string]*share
}

type share struct {
	used  int64
	holds int
}

// NewShares returns per-client budgets of limit bytes each.
func NewShares(limit int64) *Shares { return &Shares{limit: limit, m: map[string]*share{}} }

// Take reserves n bytes of client's share if they fit.
func (s *Shares) Take(client string, n int64) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	sh := s.m[client]
	if sh == nil {
		if n > s.limit {
			return false
		}
		sh = &share{}
		s.m[client] = sh
	} else if sh.used+n > s.limit {
		return false
	}
	sh.used += n
	sh.holds++
	return true
}

// Give returns n bytes client took with one Take.
func (s *Shares) Give(client string, n int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	sh := s.m[client]
	if sh == nil {
		return
	}
	sh.used -= n
	if sh.holds--; sh.holds == 0 {
		delete(s.m, client)
	}
}

// Used is what client holds now.
func (s *Shares) Used(client string) int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	if sh := s.m[client]; sh != nil {
		return sh.used
	}
	return 0
}

// Limit is one client's share.
func (s *Shares) Limit() int64 { return s.limit }

// Clients is how many clients hold bytes now.
func (s *Shares) Clients() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.m)
}
