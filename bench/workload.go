package bench

import (
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sort"
	"sync"

	"github.com/kvindex/kvindex/engine"
	"github.com/kvindex/kvindex/internal/oplog"
	"github.com/kvindex/kvindex/internal/refmodel"
	"github.com/kvindex/kvindex/internal/replay"
)

// Workload is an op stream prepared for measurement: events converted to engine.Event
// once, query contents extracted, workers listed. It is read-only once built and may be
// shared by concurrent measurements.
type Workload struct {
	// Name describes the source (a file name or the built-in generator's parameters).
	Name string
	// Ops is the number of ops in the source stream.
	Ops int
	// Events are the stream's non-query ops in order.
	Events []engine.Event
	// Queries are the contents of the stream's non-empty queries, in order.
	Queries [][]uint64
	// Workers lists every worker the events name, in order of first appearance.
	Workers []string
	// BlockOps counts the blocks of stored events and the seqs of removed events;
	// QueryBlocks counts the blocks of the queries.
	BlockOps, QueryBlocks int64
	// Checked is the number of queries that carry an expected answer (see Verify).
	Checked int

	wid    []int32    // per event: index of its worker in Workers
	cut    []bool     // per event: a query lies between it and the event before (Coalesced)
	steps  []int32    // replay order for Verify: i >= 0 is Events[i], i < 0 is checks[^i]
	checks []oplog.Op // queries with an expected answer

	mu    sync.Mutex
	parts map[int][][]int32 // cache of partitions, see partition; guarded by mu

	flatOnce sync.Once
	flat     flatEvents // the timed passes' form of Events (flatten)
}

// flatEvent is an event as the timed passes read it: 24 bytes, its blocks or seqs a
// range of the workload's flat arrays and its worker an index into Workers. A pass reads
// a stream of these and fills one engine.Event per goroutine for each call, as an
// ingester's decoder fills one, so that what the pass streams through the caches is the
// log, as compact as the peer drivers keep theirs (SMG's driver: 48 bytes an event, its
// blocks apart), not the harness's 192-byte engine.Events with their slices allocated
// apart, which took the index's lines out of the caches: BenchmarkEvents (locked, one
// producer, the conversation trace; -benchtime 60000x, seven runs alternating the two
// forms) read 174-193 ns an event from the flat form against 195-198 ns (min-median).
// An event with a field past these (a namespace, a group, contents, a declaration, a
// cursor), or whose blocks or seqs do not fit its kind, is applied from Events.
type flatEvent struct {
	kind      engine.EventKind
	hasParent bool
	tier      engine.Tier
	full      bool // apply Events[i] itself
	wid       int32
	off, n    uint32
	parent    uint64
}

// flatEvents is the timed passes' form of Events: one flatEvent per event and the
// stored events' blocks and the others' seqs, in event order.
type flatEvents struct {
	evs    []flatEvent
	blocks []engine.Block
	seqs   []uint64
}

// flatten returns the workload's events in the timed passes' form (built once).
func (w *Workload) flatten() *flatEvents {
	w.flatOnce.Do(func() {
		f := &w.flat
		f.evs = make([]flatEvent, len(w.Events))
		for i := range w.Events {
			ev := &w.Events[i]
			fe := flatEvent{kind: ev.Kind, hasParent: ev.HasParent, tier: ev.Tier, wid: w.wid[i], parent: ev.Parent}
			switch {
			case ev.Namespace != "" || ev.Group != 0 || ev.Contents != nil || ev.Unit != 0 || ev.Groups != nil || ev.Cursor != 0 || ev.Mark != 0 ||
				ev.Blocks != nil && (ev.Seqs != nil || ev.Kind != engine.EventStored) || ev.Seqs != nil && ev.Kind == engine.EventStored ||
				len(f.blocks)+len(ev.Blocks) > math.MaxUint32 || len(f.seqs)+len(ev.Seqs) > math.MaxUint32:
				fe.full = true
			case ev.Blocks != nil:
				fe.off, fe.n = uint32(len(f.blocks)), uint32(len(ev.Blocks))
				f.blocks = append(f.blocks, ev.Blocks...)
			case ev.Seqs != nil:
				fe.off, fe.n = uint32(len(f.seqs)), uint32(len(ev.Seqs))
				f.seqs = append(f.seqs, ev.Seqs...)
			}
			f.evs[i] = fe
		}
	})
	return &w.flat
}

// event returns event i of w for Apply: Events[i] itself for an event with fields the
// flat form does not keep, else ev, filled from the flat form (ev must be the caller's
// own, used for no other event meanwhile, and have no field set but the flat form's).
func (f *flatEvents) event(w *Workload, i int32, ev *engine.Event) *engine.Event {
	fe := &f.evs[i]
	if fe.full {
		return &w.Events[i]
	}
	ev.Kind, ev.HasParent, ev.Tier, ev.Parent, ev.Worker = fe.kind, fe.hasParent, fe.tier, fe.parent, w.Workers[fe.wid]
	ev.Blocks, ev.Seqs = nil, nil
	switch {
	case fe.n == 0:
	case fe.kind == engine.EventStored:
		ev.Blocks = f.blocks[fe.off : fe.off+fe.n : fe.off+fe.n]
	default:
		ev.Seqs = f.seqs[fe.off : fe.off+fe.n : fe.off+fe.n]
	}
	return ev
}

