package sim

import (
	"encoding/binary"
	"fmt"

	"github.com/kvindex/kvindex/engine"
	"github.com/zeebo/xxh3"
)

// emitter receives a mock engine's KV-cache events in the order the engine emits them.
// Every event names its tier: device, or host for a mock engine with a host tier.
type emitter interface {
	stored(worker string, tier engine.Tier, parent uint64, hasParent bool, blocks []engine.Block) error
	removed(worker string, tier engine.Tier, seq uint64) error
}

// engineHashSeed keys the mock engines' own block hash; it is unrelated to the content
// hash, so the index can never recompute an engine hash (as with vLLM's SHA-256).
const engineHashSeed = 0x766c6c6d2d763121 // "vllm-v1!"

// engineHash is a mock engine's opaque block hash: a hash of the parent's engine hash and
// the block's content (vLLM hashes the parent hash and the token ids).
func engineHash(parent, content uint64) uint64 {
	var b [16]byte
	binary.LittleEndian.PutUint64(b[:8], parent)
	binary.LittleEndian.PutUint64(b[8:], content)
	return xxh3.HashSeed(b[:], engineHashSeed)
}

const none = -1

// pblock is one physical KV block of a mock engine.
type pblock struct {
	hash   uint64
	hashed bool
	ref    int32  // running requests holding it
	dup    int32  // next block cached under the same hash, none at the end
	gen    uint32 // counts the times the block was cached
}

// mockEngine is one worker: a vLLM v1-style prefix cache of a fixed number of blocks.
//
// Its free queue holds every block no running request holds, least recently freed at the
// head; blocks keep their hash (and stay reusable) until allocation takes them. Cached
// maps an engine hash to the oldest block cached under it; vLLM may cache one hash in two
// blocks (a fully cached prompt recomputes its last block), so the others follow through
// dup links.
type mockEngine struct {
	name        string
	noneHash    uint64 // vLLM's NONE_HASH: the parent of a root block, per engine
	blockSize   int
	chunkTokens int
	blocks      []pblock
	free        lruList   // the blocks no running request holds
	cached      hashTable // engine hash -> the first block cached under it
	inUse       int       // the blocks running requests hold (capacity - inUse are on free)

	// With a host tier (host != nil), meta[b] is what device block b's stored event
	// named, so that its eviction can offload it; orphans counts the evicted blocks
	// that were not offloaded because no tier held their parent any more.
	host    *hostTier
	meta    []blockMeta
	orphans int64

	// scratch, reused across requests
	hashes []uint64
	req    []int32
	ev     []engine.Block
	hev    [1]engine.Block // offload's, apart from ev: offloads happen while ev is filled
	onDev  []bool          // per reused block: held on the device (else loaded from host)
}

// newMockEngine returns an engine of capacity device blocks and, when hostCapacity > 0, a
// host tier of hostCapacity blocks.
func newMockEngine(name string, noneHash uint64, capacity, hostCapacity, blockSize, chunkTokens int) *mockEngine {
	m := &mockEngine{
		name: name, noneHash: noneHash, blockSize: blockSize, chunkTokens: chunkTokens,
		blocks: make([]pblock, capacity),
		free:   newLRUList(capacity),
		cached: newHashTable(capacity),
	}
	if hostCapacity > 0 {
		m.host = newHostTier(hostCapacity)
		m.meta = make([]blockMeta, capacity)
	}
	for i := range int32(capacity) {
		m.blocks[i] = pblock{dup: none}
		m.free.pushTail(i)
	}
	return m
}

// cache records that block b now holds hash h, the block of content c under the given
// parent.
func (m *mockEngine) cache(b int32, h, c, parent uint64, hasParent bool) {
	if m.meta != nil {
		m.meta[b] = blockMeta{content: c, parent: parent, hasParent: hasParent}
	}
	m.blocks[b].hash, m.blocks[b].hashed, m.blocks[b].dup = h, true, none
	m.blocks[b].gen++
	first, ok := m.cached.get(h)
	if !ok {
		m.cached.set(h, b)
		return
	}
	for m.blocks[first].dup != none {
		first = m.blocks[first].dup
	}
	m.blocks[first].dup = b
}

// uncache forgets block b's hash.
func (m *mockEngine) uncache(b int32) {
	h := m.blocks[b].hash
	first, _ := m.cached.get(h)
	if first == b {
		if d := m.blocks[b].dup; d != none {
			m.cached.set(h, d)
		} else {
			m.cached.del(h)
		}
	} else {
		for m.blocks[first].dup != b {
			first = m.blocks[first].dup
		}
		m.blocks[first].dup = m.blocks[b].dup
	}
	m.blocks[b].hashed, m.blocks[b].hash, m.blocks[b].dup = false, 0, none
}

// allocate takes the least recently freed block, evicting its hash if it has one (and
// offloading it to the host tier if there is one).
func (m *mockEngine) allocate(em emitter) (int32, error) {
	b, ok := m.free.head()
	if !ok {
		return 0, fmt.Errorf("sim: worker %s: no free block (capacity %d)", m.name, len(m.blocks))
	}
	m.free.unlink(b)
	m.blocks[b].ref = 1
	m.inUse++
	if m.blocks[b].hashed {
		h := m.blocks[b].hash
		m.uncache(b)
		if err := em.removed(m.name, engine.TierDevice, h); err != nil {
			return 0, err
		}
		if m.host != nil {
			if err := m.offload(h, m.meta[b], em); err != nil {
				return 0, err
			}
		}
	}
	return b, nil
}

