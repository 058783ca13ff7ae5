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

type worker struct {
	blocks map[uint64]uint32 // seq -> node
}

// Model is the reference index.
type Model struct {
	nodes   map[nodeKey]uint32
	next    uint32
	workers map[string]*worker
	predictionState
}

// New returns an empty model.
func New() *Model {
	return &Model{nodes: map[nodeKey]uint32{}, next: 1, workers: map[string]*worker{}}
}

func (m *Model) intern(parent uint32, c uint64) uint32 {
	k := nodeKey{parent, c}
	if n, ok := m.nodes[k]; ok {
		return n
	}
	n := m.next
	m.next++
	m.nodes[k] = n
	return n
}

// Stored applies a stored event: blocks are (content, seq) pairs chained under parent
// (a root chain when hasParent is false).
func (m *Model) Stored(name string, parent uint64, hasParent bool, blocks [][2]uint64) error {
	if len(blocks) == 0 {
		return nil
	}
	w := m.workers[name]
	var at uint32
	if hasParent {
		if w == nil {
			return ErrParentNotFound
		}
		n, ok := w.blocks[parent]
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
		w = &worker{blocks: map[uint64]uint32{}}
		m.workers[name] = w
	}
	stored := map[uint32]bool{}
	for _, b := range blocks {
		at = m.intern(at, b[0])
		w.blocks[b[1]] = at // a re-store with the same prefix is the same node: a no-op
		stored[at] = true
	}
	// A prediction whose last block's node the event stored is confirmed.
	m.endPredictions(name, func(p prediction) bool { return stored[m.node(p.content, len(p.content))] })
	return nil
}

// Removed drops the given seqs from a worker and returns how many it did not hold.
func (m *Model) Removed(name string, seqs []uint64) (skipped int) {
	w := m.workers[name]
	if w == nil {
		return len(seqs)
	}
	// A prediction one of whose blocks' nodes the worker holds under a removed seq is
	// contradicted.
	removed := map[uint32]bool{}
	for _, s := range seqs {
		if n, ok := w.blocks[s]; ok {
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
	for _, s := range seqs {
		if _, ok := w.blocks[s]; ok {
			delete(w.blocks, s)
		} else {
			skipped++
		}
	}
	return skipped
}

// Cleared drops every block of a known worker; it stays known with size 0.
func (m *Model) Cleared(name string) {
	m.endPredictions(name, func(prediction) bool { return true })
	if w := m.workers[name]; w != nil {
		w.blocks = map[uint64]uint32{}
	}
}

// RemoveWorker forgets a worker.
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
}

// Expect sets a query op's expected answer (Expect, Sizes, HasExpect) to the model's.
func (m *Model) Expect(op *oplog.Op) {
	op.Expect, op.Sizes, op.HasExpect = map[string]int{}, map[string]int{}, true
	for _, a := range m.Query(op.Content) {
		op.Expect[a.Worker], op.Sizes[a.Worker] = a.Score, a.Size
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
		held := map[uint32]bool{}
		for _, n := range w.blocks {
			held[n] = true
		}
		score := 0
		for score < len(path) && held[path[score]] {
			score++
		}
		a := Answer{Worker: name, Score: score, Size: len(w.blocks)}
		if p := pred[name]; p > score {
			a.Score, a.Predicted = p, p-score
		}
		if a.Score > 0 {
			out = append(out, a)
		}
	}
	for name, p := range pred {
		if _, known := m.workers[name]; !known && p > 0 {
			out = append(out, Answer{Worker: name, Score: p, Predicted: p})
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
	return len(w.blocks), true
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
		n += len(w.blocks)
	}
	return n
}
