package sim

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/kvindex/kvindex/engine"
	"github.com/kvindex/kvindex/internal/refmodel"
)

// eventLog records a mock engine's events with readable names: an engine hash is written
// as the content path it names, e.g. "1/2/3".
type eventLog struct {
	names map[uint64]string
	evs   []string
}

// learn names the engine hashes of a chain of contents under noneHash.
func (l *eventLog) learn(noneHash uint64, contents []uint64) {
	p := noneHash
	var path []string
	for _, c := range contents {
		p = engineHash(p, c)
		path = append(path, strconv.FormatUint(c, 10))
		l.names[p] = strings.Join(path, "/")
	}
}

func (l *eventLog) name(seq uint64) string {
	if n, ok := l.names[seq]; ok {
		return n
	}
	return fmt.Sprintf("#%x", seq)
}

// tierPrefix marks a host-tier event: "host stored ...", "host removed ...".
func tierPrefix(t engine.Tier) string {
	if t == engine.TierDevice {
		return ""
	}
	return t.String() + " "
}

func (l *eventLog) stored(_ string, tier engine.Tier, parent uint64, hasParent bool, blocks []engine.Block) error {
	var b strings.Builder
	b.WriteString(tierPrefix(tier) + "stored")
	if hasParent {
		fmt.Fprintf(&b, " under %s:", l.name(parent))
	}
	for _, x := range blocks {
		b.WriteString(" " + l.name(x.Seq))
	}
	l.evs = append(l.evs, b.String())
	return nil
}

func (l *eventLog) removed(_ string, tier engine.Tier, seq uint64) error {
	l.evs = append(l.evs, tierPrefix(tier)+"removed "+l.name(seq))
	return nil
}

// req builds a request of tokens tokens whose full blocks have the given contents.
func req(tokens int, contents ...uint64) Request { return Request{Tokens: tokens, Blocks: contents} }

