package fakevllm

import (
	"math/rand/v2"

	"github.com/kvindex/kvindex/hash"
)

// The block-pool model. Each simulated engine owns a prefix cache of at most Capacity
// blocks, keyed by engine block hash, evicted least recently used first, as vLLM's
// free-block queue does. Requests are turns of multi-turn sessions that start with
// one of a few system prompts shared across the fleet:
//
//	request = system prompt (SystemBlocks) + the session's earlier turns + a new turn
//	          (1..2*TurnBlocks blocks) + its output (OutputBlocks)
//
// The leading run of blocks the cache holds is a hit; the rest are stored (one
// BlockStored, parent = the last hit), after evicting what makes room (one
// BlockRemoved, first in the batch). A request touches its blocks from the last to
// the first, so a parent is always more recent than its children and the block
// evicted is always a leaf: every cached block's parent is cached, as in vLLM, and
// the leading-run walk finds every cached block of a chain.
//
// Block identity follows vLLM: a block's tokens are a function of (seed, position),
// its engine hash chains its parent's hash with its content, so a system prompt has
// the same hashes on every engine and a query built from the same tokens matches all
// of them.

// poolNode is one cached block in the LRU list.
type poolNode struct {
	hash       uint64
	prev, next int32 // -1: none
}

// blockPool is one engine's cache (owner: the engine's driver goroutine).
type blockPool struct {
	capacity   int
	idx        map[uint64]int32
	nodes      []poolNode
	free       []int32
	head, tail int32 // most and least recently used; -1 when empty
	hits       []int32
}

func newBlockPool(capacity int) *blockPool {
	return &blockPool{capacity: capacity, idx: make(map[uint64]int32, capacity), head: -1, tail: -1}
}

func (p *blockPool) len() int { return len(p.idx) }

func (p *blockPool) unlink(i int32) {
	n := &p.nodes[i]
	if n.prev >= 0 {
		p.nodes[n.prev].next = n.next
	} else {
		p.head = n.next
	}
	if n.next >= 0 {
		p.nodes[n.next].prev = n.prev
	} else {
		p.tail = n.prev
	}
	n.prev, n.next = -1, -1
}

func (p *blockPool) pushFront(i int32) {
	n := &p.nodes[i]
	n.prev, n.next = -1, p.head
	if p.head >= 0 {
		p.nodes[p.head].prev = i
	}
	p.head = i
	if p.tail < 0 {
		p.tail = i
	}
}

func (p *blockPool) has(h uint64) bool {
	_, ok := p.idx[h]
	return ok
}

// insert caches h as the most recent block (the caller made room).
func (p *blockPool) insert(h uint64) {
	var i int32
	if n := len(p.free); n > 0 {
		i = p.free[n-1]
		p.free = p.free[:n-1]
	} else {
		p.nodes = append(p.nodes, poolNode{})
		i = int32(len(p.nodes) - 1)
	}
	p.nodes[i].hash = h
	p.idx[h] = i
	p.pushFront(i)
}

// evict drops the least recently used block and returns its hash.
func (p *blockPool) evict() uint64 {
	i := p.tail
	h := p.nodes[i].hash
	p.unlink(i)
	delete(p.idx, h)
	p.free = append(p.free, i)
	return h
}

// Workload shapes the requests of every engine. Zero fields take the defaults.
type Workload struct {
	// BlockSize is the tokens per block. Default 16.
	BlockSize int
	// Capacity is each engine's cache, in blocks. Default 1024.
	Capacity int
	// SystemPrompts is the number of system prompts in the fleet; SystemBlocks their
	// length; SystemsPerEngine how many of them one engine's sessions use. Defaults:
	// FleetConfig sets SystemPrompts to Engines/4 (at least 32), so that a prompt is
	// cached on about 16 engines, as a KV-aware router's placement keeps a prefix on a
	// few engines (spread evenly, a prompt of 32 would be on every sixteenth engine: at
	// 2,048 engines, 256 matches per answer); 8 and 4.
	SystemPrompts, SystemBlocks, SystemsPerEngine int
	// Sessions is the number of open sessions per engine. Default 8.
	Sessions int
	// TurnBlocks is the mean new prompt blocks of a turn (uniform in 1..2*TurnBlocks);
	// OutputBlocks the output blocks each request stores. Defaults 4 and 2.
	TurnBlocks, OutputBlocks int
	// MaxSessionBlocks ends a session (a new one takes its place) once its next turn
	// would take it past this many blocks, system prompt included. Default 64.
	MaxSessionBlocks int
}

func (w Workload) withDefaults() Workload {
	def := func(v *int, d int) {
		if *v == 0 {
			*v = d
		}
	}
	def(&w.BlockSize, 16)
	def(&w.Capacity, 1024)
	def(&w.SystemPrompts, 32)
	def(&w.SystemBlocks, 8)
	def(&w.SystemsPerEngine, 4)
	def(&w.Sessions, 8)
	def(&w.TurnBlocks, 4)
	def(&w.OutputBlocks, 2)
	def(&w.MaxSessionBlocks, 64)
	w.SystemsPerEngine = min(w.SystemsPerEngine, w.SystemPrompts)
	return w
}

// tokenAt is token j of the block at position pos of the chain seeded seed.
func tokenAt(seed uint64, pos, j int) uint32 {
	return uint32(mix64(seed^uint64(pos)<<16^uint64(j)) % 128000)
}

