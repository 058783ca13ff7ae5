package engine

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"
	"unsafe"

	"github.com/kvindex/kvindex/engine/internal/chain"
	"github.com/kvindex/kvindex/internal/oplog"
	"github.com/kvindex/kvindex/internal/table"
	"github.com/kvindex/kvindex/shard"
)

// BenchmarkReplayCeiling bounds what any arrangement of goroutines can get out of this
// engine's bookkeeping on a replay of an op log (by default the trace-driven conformance
// log; KVINDEX_OPS names another). Every variant runs in one goroutine, with no hand-off,
// no lock contention and no barrier, so each is a lower bound on the CPU time its work
// needs; all run in the same process, one after the other, in every iteration.
//
//   - exact: the LockedIndex engine, the whole exact work (per-worker tables, index,
//     queries).
//   - exact-worker-state: the same with the index deltas discarded: only the
//     bookkeeping the caller's goroutine does before it hands deltas to the shards.
//   - floor: the least an index can do and still answer removals by engine hash: one
//     seq -> (position, prefix) table per worker and the positional index, no
//     validation, no per-key counts, no gap tracking, so not exact (a key held under
//     two seqs is dropped with the first), and queries that probe every 64th position.
//   - floor-worker / floor-index: the floor's two halves, apart (the index half replays
//     the deltas and probes the worker half recorded).
//   - floor-events / floor-worker-events: the floor and its worker half on the log's
//     events alone (no queries), over the events' block ops (stored blocks and removed
//     seqs): the units of kvindex bench --peers, whose peer rows can be set beside them.
//     The floor does no per-event work at all (no lock, no check, no record), so it
//     measures what a layout that changes one seq slot and one index entry per block
//     does with the least work (not the least time: it reads nothing ahead).
//   - floor-stride-events: floor-events with index entries only at the positions a jump
//     search probes (every 64th, and roots); the seq tables as before. What an index
//     that resolves the last stride elsewhere (a walk of the holders' chains) would save
//     on the event side.
//
// The table-B/membership metrics are the bytes of the hash tables (slots, empty ones
// included, and overflow sets) each variant holds at the end of the log, per membership;
// the exact variant's are also given per table (records, seq tables, key indexes,
// positional index).
//
// The reported ceilings: ceiling-pipeline is block ops over the exact worker-state
// time, the most a design that keeps each worker's bookkeeping on the caller's goroutine
// (as this one does) can reach on one ordered stream even with free hand-offs and an
// idle core for the shards; ceiling-2cores is block ops over half the exact time, what
// a perfect split of all of the exact work over two cores would give.
func BenchmarkReplayCeiling(b *testing.B) {
	ops := ceilingOps(b)
	events := make([]Event, len(ops))
	blockOps, eventOps := 0, 0
	for i := range ops {
		events[i] = ceilingEvent(&ops[i])
		blockOps += len(ops[i].Blocks) + len(ops[i].Seqs) + len(ops[i].Content)
		eventOps += len(ops[i].Blocks) + len(ops[i].Seqs)
	}
	var exact, workerOnly, floor, floorWorker, floorIndex, floorEvents, floorWorkerEvents, floorStrideEvents time.Duration
	var fl floorReplay
	var exactBytes exactTables
	var floorBytes float64
	exactReplay(b, ops, events, false, true) // untimed: the exact variant answers the log's checked queries
	for i := 0; i < b.N; i++ {
		d, bytes := exactReplay(b, ops, events, false, false)
		exact += d
		exactBytes = bytes
		d, _ = exactReplay(b, ops, events, true, false)
		workerOnly += d
		floor += fl.run(ops, false)
		floorBytes = fl.tableBytes()
		floorWorker += fl.run(ops, true)
		floorIndex += fl.replayDeltas()
		fl.noQueries = true
		floorEvents += fl.run(ops, false)
		floorWorkerEvents += fl.run(ops, true)
		fl.stride = 64
		floorStrideEvents += fl.run(ops, false)
		fl.noQueries, fl.stride = false, 0
	}
	b.ReportMetric(exactBytes.total(), "exact-table-B/membership")
	b.ReportMetric(exactBytes.recs, "exact-records-B/membership")
	b.ReportMetric(exactBytes.seqs, "exact-seq-table-B/membership")
	b.ReportMetric(exactBytes.keyIdx, "exact-key-index-B/membership")
	b.ReportMetric(exactBytes.index, "exact-index-B/membership")
	b.ReportMetric(floorBytes, "floor-table-B/membership")
	rate := func(d time.Duration) float64 { return float64(blockOps) * float64(b.N) / d.Seconds() / 1e6 }
	b.ReportMetric(rate(exact), "exact-Mops/s")
	b.ReportMetric(rate(workerOnly), "exact-worker-state-Mops/s")
	b.ReportMetric(rate(floor), "floor-Mops/s")
	b.ReportMetric(rate(floorWorker), "floor-worker-Mops/s")
	b.ReportMetric(rate(floorIndex), "floor-index-Mops/s")
	eventRate := func(d time.Duration) float64 { return float64(eventOps) * float64(b.N) / d.Seconds() / 1e6 }
	b.ReportMetric(eventRate(floorEvents), "floor-events-Mops/s")
	b.ReportMetric(eventRate(floorWorkerEvents), "floor-worker-events-Mops/s")
	b.ReportMetric(eventRate(floorStrideEvents), "floor-stride-events-Mops/s")
	b.ReportMetric(rate(workerOnly), "ceiling-pipeline-Mops/s")
	b.ReportMetric(rate(exact/2), "ceiling-2cores-Mops/s")
	b.ReportMetric(0, "ns/op") // one op is several replays: its time means nothing alone
}