func TestMockEngineEvents(t *testing.T) {
	type step struct {
		r              Request
		hit, hostHit   int
		reused, loaded int
		events         []string
	}
	// Block size 4 tokens throughout.
	tests := []struct {
		name     string
		capacity int
		host     int // host tier blocks
		chunk    int // tokens
		steps    []step
	}{
		{
			name:     "a cold request is stored chunk by chunk, root first; the partial block is never stored",
			capacity: 8, chunk: 8,
			steps: []step{{r: req(18, 1, 2, 3, 4), events: []string{"stored 1 1/2", "stored under 1/2: 1/2/3 1/2/3/4"}}},
		},
		{
			name:     "a shared prefix is reused and the rest hangs under the last reused block",
			capacity: 8, chunk: 64,
			steps: []step{
				{r: req(16, 1, 2, 3, 4), events: []string{"stored 1 1/2 1/2/3 1/2/3/4"}},
				{r: req(16, 1, 2, 7, 8), hit: 2, reused: 2, events: []string{"stored under 1/2: 1/2/7 1/2/7/8"}},
				{r: req(9, 1, 2), hit: 2, reused: 2},
			},
		},
		{
			name:     "a fully cached prompt recomputes its last block and stores its hash again",
			capacity: 8, chunk: 64,
			steps: []step{
				{r: req(12, 1, 2, 3), events: []string{"stored 1 1/2 1/2/3"}},
				{r: req(12, 1, 2, 3), hit: 3, reused: 2, events: []string{"stored under 1/2: 1/2/3"}},
				// 7 new blocks: the free queue holds the never used blocks 4 to 7, then
				// the first copy of 1/2/3 (freed by the first request, not reused since),
				// then the second request's blocks tail first: the second copy of 1/2/3,
				// 1/2, 1. Each evicted copy of a hash emits its own removal.
				{r: req(28, 9, 9, 9, 9, 9, 9, 9), events: []string{
					"removed 1/2/3", "removed 1/2/3", "removed 1/2",
					"stored 9 9/9 9/9/9 9/9/9/9 9/9/9/9/9 9/9/9/9/9/9 9/9/9/9/9/9/9"}},
				{r: req(4, 5), events: []string{"removed 1", "stored 5"}},
			},
		},
		{
			name:     "eviction takes the least recently freed blocks, each request's tail first",
			capacity: 4, chunk: 64,
			steps: []step{
				{r: req(16, 1, 2, 3, 4), events: []string{"stored 1 1/2 1/2/3 1/2/3/4"}},
				{r: req(8, 5, 6), events: []string{"removed 1/2/3/4", "removed 1/2/3", "stored 5 5/6"}},
				{r: req(16, 1, 2, 3, 4), hit: 2, reused: 2, events: []string{
					"removed 5/6", "removed 5", "stored under 1/2: 1/2/3 1/2/3/4"}},
			},
		},
		{
			name:     "blocks the running request reuses are not evicted, even at the head of the queue",
			capacity: 3, chunk: 64,
			steps: []step{
				{r: req(4, 1), events: []string{"stored 1"}},
				{r: req(8, 7, 8), events: []string{"stored 7 7/8"}},
				{r: req(12, 1, 5, 6), hit: 1, reused: 1, events: []string{
					"removed 7/8", "removed 7", "stored under 1: 1/5 1/5/6"}},
			},
		},
		{
			name:     "allocation happens per chunk, before the chunk's store",
			capacity: 4, chunk: 8,
			steps: []step{
				{r: req(8, 1, 2), events: []string{"stored 1 1/2"}},
				{r: req(16, 3, 4, 5, 6), events: []string{
					"stored 3 3/4", "removed 1/2", "removed 1", "stored under 3/4: 3/4/5 3/4/5/6"}},
			},
		},
		{
			name:     "with a host tier, evicted blocks are offloaded under their parents, and a prefix that continues on the host is loaded back",
			capacity: 4, host: 2, chunk: 64,
			steps: []step{
				{r: req(16, 1, 2, 3, 4), events: []string{"stored 1 1/2 1/2/3 1/2/3/4"}},
				// The free queue: 1/2/3/4, 1/2/3, 1/2, 1 (tail first). Each eviction
				// is offloaded; the parent is still in device memory.
				{r: req(8, 5, 6), events: []string{
					"removed 1/2/3/4", "host stored under 1/2/3: 1/2/3/4",
					"removed 1/2/3", "host stored under 1/2: 1/2/3",
					"stored 5 5/6"}},
				// 1 and 1/2 on the device, 1/2/3 and 1/2/3/4 on the host: at most 3
				// blocks are reused, so 1/2/3 is loaded (into the block 5/6 held, whose
				// offload evicts the host's least recently used block, 1/2/3/4: 1/2/3 was
				// touched for the load) and stored on the device again; 1/2/3/4 is
				// recomputed, in the block 5 held.
				{r: req(16, 1, 2, 3, 4), hit: 2, hostHit: 2, reused: 3, loaded: 1, events: []string{
					"removed 5/6", "host removed 1/2/3/4", "host stored under 5: 5/6",
					"stored under 1/2: 1/2/3",
					"removed 5", "host removed 1/2/3", "host stored 5",
					"stored under 1/2/3: 1/2/3/4"}},
				// Loaded runs are stored one event each, under the block before them.
				// The loads' allocations may evict what was loaded from the host: it has
				// been read by then.
				{r: req(9, 5, 6), hit: 0, hostHit: 2, reused: 2, loaded: 2, events: []string{
					"removed 1/2/3/4", "host removed 5", "host stored under 1/2/3: 1/2/3/4",
					"removed 1/2/3", "host removed 5/6", "host stored under 1/2: 1/2/3",
					"stored 5 5/6",
					"removed 1/2", "host removed 1/2/3/4", "host stored under 1: 1/2"}},
			},
		},
		{
			name:     "a request shorter than a block stores nothing",
			capacity: 2, chunk: 64,
			steps: []step{{r: req(3)}, {r: req(0)}},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			const none = 0x1234
			m := newMockEngine("w", none, tc.capacity, tc.host, 4, tc.chunk)
			l := &eventLog{names: map[uint64]string{}}
			for i, s := range tc.steps {
				l.learn(none, s.r.Blocks)
				l.evs = nil
				out, err := m.serve(&s.r, l)
				if err != nil {
					t.Fatalf("step %d: %v", i, err)
				}
				if out.hit != s.hit || out.reused != s.reused || out.hostHit != s.hostHit || out.loaded != s.loaded {
					t.Errorf("step %d: hit %d+%d reused %d loaded %d, want %d+%d %d %d", i, out.hit, out.hostHit, out.reused, out.loaded, s.hit, s.hostHit, s.reused, s.loaded)
				}
				if !slices.Equal(l.evs, s.events) {
					t.Errorf("step %d: events\n got  %q\n want %q", i, l.evs, s.events)
				}
				checkMockInvariants(t, m)
			}
		})
	}
}

