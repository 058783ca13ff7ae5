package route

import (
	"fmt"
	"sync"

	"github.com/kvindex/kvindex/hash"
)

// MaxApproxCapacity bounds ApproxCache's capacity per worker, in blocks.
const MaxApproxCapacity = 1 << 24

// approxSeed starts the prefix chain ApproxCache keys its blocks by, so that equal
// content at different depths never shares a key.
const approxSeed = 0x617070726f78 // "approx"

// ApproxCache is llm-d's approximate prefix cache: for each worker, an LRU set of the
// prefix blocks the router sent there, at most Capacity of them, standing in for the
// worker's KV cache when the worker publishes no events. Record the blocks of every
// routed request; Match says how many leading blocks of a request each worker is
// thought to hold. It knows nothing of what other routers sent, of what the worker
// evicted early, or of blocks the worker generated. It is safe for concurrent use.
type ApproxCache struct {
	capacity int

	mu      sync.Mutex
	workers map[string]*lruSet // guarded by mu
	chain   []uint64           // guarded by mu: scratch
}

// NewApproxCache returns an empty ApproxCache holding up to capacity blocks per worker.
func NewApproxCache(capacity int) (*ApproxCache, error) {
	if capacity < 1 || capacity > MaxApproxCapacity {
		return nil, fmt.Errorf("%w: approximate cache capacity %d blocks, want 1..%d", ErrConfig, capacity, MaxApproxCapacity)
	}
	return &ApproxCache{capacity: capacity, workers: map[string]*lruSet{}}, nil
}

// chainLocked fills c.chain with the prefix keys of content (content hashes of the
// request's full blocks, as package hash computes them).
func (c *ApproxCache) chainLocked(content []uint64) []uint64 {
	c.chain = c.chain[:0]
	h := uint64(approxSeed)
	for _, b := range content {
		h = hash.Next(h, b)
		c.chain = append(c.chain, h)
	}
	return c.chain
}

// Record notes that the request of the given content hashes went to worker: each of
// its blocks becomes the worker's most recently used, evicting the least recently used
// beyond capacity. They are touched last block first, so that the head of a prefix
// outlives its tail (an entry is useless once a block before it is gone), as vLLM's
// tail-first freeing keeps it.
func (c *ApproxCache) Record(worker string, content []uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := c.workers[worker]
	if s == nil {
		s = newLRUSet(c.capacity)
		c.workers[worker] = s
	}
	chain := c.chainLocked(content)
	for i := len(chain) - 1; i >= 0; i-- {
		s.touch(chain[i])
	}
}

// Match returns how many leading blocks of content worker is thought to hold.
func (c *ApproxCache) Match(worker string, content []uint64) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := c.workers[worker]
	if s == nil {
		return 0
	}
	n := 0
	for _, k := range c.chainLocked(content) {
		if !s.has(k) {
			break
		}
		n++
	}
	return n
}

// MatchAll sets dst[i] to Match(workers[i], content) for every worker, computing the
// request's prefix keys once, and returns dst (grown when short).
func (c *ApproxCache) MatchAll(workers []string, content []uint64, dst []int) []int {
	c.mu.Lock()
	defer c.mu.Unlock()
	dst = append(dst[:0], make([]int, len(workers))...)
	chain := c.chainLocked(content)
	for i, w := range workers {
		s := c.workers[w]
		if s == nil {
			continue
		}
		n := 0
		for n < len(chain) && s.has(chain[n]) {
			n++
		}
		dst[i] = n
	}
	return dst
}

// Forget drops everything recorded for worker (it left, or restarted).
func (c *ApproxCache) Forget(worker string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.workers, worker)
}

// lruSet is a bounded set of keys in least-recently-used order: an intrusive list over
// slots, the sentinel at index 0.
type lruSet struct {
	slots []lruSlot
	index map[uint64]int32
	cap   int
}

type lruSlot struct {
	key        uint64
	prev, next int32
}

func newLRUSet(capacity int) *lruSet {
	s := &lruSet{cap: capacity, index: make(map[uint64]int32, min(capacity, 1<<12))}
	s.slots = append(s.slots, lruSlot{}) // the sentinel: next is the least recent
	return s
}

func (s *lruSet) has(k uint64) bool {
	_, ok := s.index[k]
	return ok
}

func (s *lruSet) unlink(i int32) {
	p, n := s.slots[i].prev, s.slots[i].next
	s.slots[p].next = n
	s.slots[n].prev = p
}

func (s *lruSet) pushBack(i int32) {
	last := s.slots[0].prev
	s.slots[i].prev, s.slots[i].next = last, 0
	s.slots[last].next = i
	s.slots[0].prev = i
}

// touch makes k the most recently used, inserting it (and evicting the least recently
// used key when full).
func (s *lruSet) touch(k uint64) {
	if i, ok := s.index[k]; ok {
		s.unlink(i)
		s.pushBack(i)
		return
	}
	var i int32
	if len(s.index) < s.cap {
		s.slots = append(s.slots, lruSlot{})
		i = int32(len(s.slots) - 1)
	} else {
		i = s.slots[0].next
		s.unlink(i)
		delete(s.index, s.slots[i].key)
	}
	s.slots[i].key = k
	s.index[k] = i
	s.pushBack(i)
}