// served describes one finished request.
type served struct {
	// hit is the number of leading full blocks the worker held in device memory when the
	// request arrived, and hostHit how many more its host tier extended that prefix by
	// (each block counted on the fastest tier that holds it, as the index's Match.Tiers
	// counts them).
	hit, hostHit int
	// reused is the number of those hit+hostHit blocks the engine reused (at most
	// (tokens-1)/B), and loaded how many of them it loaded from the host tier.
	reused, loaded int
}

// serve runs one request to completion in phases: find the prefix, pin the reused blocks
// held in device memory, load the others from the host tier into new device blocks
// (stored on the device again), prefill the rest chunk by chunk, free. The caller
// guarantees that ceil(r.Tokens/blockSize) <= capacity.
func (m *mockEngine) serve(r *Request, em emitter) (served, error) {
	B := m.blockSize
	m.hashes = m.hashes[:0]
	p := m.noneHash
	for _, c := range r.Blocks {
		p = engineHash(p, c)
		m.hashes = append(m.hashes, p)
	}
	var out served
	for out.hit < len(m.hashes) {
		if _, ok := m.cached.get(m.hashes[out.hit]); !ok {
			break
		}
		out.hit++
	}
	if m.host != nil {
		for n := out.hit; n < len(m.hashes); n++ {
			if _, ok := m.cached.get(m.hashes[n]); !ok && !m.host.holds(m.hashes[n]) {
				break
			}
			out.hostHit++
		}
	}
	out.reused = reusable(out.hit+out.hostHit, r.Tokens, B)

	// Pin the reused blocks held in device memory first: the loads below allocate, and
	// allocation must not evict them. Touch the host blocks to load, so that the
	// offloads those allocations cause evict others first.
	m.req = m.req[:0]
	m.onDev = m.onDev[:0]
	for _, h := range m.hashes[:out.reused] {
		b, ok := m.cached.get(h)
		m.onDev = append(m.onDev, ok)
		if !ok {
			m.host.touch(h)
			m.req = append(m.req, none)
			out.loaded++
			continue
		}
		m.pin(b)
		m.req = append(m.req, b)
	}
	if err := m.load(r, em); err != nil {
		return out, err
	}

	// Prefill in chunks: allocate the chunk's blocks, then store its newly full blocks.
	stored := out.reused
	for done := out.reused * B; done < r.Tokens; {
		end := min(done+m.chunkTokens, r.Tokens)
		for need := (end + B - 1) / B; len(m.req) < need; {
			b, err := m.allocate(em)
			if err != nil {
				return out, err
			}
			m.req = append(m.req, b)
		}
		if full := end / B; full > stored {
			if err := m.store(stored, full, r, em); err != nil {
				return out, err
			}
			stored = full
		}
		done = end
	}

	m.release(m.req)
	return out, nil
}

// pin takes one more reference to block b, off the free queue if it was on it.
func (m *mockEngine) pin(b int32) {
	if m.blocks[b].ref == 0 {
		m.free.unlink(b)
		m.inUse++
	}
	m.blocks[b].ref++
}

// release drops one reference to each of a request's blocks, tail first, so that a
// request's tail blocks are evicted before its head.
func (m *mockEngine) release(blocks []int32) {
	for i := len(blocks) - 1; i >= 0; i-- {
		b := blocks[i]
		if m.blocks[b].ref--; m.blocks[b].ref == 0 {
			m.free.pushTail(b)
			m.inUse--
		}
	}
}

// store caches the request's blocks [i, j) in their device blocks m.req[i:j] and emits
// them as one device stored event under block i-1 (none for i == 0).
func (m *mockEngine) store(i, j int, r *Request, em emitter) error {
	var parent uint64
	if i > 0 {
		parent = m.hashes[i-1]
	}
	m.ev = m.ev[:0]
	for k, p := i, parent; k < j; k, p = k+1, m.hashes[k] {
		m.cache(m.req[k], m.hashes[k], r.Blocks[k], p, k > 0)
		m.ev = append(m.ev, engine.Block{Content: r.Blocks[k], Seq: m.hashes[k]})
	}
	return em.stored(m.name, engine.TierDevice, parent, i > 0, m.ev)
}

// load gives each reused block that only the host tier holds (m.onDev false) a new
// device block and stores it on the device: one stored event per run of consecutive
// loaded blocks, under the block before the run (held on the device: pinned, or loaded
// just before).
func (m *mockEngine) load(r *Request, em emitter) error {
	for i := 0; i < len(m.onDev); {
		if m.onDev[i] {
			i++
			continue
		}
		j := i
		for ; j < len(m.onDev) && !m.onDev[j]; j++ {
			b, err := m.allocate(em)
			if err != nil {
				return err
			}
			m.req[j] = b
		}
		if err := m.store(i, j, r, em); err != nil {
			return err
		}
		i = j
	}
	return nil
}

// held returns the number of distinct hashes the engine holds (the index's size for it
// when no hash is held twice) and the number of blocks that carry a hash.
func (m *mockEngine) held() (hashes, blocks int) {
	for _, b := range m.blocks {
		if b.hashed {
			blocks++
		}
	}
	return m.cached.len(), blocks
}
