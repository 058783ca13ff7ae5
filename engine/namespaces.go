package engine

import (
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvindex/kvindex/engine/internal/worker"
)

// Namespaces. A namespace name (Event.Namespace: a model, LoRA adapter and cache salt,
// escaped) is interned to a 32-bit id the first time a stored event or a prediction
// names it; blocks, predictions and queries carry the id. Names are a client's to choose
// (a request's cache salt reaches the engines' events, and Predict directly), so the
// table is bounded and swept:
//
//   - a name is at most MaxNamespaceLen bytes, and the table's accounted bytes
//     (len(name) + nsEntryCost a name: the name, its entry and its share of the map) at
//     most Config.NamespaceBytes. A stored event that would intern past the bound is
//     rejected with ErrInvalidEvent, and so is a prediction past half of it, so that
//     predictions leave events room; both count in Stats.NamespacesRefused.
//   - a sweep drops every name that no block and no live prediction uses (and that no
//     event, prediction or query named since the sweep began). It runs when the table
//     has doubled since the last sweep left it (and holds a quarter of the bound) or a
//     name was refused, at most once per nsSweepEvery by Config.Clock, in the first
//     Apply, ApplyBatch or Predict call that finds it due, after that call's work
//     (outside every lock). It costs a pass over the records of the workers that hold
//     blocks outside the default namespace (the others are skipped at one pointer test).
//     Snapshots write only the names their blocks use.
//
// Why a dropped name is never in use: every event finds or interns its namespace under
// its worker's lock, and applies under the same hold; a prediction does both under the
// prediction lock; every find stamps the name with the sweep epoch. A sweep first
// advances the epoch, then reads each worker under its lock and the predictions under
// theirs. An event whose worker the sweep read before it applied found its name after
// the epoch advanced, so the name carries the sweep's epoch and is kept; any other
// event's blocks were seen. A dropped name's id is reused only after the next sweep
// (nsSweepEvery later at the least), so a query that resolved it before the drop never
// sees another name's blocks under it unless it runs that long. A worker's segments
// name their namespace by its id: by the time an id is dropped no segment holds it, and
// when it comes back for another name, that name's segments take it.

// nsEntryCost is the bytes an interned name is accounted beside its own: the nsEntry
// (40 bytes), the sync.Map's entry and node (about 80).
const nsEntryCost = 128

// nsSweepEvery is the shortest interval between two sweeps.
const nsSweepEvery = time.Second

// MaxNamespaceBytes bounds Config.NamespaceBytes.
const MaxNamespaceBytes = 1 << 32

// nsTable is the engine's namespace table. Finds read m without a lock; creation, drops
// and the ids are under mu; a sweep holds sweepMu (so does a snapshot's capture, which
// must see every id its blocks use named).
type nsTable struct {
	m     sync.Map // name -> *nsEntry
	epoch atomic.Uint64
	bytes atomic.Int64 // accounted bytes of the names in m
	count atomic.Int64

	// want says a sweep is due (bytes passed trigger, or a name was refused).
	want    atomic.Bool
	trigger atomic.Int64
	dropped atomic.Uint64 // names dropped, in all
	refused atomic.Uint64 // names refused for the bound

	mu      sync.Mutex
	next    uint32   // the next id never given out (0 is the default namespace)
	cooling []uint32 // ids the last sweep dropped: free after the next one
	free    []uint32 // ids free to reuse

	sweepMu   sync.Mutex
	swept     bool  // a sweep ran; under sweepMu
	lastSweep int64 // Config.Clock nanoseconds of the last sweep's end; under sweepMu
}

// nsEntry is one interned name.
type nsEntry struct {
	name  string
	id    uint32
	stamp atomic.Uint64 // the epoch of the last find
}

// The ways namespaceID may create a namespace it does not know.
type nsCreate uint8

const (
	nsFind      nsCreate = iota // never: 0 when the name has no id
	nsIntern                    // an event's namespace or a snapshot's: up to the bound
	nsPredicted                 // a prediction's: up to half the bound
)

func (t *nsTable) init(bound int64) {
	t.next = 1
	t.trigger.Store(bound / 4)
}