func ceilingOps(b *testing.B) []oplog.Op {
	path := os.Getenv("KVINDEX_OPS")
	if path == "" {
		path = filepath.Join("..", "..", "shared", "conformance", "trace_conversation.jsonl")
	}
	f, err := os.Open(path)
	if err != nil {
		b.Skipf("SKIP: %v (set KVINDEX_OPS to an op log)", err)
	}
	defer f.Close()
	ops, err := oplog.ReadAll(f)
	if err != nil {
		b.Fatal(err)
	}
	return ops
}

func ceilingEvent(op *oplog.Op) Event {
	ev := Event{Worker: op.Worker, Parent: op.Parent, HasParent: op.HasParent, Seqs: op.Seqs}
	switch op.Kind {
	case oplog.Stored:
		ev.Kind = EventStored
		for _, bl := range op.Blocks {
			ev.Blocks = append(ev.Blocks, Block{Content: bl[0], Seq: bl[1]})
		}
	case oplog.Removed:
		ev.Kind = EventRemoved
	case oplog.Cleared:
		ev.Kind = EventCleared
	case oplog.RemoveWorker:
		ev.Kind = EventRemoveWorker
	}
	return ev
}

// exactReplay replays ops on a fresh LockedIndex engine, events between two queries in
// one ApplyBatch, and returns the time the calls took and the engine's table bytes per
// membership at the end. With verify it also checks each query that carries its answer
// (and fails when the log has none to check), so that the figures are of a replay that
// did the work: a log whose events were all refused would replay fast and answer wrong.
func exactReplay(b *testing.B, ops []oplog.Op, events []Event, workerStateOnly, verify bool) (time.Duration, exactTables) {
	e, err := New(Config{Shards: 1, LockedIndex: true})
	if err != nil {
		b.Fatal(err)
	}
	defer e.Close()
	e.hooks.dropDeltas = workerStateOnly
	var errs []error
	var matches []Match
	ctx := context.Background()
	// Contract rejections are part of a log; anything else is a broken replay.
	check := func(errs []error) {
		for _, err := range errs {
			if err != nil && !IsRejection(err) {
				b.Fatal(err)
			}
		}
	}
	start := time.Now()
	run, checked := 0, 0
	for i := range ops {
		if ops[i].Kind != oplog.Query {
			continue
		}
		if run < i {
			errs = e.ApplyBatch(events[run:i], errs[:0])
			check(errs)
		}
		run = i + 1
		if matches, err = e.FindMatches(ctx, ops[i].Content, matches[:0]); err != nil {
			b.Fatal(err)
		}
		if verify && ops[i].HasExpect {
			checked++
			if !sameAnswer(&ops[i], matches) {
				b.Fatalf("line %d: got %+v, want scores %v sizes %v", ops[i].Line, matches, ops[i].Expect, ops[i].Sizes)
			}
		}
	}
	if verify && checked == 0 {
		b.Fatal("the log has no checked query: nothing tells that the replay did its work")
	}
	errs = e.ApplyBatch(events[run:], errs[:0])
	d := time.Since(start)
	check(errs)
	return d, exactTableBytes(e)
}