// checkMockInvariants checks a mock engine between requests: nothing is held, every block
// is in the free queue once, and the cache map names exactly the hashed blocks.
func checkMockInvariants(t *testing.T, m *mockEngine) {
	t.Helper()
	seen := 0
	s := m.free.sentinel()
	for b := m.free[s].next; b != s; b = m.free[b].next {
		if m.blocks[b].ref != 0 {
			t.Fatalf("block %d is queued with ref %d", b, m.blocks[b].ref)
		}
		seen++
	}
	if seen != len(m.blocks) {
		t.Fatalf("%d blocks queued, want %d", seen, len(m.blocks))
	}
	hashed := 0
	for h, first := range m.cached.all {
		for b := first; b != none; b = m.blocks[b].dup {
			if !m.blocks[b].hashed || m.blocks[b].hash != h {
				t.Fatalf("block %d is cached under %x but holds %x", b, h, m.blocks[b].hash)
			}
			hashed++
		}
	}
	if _, n := m.held(); n != hashed {
		t.Fatalf("%d hashed blocks, %d reachable from the cache map", n, hashed)
	}
	if h := m.host; h != nil {
		// The host's LRU list holds exactly the blocks its map names, within capacity.
		n := 0
		s := h.lru.sentinel()
		for i := h.lru[s].next; i != s; i = h.lru[i].next {
			if j, ok := h.byHash[h.entries[i].hash]; !ok || j != i {
				t.Fatalf("host slot %d holds %x, the map says %d", i, h.entries[i].hash, j)
			}
			n++
		}
		if n != len(h.byHash) || n > len(h.entries) || n+len(h.free) != int(h.used) {
			t.Fatalf("host: %d listed, %d mapped, %d free, %d used, capacity %d", n, len(h.byHash), len(h.free), h.used, len(h.entries))
		}
	}
}

// TestMockEngineOrphans: a block whose parent no tier holds any more is not offloaded
// (no index could place it), also when the host's eviction for it takes that parent.
func TestMockEngineOrphans(t *testing.T) {
	m := newMockEngine("w", 1, 2, 1, 4, 64)
	l := &eventLog{names: map[uint64]string{}}
	if err := m.offload(10, blockMeta{content: 1, parent: 99, hasParent: true}, l); err != nil || len(l.evs) != 0 || m.orphans != 1 {
		t.Fatalf("orphan offloaded: %v, events %q, %d orphans", err, l.evs, m.orphans)
	}
	if err := m.offload(20, blockMeta{content: 2}, l); err != nil || len(l.evs) != 1 || !m.host.holds(20) {
		t.Fatalf("root block: %v, events %q", err, l.evs)
	}
	// The host is full with 20, the parent of 30: making room evicts it.
	if err := m.offload(30, blockMeta{content: 3, parent: 20, hasParent: true}, l); err != nil || len(l.evs) != 2 || m.orphans != 2 || m.host.holds(30) {
		t.Fatalf("orphan after its parent's eviction: %v, events %q, %d orphans", err, l.evs, m.orphans)
	}
	checkMockInvariants(t, m)
	if err := m.offload(40, blockMeta{content: 4}, l); err != nil || len(l.evs) != 3 || !m.host.holds(40) {
		t.Fatalf("the freed slot is not reused: %v, events %q", err, l.evs)
	}
	checkMockInvariants(t, m)
}

func TestMockEngineCapacityExhausted(t *testing.T) {
	m := newMockEngine("w", 1, 2, 0, 4, 64)
	r := req(12, 1, 2, 3)
	if _, err := m.serve(&r, &eventLog{names: map[uint64]string{}}); err == nil {
		t.Fatal("a request larger than the cache was served")
	}
}

