package refmodel

import (
	"errors"
	"sort"

	"github.com/kvindex/kvindex/internal/oplog"
)

// The rejections of the contract.
var (
	ErrParentNotFound = errors.New("refmodel: parent not found")
	ErrInvalidEvent   = errors.New("refmodel: invalid event")
)

type nodeKey struct {
	parent  uint32 // 0 is the virtual root above position 0
	content uint64
}

// NumTiers is the number of storage tiers (device, host, disk, fastest first); events
// without a tier are device events.
const NumTiers = 3

// worker is one worker's state: per KV-cache group, per tier, engine hash -> the trie
// node of the block's prefix (its end). A worker without a declaration has one group,
// full with span 1 (rules nil).
type worker struct {
	rules  []groupRule // nil: undeclared (one full group of span 1)
	groups []groupBlocks
}

// groupBlocks is one group's blocks: per tier, seq -> node.
type groupBlocks [NumTiers]map[uint64]uint32

func newGroupBlocks() groupBlocks {
	var g groupBlocks
	for t := range g {
		g[t] = map[uint64]uint32{}
	}
	return g
}

func newWorker(rules []groupRule) *worker {
	w := &worker{rules: rules, groups: make([]groupBlocks, max(1, len(rules)))}
	for i := range w.groups {
		w.groups[i] = newGroupBlocks()
	}
	return w
}

// span is group g's block size in units (1 for an undeclared worker).
func (w *worker) span(g int) int {
	if w.rules == nil {
		return 1
	}
	return w.rules[g].span
}

// size counts the (group, tier, seq) entries the worker holds.
func (w *worker) size() int {
	n := 0
	for _, g := range w.groups {
		for _, b := range g {
			n += len(b)
		}
	}
	return n
}

// Model is the reference index.
type Model struct {
	nodes   map[nodeKey]uint32
	next    uint32
	depth   []uint32 // per node id, its depth in units (the virtual root, 0, is at 0)
	workers map[string]*worker
	// tiered is set once an event of another tier than the device's was applied: the
	// answers then carry per-tier lengths (Expect).
	tiered bool
	predictionState
}

// New returns an empty model.
func New() *Model {
	return &Model{nodes: map[nodeKey]uint32{}, next: 1, depth: []uint32{0}, workers: map[string]*worker{}}
}

func (m *Model) intern(parent uint32, c uint64) uint32 {
	k := nodeKey{parent, c}
	if n, ok := m.nodes[k]; ok {
		return n
	}
	n := m.next
	m.next++
	m.nodes[k] = n
	m.depth = append(m.depth, m.depth[parent]+1)
	return n
}

// Stored applies a device-tier stored event: blocks are (content, seq) pairs chained
// under parent (a root chain when hasParent is false).
func (m *Model) Stored(name string, parent uint64, hasParent bool, blocks [][2]uint64) error {
	return m.StoredOn(name, 0, parent, hasParent, blocks)
}

// StoredOn applies a stored event on tier (0 device, 1 host, 2 disk). The parent is
// looked up on the event's tier first, then on the others, fastest first.
func (m *Model) StoredOn(name string, tier int, parent uint64, hasParent bool, blocks [][2]uint64) error {
	return m.StoredIn(name, 0, tier, parent, hasParent, blocks, nil)
}

// StoredIn applies a stored event of a KV-cache group on tier. contents, when not nil,
// gives each block's list of contents (a group spanning several units); otherwise each
// block's content is blocks[i][0]. A group the worker has not declared (any group but
// 0 of an undeclared worker) and a block whose content is not exactly the group's span
// are ErrInvalidEvent, decided before the parent is looked up; the parent is looked up
// in the event's group alone.
func (m *Model) StoredIn(name string, group, tier int, parent uint64, hasParent bool, blocks [][2]uint64, contents [][]uint64) error {
	if len(blocks) == 0 {
		return nil // whatever the parent and the group: an unknown worker stays unknown
	}
	if tier < 0 || tier >= NumTiers {
		return ErrInvalidEvent
	}
	w := m.workers[name]
	if !declared(w, group) {
		return ErrInvalidEvent
	}
	span := 1
	if w != nil {
		span = w.span(group)
	}
	content := func(i int) []uint64 {
		if contents != nil {
			return contents[i]
		}
		return blocks[i][:1]
	}
	for i := range blocks {
		if len(content(i)) != span {
			return ErrInvalidEvent
		}
	}
	var at uint32
	if hasParent {
		if w == nil {
			return ErrParentNotFound
		}
		g := w.groups[group]
		n, ok := g[tier][parent]
		for t := 0; !ok && t < NumTiers; t++ {
			n, ok = g[t][parent]
		}
		if !ok {
			return ErrParentNotFound
		}
		at = n
	}
	seen := map[uint64]bool{}
	for _, b := range blocks {
		if seen[b[1]] || (hasParent && b[1] == parent) {
			return ErrInvalidEvent
		}
		seen[b[1]] = true
	}
	if w == nil {
		w = newWorker(nil)
		m.workers[name] = w
	}
	if tier != 0 {
		m.tiered = true
	}
	stored := map[uint32]bool{}
	for i, b := range blocks {
		for _, c := range content(i) {
			at = m.intern(at, c)
		}
		w.groups[group][tier][b[1]] = at // a re-store with the same prefix is the same node: a no-op
		stored[at] = true
	}
	// A prediction whose last block's node the event stored on the device is confirmed
	// (predictions are of workers without groups: a declared worker's events leave them).
	if tier == 0 && w.rules == nil {
		m.endPredictions(name, func(p prediction) bool { return stored[m.node(p.content, len(p.content))] })
	}
	return nil
}

