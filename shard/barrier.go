package shard

import "sync"

// Barrier is a token that every shard acknowledges, with a send on Ack, once it has
// applied everything its ring held before the token. Ack's capacity must be at least the
// number of shards that take the token.
type Barrier struct {
	Ack  chan struct{}
	left int // shards yet to acknowledge; guarded by Barriers.mu
}

// Barriers names the barrier tokens in the rings by id. A token's last acknowledgement
// removes it, so the table holds only barriers whose tokens are still in some ring (an
// abandoned barrier's too, until the shards reach its tokens). Safe for concurrent use:
// the engine's Barrier callers add and drop, the shard goroutines acknowledge.
type Barriers struct {
	mu   sync.Mutex
	next uint32
	live map[uint32]*Barrier
}

// Add registers b, to be acknowledged by shards shards, and returns its id.
func (t *Barriers) Add(b *Barrier, shards int) uint32 {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.live == nil {
		t.live = make(map[uint32]*Barrier)
	}
	for {
		t.next = (t.next + 1) & MaxID // a barrier's id travels in a delta's id bits
		if _, taken := t.live[t.next]; !taken {
			break // (an id is taken only by a token stuck in a ring 2^30 barriers ago)
		}
	}
	b.left = shards
	t.live[t.next] = b
	return t.next
}

// Ack takes one shard's acknowledgement of barrier id off the table and returns the
// barrier to signal, or nil if the table no longer has it (a barrier whose pushes
// failed was dropped). After the caller's signal the shard must not touch the barrier:
// once every shard has signalled, its owner reuses it.
func (t *Barriers) Ack(id uint32) *Barrier {
	t.mu.Lock()
	defer t.mu.Unlock()
	b := t.live[id]
	if b == nil {
		return nil
	}
	if b.left--; b.left == 0 {
		delete(t.live, id)
	}
	return b
}

// Drop removes barrier id, whose tokens did not all reach their rings.
func (t *Barriers) Drop(id uint32) {
	t.mu.Lock()
	delete(t.live, id)
	t.mu.Unlock()
}

// Len is the number of barriers whose tokens some ring still holds.
func (t *Barriers) Len() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.live)
}