// namespaceID returns the id of a non-empty namespace name, interning it as create
// says; 0 means the name has no id (with nsFind: nothing uses it) or the bound leaves
// no room for it (counted in Stats.NamespacesRefused).
func (e *Engine) namespaceID(name string, create nsCreate) uint32 {
	t := &e.ns
	if v, ok := t.m.Load(name); ok {
		x := v.(*nsEntry)
		if ep := t.epoch.Load(); x.stamp.Load() != ep {
			x.stamp.Store(ep)
		}
		return x.id
	}
	if create == nsFind || len(name) > MaxNamespaceLen {
		return 0
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if v, ok := t.m.Load(name); ok {
		x := v.(*nsEntry)
		x.stamp.Store(t.epoch.Load())
		return x.id
	}
	cost := int64(len(name) + nsEntryCost)
	bound := e.cfg.NamespaceBytes
	if create == nsPredicted {
		bound /= 2
	}
	var id uint32
	switch n := len(t.free); {
	case t.bytes.Load()+cost > bound:
	case n > 0:
		id, t.free = t.free[n-1], t.free[:n-1]
	case t.next != 0: // 0 once every id was given out
		id = t.next
		t.next++
	}
	if id == 0 {
		t.refused.Add(1)
		t.want.Store(true)
		return 0
	}
	x := &nsEntry{name: strings.Clone(name), id: id} // see lookupOrCreate
	x.stamp.Store(t.epoch.Load())
	t.m.Store(x.name, x)
	t.count.Add(1)
	if t.bytes.Add(cost) > t.trigger.Load() {
		t.want.Store(true)
	}
	return id
}

// eventNamespace returns the id of a stored event's namespace, interning a new one; it
// rejects the event (ErrInvalidEvent) when the table has no room for the name. Called
// under the event's worker's lock (see the comment at the top).
func (e *Engine) eventNamespace(name string) (uint32, error) {
	if name == "" {
		return 0, nil
	}
	if id := e.namespaceID(name, nsIntern); id != 0 {
		return id, nil
	}
	e.rejInvalid.Add(1)
	return 0, fmt.Errorf("%w (Config.NamespaceBytes %d)", ErrNamespaceTableFull, e.cfg.NamespaceBytes)
}

// maybeSweepNamespaces runs a sweep when one is due: one atomic load otherwise. Called
// by Apply, ApplyBatch and Predict once they hold no lock.
func (e *Engine) maybeSweepNamespaces() {
	if e.ns.want.Load() {
		e.sweepNamespaces(false)
	}
}

// sweepNamespaces drops the names nothing uses (see the comment at the top), unless
// another sweep is running or, without force, the last ended less than nsSweepEvery
// ago. It reports whether it ran.
func (e *Engine) sweepNamespaces(force bool) bool {
	t := &e.ns
	if !t.sweepMu.TryLock() {
		return false
	}
	defer t.sweepMu.Unlock()
	now := e.now()
	if !force && t.swept && now-t.lastSweep < int64(nsSweepEvery) {
		return false
	}
	t.want.Store(false)
	epoch := t.epoch.Add(1)
	used := e.namespacesInUse()
	t.mu.Lock()
	t.free = append(t.free, t.cooling...)
	t.cooling = t.cooling[:0]
	t.m.Range(func(k, v any) bool {
		x := v.(*nsEntry)
		if used[x.id] || x.stamp.Load() == epoch {
			return true
		}
		t.m.Delete(k)
		t.cooling = append(t.cooling, x.id)
		t.count.Add(-1)
		t.bytes.Add(-int64(len(x.name) + nsEntryCost))
		t.dropped.Add(1)
		return true
	})
	t.trigger.Store(min(e.cfg.NamespaceBytes, max(e.cfg.NamespaceBytes/4, 2*t.bytes.Load())))
	t.mu.Unlock()
	t.swept, t.lastSweep = true, e.now()
	return true
}

// namespacesInUse returns the ids that some block of some worker (every tier, every
// group, ghosts included) or some live prediction uses, each worker read under its lock
// and the predictions under theirs.
func (e *Engine) namespacesInUse() map[uint32]bool {
	used := map[uint32]bool{}
	e.eachLiveWorker(func(wk *worker.Worker) { wk.NamespacesInUse(used) })
	p := &e.preds
	p.Lock()
	p.Namespaces(e.now(), used) // the expired go now, and their names with them
	p.Unlock()
	return used
}

// namespaceNames returns the interned names and their ids.
func (e *Engine) namespaceNames() map[uint32]string {
	out := map[uint32]string{}
	e.ns.m.Range(func(_, v any) bool {
		x := v.(*nsEntry)
		out[x.id] = x.name
		return true
	})
	return out
}