// declared reports whether w (nil: unknown) has group g.
func declared(w *worker, g int) bool {
	if w == nil || w.rules == nil {
		return g == 0
	}
	return g >= 0 && g < len(w.rules)
}

// Removed drops the given seqs from a worker's device tier and returns how many it did
// not hold.
func (m *Model) Removed(name string, seqs []uint64) (skipped int) {
	return m.RemovedOn(name, 0, seqs)
}

// RemovedOn drops the given seqs from one tier of a worker (its copies on other tiers
// stay) and returns how many that tier did not hold. An unknown tier skips them all.
func (m *Model) RemovedOn(name string, tier int, seqs []uint64) (skipped int) {
	return m.RemovedIn(name, 0, tier, seqs)
}

// RemovedIn is RemovedOn in one KV-cache group; a group the worker has not declared
// skips every seq.
func (m *Model) RemovedIn(name string, group, tier int, seqs []uint64) (skipped int) {
	w := m.workers[name]
	if w == nil || tier < 0 || tier >= NumTiers || !declared(w, group) {
		return len(seqs)
	}
	blocks := w.groups[group][tier]
	if tier != 0 {
		m.tiered = true
	}
	if tier == 0 && w.rules == nil {
		// A prediction one of whose blocks' nodes the worker holds under a removed seq
		// is contradicted.
		removed := map[uint32]bool{}
		for _, s := range seqs {
			if n, ok := blocks[s]; ok {
				removed[n] = true
			}
		}
		m.endPredictions(name, func(p prediction) bool {
			for i := 1; i <= len(p.content); i++ {
				if n := m.node(p.content, i); n != 0 && removed[n] {
					return true
				}
			}
			return false
		})
	}
	for _, s := range seqs {
		if _, ok := blocks[s]; ok {
			delete(blocks, s)
		} else {
			skipped++
		}
	}
	return skipped
}

// Copied makes a worker hold, on tier (host or disk), copies of the blocks it holds on
// another tier under seqs: each at the node of the fastest other tier's block. A seq no
// other tier holds is skipped (counted in the result) unless tier holds it already. A
// device tier is ErrInvalidEvent; an unknown worker skips every seq.
func (m *Model) Copied(name string, tier int, seqs []uint64) (skipped int, err error) {
	return m.CopiedIn(name, 0, tier, seqs)
}

// CopiedIn is Copied in one KV-cache group; a group the worker has not declared skips
// every seq.
func (m *Model) CopiedIn(name string, group, tier int, seqs []uint64) (skipped int, err error) {
	if tier <= 0 || tier >= NumTiers {
		return 0, ErrInvalidEvent
	}
	w := m.workers[name]
	if w == nil || !declared(w, group) {
		return len(seqs), nil
	}
	m.tiered = true
	g := w.groups[group]
	for _, s := range seqs {
		found := false
		for t := 0; t < NumTiers && !found; t++ {
			if n, ok := g[t][s]; ok && t != tier {
				g[tier][s], found = n, true
			}
		}
		if _, held := g[tier][s]; !found && !held {
			skipped++
		}
	}
	return skipped, nil
}

// Cleared drops every block of a known worker, of every group on every tier; it stays
// known with size 0 and keeps its groups.
func (m *Model) Cleared(name string) {
	m.endPredictions(name, func(prediction) bool { return true })
	if w := m.workers[name]; w != nil {
		*w = *newWorker(w.rules)
	}
}

