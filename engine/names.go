package engine

import (
	"hash/maphash"
	"sync"

	"github.com/kvindex/kvindex/engine/internal/worker"
)

// nameParts is the number of independently locked parts of the name table: enough that
// producers of different workers rarely share one.
const nameParts = 64

// nameTable maps worker names to live workers. It replaces a sync.Map, which costs 126
// bytes of heap per entry against 35 for this table (BenchmarkNameTable, 100,000 names):
// at 100,000 workers that was a third of each worker's overhead. Lookups take one part's
// read lock.
type nameTable struct {
	seed  maphash.Seed
	parts [nameParts]namePart
}

type namePart struct {
	mu sync.RWMutex
	m  map[string]*worker.Worker
	_  [64 - 24 - 8]byte // one part per cache line, so producers do not share a lock's line
}

func (t *nameTable) init() {
	t.seed = maphash.MakeSeed()
	for i := range t.parts {
		t.parts[i].m = map[string]*worker.Worker{}
	}
}

func (t *nameTable) part(name string) *namePart {
	return &t.parts[maphash.String(t.seed, name)%nameParts]
}

func (t *nameTable) load(name string) *worker.Worker {
	p := t.part(name)
	p.mu.RLock()
	w := p.m[name]
	p.mu.RUnlock()
	return w
}

func (t *nameTable) store(name string, w *worker.Worker) {
	p := t.part(name)
	p.mu.Lock()
	p.m[name] = w
	p.mu.Unlock()
}

// deleteIf forgets name if it still names w.
func (t *nameTable) deleteIf(name string, w *worker.Worker) {
	p := t.part(name)
	p.mu.Lock()
	if p.m[name] == w {
		delete(p.m, name)
	}
	p.mu.Unlock()
}