// appendTokens appends the block's token ids to dst (raw, for hashing).
func appendTokens(dst []uint32, seed uint64, pos, blockSize int) []uint32 {
	for j := range blockSize {
		dst = append(dst, tokenAt(seed, pos, j))
	}
	return dst
}

// mix64 is splitmix64's finaliser.
func mix64(x uint64) uint64 {
	x += 0x9e3779b97f4a7c15
	x = (x ^ x>>30) * 0xbf58476d1ce4e5b9
	x = (x ^ x>>27) * 0x94d049bb133111eb
	return x ^ x>>31
}

// rootParent is the parent a root block's engine hash chains from (vLLM's NONE_HASH).
const rootParent = 0x6b76696e64657800

// engineHash is a block's engine hash: its parent's chained with its content.
func engineHash(parent, content uint64) uint64 { return mix64(parent ^ mix64(content)) }

// chain is a run of blocks: their token seeds, content hashes and engine hashes.
type chain struct {
	seeds   []uint64
	content []uint64
	hashes  []uint64
}

// grow appends n blocks seeded seed after the chain's end.
func (c *chain) grow(seed uint64, n, blockSize int, scratch []uint32) []uint32 {
	for range n {
		pos := len(c.content)
		scratch = appendTokens(scratch[:0], seed, pos, blockSize)
		ct := hash.Content(scratch)
		parent := uint64(rootParent)
		if pos > 0 {
			parent = c.hashes[pos-1]
		}
		c.seeds = append(c.seeds, seed)
		c.content = append(c.content, ct)
		c.hashes = append(c.hashes, engineHash(parent, ct))
	}
	return scratch
}

func (c *chain) truncate(n int) {
	c.seeds, c.content, c.hashes = c.seeds[:n], c.content[:n], c.hashes[:n]
}

// prompts are the fleet's system prompts (read-only once built).
type prompts struct {
	w   Workload
	sys []chain
}

func newPrompts(w Workload, seed uint64) *prompts {
	p := &prompts{w: w, sys: make([]chain, w.SystemPrompts)}
	var scratch []uint32
	for i := range p.sys {
		scratch = p.sys[i].grow(mix64(seed+uint64(i)+1), w.SystemBlocks, w.BlockSize, scratch)
	}
	return p
}

// session is one open conversation of an engine: its chain starts with a copy of its
// system prompt.
type session struct {
	chain chain
	seed  uint64 // token seed of the session's own blocks
}

// requester makes one engine's requests (owner: the engine's driver goroutine).
type requester struct {
	p        *prompts
	rng      *rand.Rand
	systems  []int // the system prompts this engine's sessions use
	sessions []session
	scratch  []uint32
}

func newRequester(p *prompts, seed uint64) *requester {
	r := &requester{p: p, rng: rand.New(rand.NewPCG(seed, seed^0x5eed)), sessions: make([]session, p.w.Sessions)}
	r.systems = append(r.systems, r.rng.Perm(len(p.sys))[:p.w.SystemsPerEngine]...)
	for i := range r.sessions {
		r.reset(&r.sessions[i])
	}
	return r
}

// reset starts a new session in s.
func (r *requester) reset(s *session) {
	sys := &r.p.sys[r.systems[r.rng.IntN(len(r.systems))]]
	s.seed = r.rng.Uint64()
	s.chain.truncate(0)
	s.chain.seeds = append(s.chain.seeds, sys.seeds...)
	s.chain.content = append(s.chain.content, sys.content...)
	s.chain.hashes = append(s.chain.hashes, sys.hashes...)
}

// next returns the chain of the next request (valid until the next call): a session's
// history plus a new turn and its output.
func (r *requester) next() *chain {
	w := r.p.w
	s := &r.sessions[r.rng.IntN(len(r.sessions))]
	n := 1 + r.rng.IntN(2*w.TurnBlocks) + w.OutputBlocks
	if len(s.chain.content)+n > w.MaxSessionBlocks {
		r.reset(s)
		n = min(n, w.MaxSessionBlocks-len(s.chain.content))
	}
	r.scratch = s.chain.grow(s.seed, n, w.BlockSize, r.scratch)
	return &s.chain
}

// admit runs one request against the pool: it returns the position of the first block
// to store (the blocks before it were hits) and appends the evicted hashes to evicted.
func (p *blockPool) admit(c *chain, evicted []uint64) (first int, out []uint64) {
	hits := p.hits[:0] // the hits' nodes: one map lookup per block
	for _, h := range c.hashes {
		i, ok := p.idx[h]
		if !ok {
			break
		}
		hits = append(hits, i)
	}
	p.hits = hits
	first = len(hits)
	// Hits first, from the last to the first (a parent more recent than its children),
	// so that eviction cannot take them; then room; then the new blocks, last first;
	// then the hits again, above the new blocks.
	p.touchNodes(hits)
	for p.len()+len(c.hashes)-first > p.capacity {
		evicted = append(evicted, p.evict())
	}
	for i := len(c.hashes) - 1; i >= first; i-- {
		p.insert(c.hashes[i])
	}
	p.touchNodes(hits)
	return first, evicted
}

// touchNodes makes nodes the most recent, the first of them last (most recent).
func (p *blockPool) touchNodes(nodes []int32) {
	for k := len(nodes) - 1; k >= 0; k-- {
		if i := nodes[k]; p.head != i {
			p.unlink(i)
			p.pushFront(i)
		}
	}
}