// RemoveWorker forgets a worker, its groups too.
func (m *Model) RemoveWorker(name string) {
	m.endPredictions(name, func(prediction) bool { return true })
	delete(m.workers, name)
}

// Answer is one worker's result.
type Answer struct {
	Worker string
	Score  int
	Size   int
	// Predicted is the part of Score that only predictions account for.
	Predicted int
	// Tiers gives per tier t the number of leading blocks held on tier t or a faster
	// one; Score is Tiers[NumTiers-1]. Predicted blocks count as device blocks.
	Tiers [NumTiers]int
}

// Expect sets a query op's expected answer (Expect, Sizes, HasExpect) to the model's,
// and its per-tier lengths (Tiers) once the model has seen an event of a tier other
// than the device's.
func (m *Model) Expect(op *oplog.Op) {
	op.Expect, op.Sizes, op.HasExpect = map[string]int{}, map[string]int{}, true
	op.Tiers = nil
	if m.tiered {
		op.Tiers = map[string][3]int{}
	}
	for _, a := range m.Query(op.Content) {
		op.Expect[a.Worker], op.Sizes[a.Worker] = a.Score, a.Size
		if m.tiered {
			op.Tiers[a.Worker] = a.Tiers
		}
	}
}

// Query returns every worker with score >= 1, sorted by score descending, then name.
func (m *Model) Query(content []uint64) []Answer {
	path := make([]uint32, 0, len(content))
	var at uint32
	for _, c := range content {
		n, ok := m.nodes[nodeKey{at, c}]
		if !ok {
			break
		}
		path = append(path, n)
		at = n
	}
	var out []Answer
	pred := m.predicted(content)
	for name, w := range m.workers {
		// Per tier t, the score counting the blocks held on tier t or a faster one.
		var tiers [NumTiers]int
		for t := range NumTiers {
			tiers[t] = w.score(path, t)
		}
		score := tiers[NumTiers-1]
		a := Answer{Worker: name, Score: score, Size: w.size(), Tiers: tiers}
		if p := pred[name]; p > score {
			a.Score, a.Predicted = p, p-score
		}
		for t := range a.Tiers {
			a.Tiers[t] = max(a.Tiers[t], pred[name])
		}
		if a.Score > 0 {
			out = append(out, a)
		}
	}
	for name, p := range pred {
		if _, known := m.workers[name]; !known && p > 0 {
			out = append(out, Answer{Worker: name, Score: p, Predicted: p, Tiers: [NumTiers]int{p, p, p}})
		}
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Score != out[j].Score {
			return out[i].Score > out[j].Score
		}
		return out[i].Worker < out[j].Worker
	})
	return out
}

// Size returns how many distinct seqs a worker holds, and whether it is known.
func (m *Model) Size(name string) (int, bool) {
	w := m.workers[name]
	if w == nil {
		return 0, false
	}
	return w.size(), true
}

// Holding is one entry a worker holds: an engine hash in a KV-cache group (0 for a
// worker that declared none), on a tier, at a depth (its prefix's length in units).
type Holding struct {
	Group, Tier int
	Seq         uint64
	Depth       int
	// Node names the prefix (a trie node of this model): equal nodes, equal prefixes.
	Node uint32
}

// Held returns what a worker holds, sorted by group, tier and seq (nil for an unknown
// worker).
func (m *Model) Held(name string) []Holding {
	w := m.workers[name]
	if w == nil {
		return nil
	}
	var out []Holding
	for g := range w.groups {
		for t := range w.groups[g] {
			for seq, n := range w.groups[g][t] {
				out = append(out, Holding{Group: g, Tier: t, Seq: seq, Depth: int(m.depth[n]), Node: n})
			}
		}
	}
	sort.Slice(out, func(i, j int) bool {
		a, b := out[i], out[j]
		if a.Group != b.Group {
			return a.Group < b.Group
		}
		if a.Tier != b.Tier {
			return a.Tier < b.Tier
		}
		return a.Seq < b.Seq
	})
	return out
}

// Workers returns the known workers' names, sorted.
func (m *Model) Workers() []string {
	out := make([]string, 0, len(m.workers))
	for n := range m.workers {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}

// Blocks returns the total number of (worker, seq) blocks held.
func (m *Model) Blocks() int {
	n := 0
	for _, w := range m.workers {
		n += w.size()
	}
	return n
}
