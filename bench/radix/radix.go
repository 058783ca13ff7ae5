package radix

import (
	"fmt"
	"slices"
	"strings"
	"sync"

	"github.com/kvindex/kvindex/engine"
)

// The rejections of the contract. They are the engine's sentinels, so callers that branch
// with errors.Is treat both indexes alike.
var (
	// ErrParentNotFound rejects a stored event whose parent the worker does not hold.
	ErrParentNotFound = engine.ErrParentNotFound
	// ErrInvalidEvent rejects an empty worker id, the same seq twice in one stored event,
	// or a seq equal to the parent.
	ErrInvalidEvent = engine.ErrInvalidEvent
)

// holder is one worker's count of held engine hashes at a node.
type holder struct {
	wid uint32
	n   uint32
}

// node is one prefix: the path of content hashes from the root to it. Owned by the
// goroutine holding Index.mu, like everything reachable from Index.
type node struct {
	parent   *node
	content  uint64
	children map[uint64]*node // nil while the node has no children
	holders  []holder         // nil while no worker holds the node
}

// worker is one cache owner.
type worker struct {
	name string
	wid  uint32
	seqs map[uint64]*node // engine hash -> node it is held at
}

// Stats is a snapshot of the index's size and counters.
type Stats struct {
	// Workers is the number of known workers.
	Workers int
	// Blocks is the number of (worker, engine hash) pairs held: the sum of sizes.
	Blocks int64
	// Nodes is the number of tree nodes, the root excluded.
	Nodes int64
	// SkippedRemovals counts removed hashes the worker did not hold, and the hashes of
	// removals for unknown workers.
	SkippedRemovals uint64
}

// Index is the mutex-guarded radix tree. The zero value is not usable; call New. All
// methods are safe for concurrent use.
type Index struct {
	mu sync.Mutex
	// Everything below is owned by the goroutine holding mu.
	root    node
	byName  map[string]*worker
	byID    []*worker // wid -> worker, nil for a free id
	free    []uint32  // free wids
	blocks  int64
	nodes   int64
	skipped uint64
	// Scratch reused across calls.
	mark    []uint32 // per wid: the stamp of the last node it was seen holding
	stamp   uint32
	active  []uint32
	scratch []uint64
}

// New returns an empty index.
func New() *Index {
	return &Index{byName: map[string]*worker{}}
}

// Apply applies one engine event (the tree has no namespaces: an event in a non-default
// namespace is rejected as invalid).
func (x *Index) Apply(ev *engine.Event) error {
	if ev.Namespace != "" {
		return fmt.Errorf("radix: no namespaces (event for %q): %w", ev.Namespace, ErrInvalidEvent)
	}
	switch ev.Kind {
	case engine.EventStored:
		return x.store(ev.Worker, ev.Parent, ev.HasParent, ev.Blocks)
	case engine.EventRemoved:
		return x.Remove(ev.Worker, ev.Seqs...)
	case engine.EventCleared:
		return x.Clear(ev.Worker)
	case engine.EventRemoveWorker:
		return x.RemoveWorker(ev.Worker)
	}
	return fmt.Errorf("radix: unknown event kind %d: %w", ev.Kind, ErrInvalidEvent)
}

// Store applies a stored event for a chain of root blocks: blocks[0] is at position 0 and
// each next block hangs under the previous one.
func (x *Index) Store(worker string, blocks []engine.Block) error {
	return x.store(worker, 0, false, blocks)
}

// StoreUnder applies a stored event whose first block hangs under the block the worker
// holds as parent. It returns ErrParentNotFound, and changes nothing, if the worker does
// not hold parent.
func (x *Index) StoreUnder(worker string, parent uint64, blocks []engine.Block) error {
	return x.store(worker, parent, true, blocks)
}