// exactTables is the heap of an engine's tables per membership, by table: the key
// records, the seq tables, the key indexes and the positional index (slots and records,
// empty ones included, and the index's overflow sets).
type exactTables struct{ recs, seqs, keyIdx, index float64 }

func (t exactTables) total() float64 { return t.recs + t.seqs + t.keyIdx + t.index }

func exactTableBytes(e *Engine) exactTables {
	st := e.Stats()
	n := float64(max(st.Blocks, 1))
	t := exactTables{index: float64(st.IndexBytes) / n}
	for ws, i := e.workers(), 0; i < len(ws); i++ {
		if w := ws[i].Load(); w != nil {
			fp := w.Footprint()
			t.recs += float64(fp.RecBytes) / n
			t.seqs += float64(fp.SeqBytes) / n
			t.keyIdx += float64(fp.IdxBytes) / n
		}
	}
	return t
}

var floorSeed = table.SeedFrom(1)

// floorChain is the floor's prefix chain: the engine's default keyed chain, the cheaper
// of the two (BenchmarkChain).
var floorChain = chain.New(false, table.SeedFrom(2))

// floorReplay is the floor variant's state, reused across iterations.
type floorReplay struct {
	ids    map[string]uint32
	seqs   []floorSeqs
	idx    *shard.Index
	out    []uint32
	deltas []floorDelta
	// noQueries skips the log's queries: run replays its events alone.
	noQueries bool
	// stride, when not 0, keeps index entries only at positions stride-1 modulo stride
	// and at roots.
	stride uint32
}

type floorDelta struct {
	k  uint64 // fingerprint
	w  uint32
	op uint8 // shard.OpAdd, shard.OpRemove, or 0 for a query probe
}

func (f *floorReplay) apply(d floorDelta) {
	switch d.op {
	case shard.OpAdd:
		f.idx.Add(d.k, d.w)
	case shard.OpRemove:
		f.idx.Remove(d.k, d.w)
	default:
		f.out = f.idx.AppendMembers(f.out[:0], d.k)
	}
}

// run replays ops on fresh floor tables. With record set it only does the worker half
// and records the deltas and probes for replayDeltas; otherwise it applies them as it
// goes.
func (f *floorReplay) run(ops []oplog.Op, record bool) time.Duration {
	if f.ids == nil {
		f.ids = map[string]uint32{}
		for i := range ops {
			if _, ok := f.ids[ops[i].Worker]; !ok {
				f.ids[ops[i].Worker] = uint32(len(f.ids))
			}
		}
	}
	f.seqs = make([]floorSeqs, len(f.ids))
	f.idx = shard.New(1024)
	f.deltas = f.deltas[:0]
	emit := func(d floorDelta) {
		if record {
			f.deltas = append(f.deltas, d)
		} else {
			f.apply(d)
		}
	}
	start := time.Now()
	for i := range ops {
		op := &ops[i]
		wid := f.ids[op.Worker]
		w := &f.seqs[wid]
		switch op.Kind {
		case oplog.Stored:
			var k floorKey
			if op.HasParent {
				k, _ = w.get(op.Parent)
			}
			for j, bl := range op.Blocks {
				if j > 0 || op.HasParent {
					k = floorKey{prefix: floorChain.Step(k.prefix, bl[0], k.pos+1), pos: k.pos + 1}
				} else {
					k = floorKey{prefix: bl[0]}
				}
				w.put(bl[1], k)
				if f.indexed(k.pos) {
					emit(floorDelta{k: shard.Hash(floorSeed, shard.Key{Prefix: k.prefix, Pos: k.pos}), w: wid, op: shard.OpAdd})
				}
			}
		case oplog.Removed:
			for _, s := range op.Seqs {
				if k, ok := w.get(s); ok {
					w.del(s)
					if f.indexed(k.pos) {
						emit(floorDelta{k: shard.Hash(floorSeed, shard.Key{Prefix: k.prefix, Pos: k.pos}), w: wid, op: shard.OpRemove})
					}
				}
			}
		case oplog.Query:
			if f.noQueries {
				continue
			}
			var p uint64
			for j, c := range op.Content {
				if j == 0 {
					p = c
				} else {
					p = floorChain.Step(p, c, uint32(j))
				}
				if j%64 == 0 || j == len(op.Content)-1 {
					emit(floorDelta{k: shard.Hash(floorSeed, shard.Key{Prefix: p, Pos: uint32(j)})})
				}
			}
		}
	}
	return time.Since(start)
}

