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

func (l *eventLog) stored(_ string, parent uint64, hasParent bool, blocks []engine.Block) error {
	var b strings.Builder
	b.WriteString("stored")
	if hasParent {
		fmt.Fprintf(&b, " under %s:", l.name(parent))
	}
	for _, x := range blocks {
		b.WriteString(" " + l.name(x.Seq))
	}
	l.evs = append(l.evs, b.String())
	return nil
}

func (l *eventLog) removed(_ string, seq uint64) error {
	l.evs = append(l.evs, "removed "+l.name(seq))
	return nil
}

// req builds a request of tokens tokens whose full blocks have the given contents.
func req(tokens int, contents ...uint64) Request { return Request{Tokens: tokens, Blocks: contents} }

func TestMockEngineEvents(t *testing.T) {
	type step struct {
		r      Request
		hit    int
		reused int
		events []string
	}
	// Block size 4 tokens throughout.
	tests := []struct {
		name     string
		capacity int
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
			name:     "a request shorter than a block stores nothing",
			capacity: 2, chunk: 64,
			steps: []step{{r: req(3)}, {r: req(0)}},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			const none = 0x1234
			m := newMockEngine("w", none, tc.capacity, 4, tc.chunk)
			l := &eventLog{names: map[uint64]string{}}
			for i, s := range tc.steps {
				l.learn(none, s.r.Blocks)
				l.evs = nil
				out, err := m.serve(&s.r, l)
				if err != nil {
					t.Fatalf("step %d: %v", i, err)
				}
				if out.hit != s.hit || out.reused != s.reused {
					t.Errorf("step %d: hit %d reused %d, want %d %d", i, out.hit, out.reused, s.hit, s.reused)
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
	s := m.sentinel()
	seen := 0
	for b := m.blocks[s].next; b != s; b = m.blocks[b].next {
		if m.blocks[b].ref != 0 {
			t.Fatalf("block %d is queued with ref %d", b, m.blocks[b].ref)
		}
		seen++
	}
	if seen != int(s) {
		t.Fatalf("%d blocks queued, want %d", seen, s)
	}
	hashed := 0
	for h, first := range m.cached {
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
}

func TestMockEngineCapacityExhausted(t *testing.T) {
	m := newMockEngine("w", 1, 2, 4, 64)
	r := req(12, 1, 2, 3)
	if _, err := m.serve(&r, &eventLog{names: map[uint64]string{}}); err == nil {
		t.Fatal("a request larger than the cache was served")
	}
}

// refSink applies a mock engine's events to the reference model.
type refSink struct{ m *refmodel.Model }

func (s refSink) stored(w string, parent uint64, has bool, blocks []engine.Block) error {
	pairs := make([][2]uint64, len(blocks))
	for i, b := range blocks {
		pairs[i] = [2]uint64{b.Content, b.Seq}
	}
	return s.m.Stored(w, parent, has, pairs)
}

func (s refSink) removed(w string, seq uint64) error {
	if s.m.Removed(w, []uint64{seq}) != 0 {
		return fmt.Errorf("worker %s: removed %x, which it did not hold", w, seq)
	}
	return nil
}

// TestEventsTrackEngineState checks that the events alone tell the index what every
// engine holds: before each request, the reference model's score for every worker equals
// the prefix that worker's cache holds, and its size equals the hashes it holds.
func TestEventsTrackEngineState(t *testing.T) {
	for _, bs := range []int{4, 16} {
		t.Run(fmt.Sprintf("block size %d", bs), func(t *testing.T) {
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
				fleet[i] = newMockEngine(WorkerName(i), uint64(100+i), w.MaxBlocks+w.MaxBlocks/2, bs, 3*bs+1)
			}
			rng := rand.New(rand.NewPCG(1, 2))
			for n, r := range w.Requests {
				scores := map[string]int{}
				sizes := map[string]int{}
				for _, a := range model.Query(r.Blocks) {
					scores[a.Worker], sizes[a.Worker] = a.Score, a.Size
				}
				for _, m := range fleet {
					hit := 0
					p := m.noneHash
					for _, c := range r.Blocks {
						p = engineHash(p, c)
						if _, ok := m.cached[p]; !ok {
							break
						}
						hit++
					}
					if scores[m.name] != hit {
						t.Fatalf("request %d: index score %d for %s, its cache holds %d blocks of the prefix", n, scores[m.name], m.name, hit)
					}
					if held, _ := m.held(); hit > 0 && sizes[m.name] != held {
						t.Fatalf("request %d: index size %d for %s, it holds %d hashes", n, sizes[m.name], m.name, held)
					}
				}
				if _, err := fleet[rng.IntN(len(fleet))].serve(&w.Requests[n], sink); err != nil {
					t.Fatalf("request %d: %v", n, err)
				}
			}
			for _, m := range fleet {
				checkMockInvariants(t, m)
			}
		})
	}
}