func (x *Index) store(name string, parent uint64, hasParent bool, blocks []engine.Block) error {
	if name == "" {
		return fmt.Errorf("radix: empty worker id: %w", ErrInvalidEvent)
	}
	if len(blocks) == 0 {
		return nil // never an error, and the worker does not become known
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	w := x.byName[name]
	at := &x.root
	if hasParent {
		// The parent check comes first: an event faulty in both ways is ErrParentNotFound.
		var p *node
		if w != nil {
			p = w.seqs[parent]
		}
		if p == nil {
			return fmt.Errorf("radix: worker %q does not hold %d: %w", name, parent, ErrParentNotFound)
		}
		at = p
	}
	if !x.validLocked(parent, hasParent, blocks) {
		return fmt.Errorf("radix: a seq appears twice in one event or equals the parent: %w", ErrInvalidEvent)
	}
	if w == nil {
		w = x.addWorkerLocked(name)
	}
	for _, b := range blocks {
		at = x.childLocked(at, b.Content)
		old := w.seqs[b.Seq]
		if old == at {
			continue // the same prefix again: a no-op
		}
		// Count the new node before releasing the old one, so that the release can never
		// free the path this event is walking.
		at.inc(w.wid)
		w.seqs[b.Seq] = at
		if old != nil {
			x.decLocked(old, w.wid) // last write wins
		} else {
			x.blocks++
		}
	}
	return nil
}

// validLocked reports whether no seq appears twice and none equals the parent.
func (x *Index) validLocked(parent uint64, hasParent bool, blocks []engine.Block) bool {
	if len(blocks) <= 16 {
		for i := range blocks {
			if hasParent && blocks[i].Seq == parent {
				return false
			}
			for j := i + 1; j < len(blocks); j++ {
				if blocks[i].Seq == blocks[j].Seq {
					return false
				}
			}
		}
		return true
	}
	s := x.scratch[:0]
	for _, b := range blocks {
		if hasParent && b.Seq == parent {
			return false
		}
		s = append(s, b.Seq)
	}
	slices.Sort(s)
	x.scratch = s
	for i := 1; i < len(s); i++ {
		if s[i] == s[i-1] {
			return false
		}
	}
	return true
}

func (x *Index) addWorkerLocked(name string) *worker {
	var wid uint32
	if n := len(x.free); n > 0 {
		wid = x.free[n-1]
		x.free = x.free[:n-1]
	} else {
		wid = uint32(len(x.byID))
		x.byID = append(x.byID, nil)
	}
	w := &worker{name: name, wid: wid, seqs: map[uint64]*node{}}
	x.byID[wid] = w
	x.byName[name] = w
	return w
}

// childLocked returns p's child for content c, creating it if needed.
func (x *Index) childLocked(p *node, c uint64) *node {
	if n := p.children[c]; n != nil {
		return n
	}
	if p.children == nil {
		p.children = make(map[uint64]*node, 1)
	}
	n := &node{parent: p, content: c}
	p.children[c] = n
	x.nodes++
	return n
}

// inc adds one to wid's count at n.
func (n *node) inc(wid uint32) {
	for i := range n.holders {
		if n.holders[i].wid == wid {
			n.holders[i].n++
			return
		}
	}
	n.holders = append(n.holders, holder{wid: wid, n: 1})
}

// decLocked subtracts one from wid's count at n and frees n, and then its ancestors, for
// as long as they are neither held nor have children.
func (x *Index) decLocked(n *node, wid uint32) {
	for i := range n.holders {
		h := &n.holders[i]
		if h.wid != wid {
			continue
		}
		if h.n--; h.n == 0 {
			last := len(n.holders) - 1
			n.holders[i] = n.holders[last]
			n.holders = n.holders[:last]
			if last == 0 {
				n.holders = nil
			}
		}
		break
	}
	for n != &x.root && len(n.holders) == 0 && len(n.children) == 0 {
		p := n.parent
		delete(p.children, n.content)
		if len(p.children) == 0 {
			p.children = nil
		}
		n.parent = nil
		x.nodes--
		n = p
	}
}

// Remove drops the given engine hashes from a worker. Hashes it does not hold, and an
// unknown worker, are skipped (counted in Stats.SkippedRemovals). Removal does not
// cascade: blocks stored under a removed one stay held.
func (x *Index) Remove(worker string, seqs ...uint64) error {
	if worker == "" {
		return fmt.Errorf("radix: empty worker id: %w", ErrInvalidEvent)
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	w := x.byName[worker]
	if w == nil {
		x.skipped += uint64(len(seqs))
		return nil
	}
	for _, s := range seqs {
		n := w.seqs[s]
		if n == nil {
			x.skipped++
			continue
		}
		delete(w.seqs, s)
		x.blocks--
		x.decLocked(n, w.wid)
	}
	return nil
}

// Clear drops every block of a worker; it stays known with size 0. An unknown worker is a
// no-op.
func (x *Index) Clear(worker string) error {
	if worker == "" {
		return fmt.Errorf("radix: empty worker id: %w", ErrInvalidEvent)
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	if w := x.byName[worker]; w != nil {
		x.clearLocked(w)
	}
	return nil
}

// RemoveWorker forgets a worker and all its blocks. An unknown worker is a no-op.
func (x *Index) RemoveWorker(worker string) error {
	if worker == "" {
		return fmt.Errorf("radix: empty worker id: %w", ErrInvalidEvent)
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	w := x.byName[worker]
	if w == nil {
		return nil
	}
	x.clearLocked(w)
	delete(x.byName, worker)
	x.byID[w.wid] = nil
	x.free = append(x.free, w.wid)
	return nil
}

func (x *Index) clearLocked(w *worker) {
	for _, n := range w.seqs {
		x.decLocked(n, w.wid)
	}
	x.blocks -= int64(len(w.seqs))
	w.seqs = map[uint64]*node{}
}

// FindMatches returns, appended to dst, every worker whose score for the query's content
// hashes is at least 1 (the number of leading query blocks whose prefixes it holds) and
// its size. Matches are ordered by score (highest first), then worker id. An empty query
// matches nothing.
func (x *Index) FindMatches(content []uint64, dst []engine.Match) []engine.Match {
	if len(content) == 0 {
		return dst
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	n := x.root.children[content[0]]
	if n == nil {
		return dst
	}
	start := len(dst)
	if len(x.mark) < len(x.byID) {
		x.mark = make([]uint32, len(x.byID)+len(x.byID)/4+1)
		x.stamp = 0
	}
	act := x.active[:0]
	for _, h := range n.holders {
		act = append(act, h.wid)
	}
	d := 1
	for ; d < len(content) && len(act) > 0; d++ {
		if n = n.children[content[d]]; n == nil {
			break
		}
		if x.stamp++; x.stamp == 0 {
			clear(x.mark)
			x.stamp = 1
		}
		for _, h := range n.holders {
			x.mark[h.wid] = x.stamp
		}
		keep := act[:0]
		for _, wid := range act {
			if x.mark[wid] == x.stamp {
				keep = append(keep, wid)
			} else {
				dst = x.appendMatch(dst, wid, d)
			}
		}
		act = keep
	}
	for _, wid := range act {
		dst = x.appendMatch(dst, wid, d)
	}
	x.active = act
	slices.SortFunc(dst[start:], func(a, b engine.Match) int {
		if a.Score != b.Score {
			return b.Score - a.Score
		}
		return strings.Compare(a.Worker, b.Worker)
	})
	return dst
}

func (x *Index) appendMatch(dst []engine.Match, wid uint32, score int) []engine.Match {
	w := x.byID[wid]
	return append(dst, engine.Match{Worker: w.name, Score: score, Size: len(w.seqs), Tiers: [engine.NumTiers]int{score, score, score}})
}

// Size returns how many distinct engine hashes a worker holds, and whether it is known.
func (x *Index) Size(worker string) (int, bool) {
	x.mu.Lock()
	defer x.mu.Unlock()
	w := x.byName[worker]
	if w == nil {
		return 0, false
	}
	return len(w.seqs), true
}

// Stats returns a snapshot of the index's size and counters.
func (x *Index) Stats() Stats {
	x.mu.Lock()
	defer x.mu.Unlock()
	return Stats{Workers: len(x.byName), Blocks: x.blocks, Nodes: x.nodes, SkippedRemovals: x.skipped}
}