// indexed reports whether the floor keeps index entries at position pos (stride).
func (f *floorReplay) indexed(pos uint32) bool {
	return f.stride == 0 || pos == 0 || pos%f.stride == f.stride-1
}

// tableBytes returns the floor's table bytes per membership.
func (f *floorReplay) tableBytes() float64 {
	bytes := f.idx.Bytes()
	for i := range f.seqs {
		bytes += len(f.seqs[i].slots) * int(unsafe.Sizeof(floorSeq{}))
	}
	return float64(bytes) / float64(max(f.idx.Memberships(), 1))
}

// replayDeltas applies the deltas and probes the last recording run produced to a fresh
// index.
func (f *floorReplay) replayDeltas() time.Duration {
	f.idx = shard.New(1024)
	start := time.Now()
	for _, d := range f.deltas {
		f.apply(d)
	}
	return time.Since(start)
}

// floorKey is a floor key: a position and prefix (the floor has no namespaces), 16
// bytes as the engine's keys.
type floorKey struct {
	prefix uint64
	pos    uint32
}

// floorSeqs is the floor's seq -> key table: flat, linear probing, unseeded, no
// deletion but by backward shift; the least a removal by engine hash needs.
type floorSeqs struct {
	slots []floorSeq
	n     int
}

type floorSeq struct {
	seq uint64
	k   floorKey
	ok  bool
}

func (t *floorSeqs) home(seq uint64) uint64 { return table.Home(seq*0x9e3779b97f4a7c15, len(t.slots)) }

func (t *floorSeqs) get(seq uint64) (floorKey, bool) {
	if t.n == 0 {
		return floorKey{}, false
	}
	for i := t.home(seq); ; i = table.Next(i, len(t.slots)) {
		if s := &t.slots[i]; !s.ok || s.seq == seq {
			return s.k, s.ok
		}
	}
}

func (t *floorSeqs) put(seq uint64, k floorKey) {
	if table.Full(t.n, len(t.slots)) {
		old := t.slots
		t.slots = make([]floorSeq, table.Grown(len(old)))
		for _, s := range old {
			if s.ok {
				i := t.home(s.seq)
				for t.slots[i].ok {
					i = table.Next(i, len(t.slots))
				}
				t.slots[i] = s
			}
		}
	}
	i := t.home(seq)
	for t.slots[i].ok && t.slots[i].seq != seq {
		i = table.Next(i, len(t.slots))
	}
	if !t.slots[i].ok {
		t.n++
	}
	t.slots[i] = floorSeq{seq: seq, k: k, ok: true}
}

func (t *floorSeqs) del(seq uint64) {
	i := t.home(seq)
	for t.slots[i].seq != seq {
		i = table.Next(i, len(t.slots))
	}
	for {
		t.slots[i] = floorSeq{}
		j := i
		for {
			j = table.Next(j, len(t.slots))
			s := &t.slots[j]
			if !s.ok {
				t.n--
				return
			}
			if !table.InRun(t.home(s.seq), i, j) {
				t.slots[i] = *s
				i = j
				break
			}
		}
	}
}

// sameAnswer reports whether got holds exactly op's expected workers, scores and sizes.
func sameAnswer(op *oplog.Op, got []Match) bool {
	if len(got) != len(op.Expect) {
		return false
	}
	for _, m := range got {
		s, ok := op.Expect[m.Worker]
		z, ok2 := op.Sizes[m.Worker]
		if !ok || !ok2 || s != m.Score || z != m.Size {
			return false
		}
	}
	return true
}