// refSink applies a mock engine's events to the reference model.
type refSink struct{ m *refmodel.Model }

func (s refSink) stored(w string, tier engine.Tier, parent uint64, has bool, blocks []engine.Block) error {
	pairs := make([][2]uint64, len(blocks))
	for i, b := range blocks {
		pairs[i] = [2]uint64{b.Content, b.Seq}
	}
	return s.m.StoredOn(w, int(tier), parent, has, pairs)
}

func (s refSink) removed(w string, tier engine.Tier, seq uint64) error {
	if s.m.RemovedOn(w, int(tier), []uint64{seq}) != 0 {
		return fmt.Errorf("worker %s: removed %x from tier %s, which it did not hold", w, seq, tier)
	}
	return nil
}

// tierPrefix is what mock engine m holds of a request's prefix per tier, as the index's
// Match.Tiers counts it: the leading blocks held in device memory, then held on the
// device or the host (there is no disk tier).
func (m *mockEngine) tierPrefix(blocks []uint64) [engine.NumTiers]int {
	var tiers [engine.NumTiers]int
	p := m.noneHash
	device := true
	for _, c := range blocks {
		p = engineHash(p, c)
		_, onDev := m.cached.get(p)
		if !onDev && (m.host == nil || !m.host.holds(p)) {
			break
		}
		device = device && onDev
		if device {
			tiers[0]++
		}
		tiers[1]++
	}
	tiers[2] = tiers[1]
	return tiers
}

// TestEventsTrackEngineState checks that the events alone tell the index what every
// engine holds: before each request, the reference model's per-tier prefix for every
// worker equals the prefix that worker's tiers hold, and its size equals the hashes it
// holds on each tier, with and without a host tier (a small one, so that it evicts, and
// one larger than the device).
func TestEventsTrackEngineState(t *testing.T) {
	for _, tc := range []struct{ bs, host int }{{4, 0}, {16, 0}, {4, 40}, {16, 300}} {
		t.Run(fmt.Sprintf("block size %d host %d", tc.bs, tc.host), func(t *testing.T) {
			bs := tc.bs
			w, err := Generate(GenConfig{
				Seed: 7, Requests: 600, BlockSize: bs, SystemPrompts: 4, SystemTokens: [2]int{32, 256},
				Sessions: 24, UserTokens: [2]int{4, 64}, ReplyTokens: [2]int{8, 96}, MaxContext: 1024,
			})
			if err != nil {
				t.Fatal(err)
			}
			model := refmodel.New()
			sink := refSink{model}
			fleet := make([]*mockEngine, 3)
			for i := range fleet {
				fleet[i] = newMockEngine(WorkerName(i), uint64(100+i), w.MaxBlocks+w.MaxBlocks/2, tc.host, bs, 3*bs+1)
			}
			rng := rand.New(rand.NewPCG(1, 2))
			var hostHits, loaded int
			for n, r := range w.Requests {
				tiers := map[string][engine.NumTiers]int{}
				sizes := map[string]int{}
				for _, a := range model.Query(r.Blocks) {
					tiers[a.Worker], sizes[a.Worker] = a.Tiers, a.Size
				}
				for _, m := range fleet {
					want := m.tierPrefix(r.Blocks)
					if tiers[m.name] != want {
						t.Fatalf("request %d: index tiers %v for %s, its caches hold %v blocks of the prefix", n, tiers[m.name], m.name, want)
					}
					held, _ := m.held()
					if m.host != nil {
						held += len(m.host.byHash)
					}
					if want[2] > 0 && sizes[m.name] != held {
						t.Fatalf("request %d: index size %d for %s, it holds %d hashes", n, sizes[m.name], m.name, held)
					}
				}
				out, err := fleet[rng.IntN(len(fleet))].serve(&w.Requests[n], sink)
				if err != nil {
					t.Fatalf("request %d: %v", n, err)
				}
				hostHits += out.hostHit
				loaded += out.loaded
			}
			for _, m := range fleet {
				checkMockInvariants(t, m)
			}
			if tc.host > 0 && (hostHits == 0 || loaded == 0) {
				t.Fatalf("the host tier never served a block (%d host hits, %d loaded): the test exercises nothing", hostHits, loaded)
			}
		})
	}
}
