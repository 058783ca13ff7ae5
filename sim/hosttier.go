package sim

import "github.com/kvindex/kvindex/engine"

// hostTier is a mock engine's host-memory tier: an LRU cache of engine hashes. Blocks enter it only when the device evicts
// them (offload on eviction, SGLang HiCache's write-back policy; vLLM's offloading
// connector writes through instead, which changes when a block reaches the host, not what
// the router sees of it) and leave it only when it is full and needs room: the least
// recently used block goes, with a host-tier removed event.
type hostTier struct {
	entries []hentry // by slot
	lru     lruList  // the taken slots, least recently used first
	byHash  map[uint64]int32
	used    int32   // slots ever taken: [0, used)
	free    []int32 // taken slots free again (an orphan's, after its eviction)
}

// hentry is one host block: its engine hash.
type hentry struct {
	hash uint64
}

// blockMeta is what a device block's stored event named: kept only with a host tier, so
// that an evicted block can be stored on the host under its parent.
type blockMeta struct {
	content, parent uint64
	hasParent       bool
}

func newHostTier(capacity int) *hostTier {
	return &hostTier{
		entries: make([]hentry, capacity),
		lru:     newLRUList(capacity),
		byHash:  make(map[uint64]int32, min(capacity, 1<<16)),
	}
}

func (h *hostTier) holds(hash uint64) bool {
	_, ok := h.byHash[hash]
	return ok
}

// touch makes a held block the most recently used.
func (h *hostTier) touch(hash uint64) {
	if i, ok := h.byHash[hash]; ok {
		h.lru.unlink(i)
		h.lru.pushTail(i)
	}
}

// offload stores device block hash (whose stored event named md) on the host tier, in
// phases: a block the host holds already is only touched; a block whose parent no tier
// of m holds any more is an orphan (no index could place it, and it could not extend a
// prefix until its parent is computed again), dropped and counted in m.orphans; a full
// host evicts its least recently used block (a host-tier removed event), and then the
// block is stored as a host-tier stored event under its parent. (The victim may be
// that parent: then the block is an orphan after all, and its slot stays free.)
func (m *mockEngine) offload(hash uint64, md blockMeta, em emitter) error {
	h := m.host
	if h.holds(hash) {
		h.touch(hash)
		return nil
	}
	orphan := func() bool {
		if !md.hasParent {
			return false
		}
		_, onDevice := m.cached.get(md.parent)
		return !onDevice && !h.holds(md.parent)
	}
	if orphan() {
		m.orphans++
		return nil
	}
	var slot int32
	switch {
	case len(h.free) > 0:
		slot = h.free[len(h.free)-1]
		h.free = h.free[:len(h.free)-1]
	case int(h.used) < len(h.entries):
		slot = h.used
		h.used++
	default:
		slot, _ = h.lru.head() // full: the list holds every slot
		h.lru.unlink(slot)
		victim := h.entries[slot].hash
		delete(h.byHash, victim)
		if err := em.removed(m.name, engine.TierHost, victim); err != nil {
			return err
		}
	}
	if orphan() {
		m.orphans++
		h.free = append(h.free, slot)
		return nil
	}
	h.entries[slot] = hentry{hash: hash}
	h.byHash[hash] = slot
	h.lru.pushTail(slot)
	m.hev[0] = engine.Block{Content: md.content, Seq: hash}
	return em.stored(m.name, engine.TierHost, md.parent, md.hasParent, m.hev[:])
}