// NewWorkload prepares ops. It copies what it keeps: ops may be reused afterwards.
func NewWorkload(name string, ops []oplog.Op) *Workload {
	w := &Workload{Name: name, Ops: len(ops)}
	ids := map[string]int32{}
	cut := false
	for i := range ops {
		op := &ops[i]
		if op.Kind == oplog.Query {
			cut = true
			if len(op.Content) > 0 {
				w.Queries = append(w.Queries, op.Content)
				w.QueryBlocks += int64(len(op.Content))
			}
			if op.HasExpect {
				w.steps = append(w.steps, ^int32(len(w.checks)))
				w.checks = append(w.checks, *op)
			}
			continue
		}
		ev := replay.Event(op)
		if ev.Kind == 0 {
			continue
		}
		w.BlockOps += int64(len(op.Blocks) + len(op.Seqs))
		id, ok := ids[op.Worker]
		if !ok {
			id = int32(len(w.Workers))
			ids[op.Worker] = id
			w.Workers = append(w.Workers, op.Worker)
		}
		// One string per worker, as an ingester names its engine's events (and as the
		// peer drivers intern names to ids before timing): comparing a worker's name with
		// itself is a pointer compare.
		ev.Worker = w.Workers[id]
		w.steps = append(w.steps, int32(len(w.Events)))
		w.Events = append(w.Events, ev)
		w.wid = append(w.wid, id)
		w.cut = append(w.cut, cut)
		cut = false
	}
	w.Checked = len(w.checks)
	return w
}

// ReadWorkload reads a JSON Lines op log (docs/oplog.md) and prepares it.
func ReadWorkload(path string) (*Workload, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	ops, err := oplog.ReadAll(f)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return NewWorkload(filepath.Base(path), ops), nil
}

// BuiltinOptions are the built-in workload's generator options: eight workers and an
// alphabet wide enough that most chains are distinct, but narrow enough that equal content
// under other prefixes occurs.
var BuiltinOptions = refmodel.RandomOptions{Workers: 8, Alphabet: 64, MaxChain: 150}

// builtinChecks is how many of the built-in workload's queries get an expected answer.
const builtinChecks = 64

// Builtin generates a workload from n ops of refmodel.RandomOps with BuiltinOptions.
// RandomOps is made for differential tests, so two kinds of its ops are dropped to make a
// benchmark of it: cleared and remove_worker (the generator resets some worker every ~30
// ops, so the index would never fill up), and the stored events the contract rejects
// (about half of the long chains carry a deliberate duplicate seq; a rejected event
// changes nothing, so dropping it changes no answer). Duplicates, re-stores elsewhere,
// removals of middles and of unknown seqs stay. Up to 64 queries, spread evenly over the
// stream, carry their exact answer from the reference model, so Verify has something to
// check.
func Builtin(seed uint64, n int) *Workload {
	all := refmodel.RandomOps(rand.New(rand.NewPCG(seed, 0x62656e6368)), n, BuiltinOptions)
	nq := 0
	for i := range all {
		if all[i].Kind == oplog.Query {
			nq++
		}
	}
	every := max(1, nq/builtinChecks)
	m := refmodel.New()
	ops := all[:0]
	q := 0
	for _, op := range all {
		switch op.Kind {
		case oplog.Cleared, oplog.RemoveWorker:
			continue
		case oplog.Query:
			if q++; q%every == 0 {
				m.Expect(&op)
			}
		default:
			if m.Apply(&op) != nil {
				continue // rejected: it would change nothing
			}
		}
		ops = append(ops, op)
	}
	name := fmt.Sprintf("builtin RandomOps(seed=%d, n=%d, workers=%d, alphabet=%d, max chain=%d)",
		seed, n, BuiltinOptions.Workers, BuiltinOptions.Alphabet, BuiltinOptions.MaxChain)
	return NewWorkload(name, ops)
}

// partition splits the events among p producers: worker i of Workers goes to producer
// i mod p, and each producer's list keeps stream order, so every worker's events are
// applied in order by one goroutine. The result is cached per p and must not be
// modified.
func (w *Workload) partition(p int) [][]int32 {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.parts == nil {
		w.parts = map[int][][]int32{}
	}
	if v, ok := w.parts[p]; ok {
		return v
	}
	parts := make([][]int32, p)
	for i, id := range w.wid {
		parts[int(id)%p] = append(parts[int(id)%p], int32(i))
	}
	w.parts[p] = parts
	return parts
}

// prefix returns how many of part's event indexes are below limit.
func prefix(part []int32, limit int) int {
	return sort.Search(len(part), func(i int) bool { return int(part[i]) >= limit })
}
