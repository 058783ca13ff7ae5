package replay

import (
	"cmp"
	"context"
	"fmt"
	"runtime"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/kvindex/kvindex/engine"
	"github.com/kvindex/kvindex/internal/cputime"
	"github.com/kvindex/kvindex/internal/oplog"
)

// Result summarises one replay.
type Result struct {
	Passed, Failed int
	// Mismatches describes the first failed queries in full.
	Mismatches []string
	Ops        int
	// BlockOps counts query hashes, stored blocks and removed hashes.
	BlockOps int
	Seconds  float64
	// CPUSeconds is the process's CPU time (every thread's: the caller's, the shard
	// goroutines' and the collector's) over the same span as Seconds; 0 where the
	// platform does not tell. Unlike Seconds, other load on the machine leaves it be, so
	// it is the figure to compare configurations by on a shared machine.
	CPUSeconds float64
	// Query latency percentiles in nanoseconds (0 when there were no queries).
	QueryP50, QueryP99, QueryP999 int64
	Rejected                      int
	Memberships                   int64
	BytesPerMembership            float64
	Stats                         engine.Stats
}

// Options tunes Run.
type Options struct {
	Config engine.Config
	// MaxMismatches bounds Result.Mismatches. Default 5.
	MaxMismatches int
	// MeasureMemory forces garbage collections around the replay to report bytes per
	// membership; it costs two full GCs.
	MeasureMemory bool
	// Batch applies the events between two queries with one Engine.ApplyBatch call (which
	// takes each worker's lock once per run of its events), as an ingester applying an
	// engine's event batches does, instead of one call per event.
	Batch bool
}

// Run replays ops on a fresh engine. A query with an expected answer is preceded by a
// Barrier, so it sees every op before it.
func Run(ctx context.Context, ops []oplog.Op, opt Options) (Result, error) {
	if opt.MaxMismatches == 0 {
		opt.MaxMismatches = 5
	}
	var res Result
	// Events are converted before the clock starts (and before the heap is measured),
	// like parsing, and so is the walk over the ops that finds the queries: the timed
	// loop below reads only the events and the queries' ops, so that it measures the
	// engine rather than a pass over the whole op log (3% of the replay on the trace log
	// when it was inside). Nothing in the timed loop allocates once lat and matches have
	// grown; no GC cycle runs in it on the trace log (GODEBUG=gctrace=1).
	//
	// The events of one worker share one name string, as a subscriber's do (it names
	// every event with its configured worker): the op log's parser gives each line its
	// own copy, and comparing two copies reads a cold line of memory per event (4% of
	// the sharded replay of the conversation log, in ApplyBatch's worker compare).
	events := make([]engine.Event, len(ops))
	var queries []int
	names := map[string]string{}
	for i := range ops {
		events[i] = Event(&ops[i])
		if w := events[i].Worker; w != "" {
			if n, ok := names[w]; ok {
				events[i].Worker = n
			} else {
				names[w] = w
			}
		}
		res.BlockOps += len(ops[i].Blocks) + len(ops[i].Seqs) + len(ops[i].Content)
		if ops[i].Kind == oplog.Query {
			queries = append(queries, i)
		}
	}
	queries = append(queries, len(ops)) // the end: the events after the last query
	res.Ops = len(ops)
	var before runtime.MemStats
	if opt.MeasureMemory {
		runtime.GC()
		runtime.ReadMemStats(&before)
	}
	e, err := engine.New(opt.Config)
	if err != nil {
		return res, err
	}
	defer e.Close()
	lat := make([]int64, 0, len(queries))
	var matches []engine.Match
	errs := make([]error, 0, 64)
	start := time.Now()
	cpu0, cpuOK := cputime.Process()
	next := 0 // the first op not yet applied
	for _, q := range queries {
		if err := applyEvents(e, ops, events, next, q, opt.Batch, &errs, &res); err != nil {
			return res, err
		}
		next = q + 1
		if q == len(ops) {
			break
		}
		op := &ops[q]
		if op.HasExpect {
			if err := e.Barrier(ctx); err != nil {
				return res, fmt.Errorf("line %d: %w", op.Line, err)
			}
		}
		t0 := time.Now()
		var err error
		matches, err = e.FindMatches(ctx, op.Content, matches[:0])
		lat = append(lat, time.Since(t0).Nanoseconds())
		if err != nil {
			return res, fmt.Errorf("line %d: %w", op.Line, err)
		}
		if op.HasExpect {
			if msg := Compare(op, matches); msg != "" {
				res.Failed++
				if len(res.Mismatches) < opt.MaxMismatches {
					res.Mismatches = append(res.Mismatches, msg)
				}
			} else {
				res.Passed++
			}
		}
	}
	if err := e.Barrier(ctx); err != nil {
		return res, err
	}
	res.Seconds = time.Since(start).Seconds()
	if cpu1, ok := cputime.Process(); ok && cpuOK {
		res.CPUSeconds = (cpu1 - cpu0).Seconds()
	}
	res.Stats = e.Stats()
	res.Memberships = res.Stats.Blocks
	if opt.MeasureMemory {
		var after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&after)
		if res.Memberships > 0 {
			res.BytesPerMembership = float64(int64(after.HeapAlloc)-int64(before.HeapAlloc)) / float64(res.Memberships)
		}
		runtime.KeepAlive(ops)
		runtime.KeepAlive(events)
	}
	res.QueryP50, res.QueryP99, res.QueryP999 = Percentile(lat, 0.50), Percentile(lat, 0.99), Percentile(lat, 0.999)
	return res, nil
}

// applyEvents applies the events of ops[lo:hi] (none of them a query): with one
// ApplyBatch call when batch is set, else one Apply call each.
func applyEvents(e *engine.Engine, ops []oplog.Op, events []engine.Event, lo, hi int, batch bool, errs *[]error, res *Result) error {
	if !batch {
		for i := lo; i < hi; i++ {
			if err := classify(e.Apply(&events[i]), res); err != nil {
				return fmt.Errorf("line %d: %w", ops[i].Line, err)
			}
		}
		return nil
	}
	if lo == hi {
		return nil
	}
	*errs = e.ApplyBatch(events[lo:hi], (*errs)[:0])
	for k, err := range *errs {
		if err = classify(err, res); err != nil {
			return fmt.Errorf("line %d: %w", ops[lo+k].Line, err)
		}
	}
	return nil
}

// classify counts a contract rejection and returns any other error.
func classify(err error, res *Result) error {
	if engine.IsRejection(err) {
		res.Rejected++
		return nil
	}
	return err
}

// Percentile returns the q-quantile of xs (nearest rank); it sorts xs in place.
func Percentile[T cmp.Ordered](xs []T, q float64) T {
	if len(xs) == 0 {
		var zero T
		return zero
	}
	slices.Sort(xs)
	i := int(q*float64(len(xs))+0.5) - 1
	return xs[min(max(i, 0), len(xs)-1)]
}

// Compare returns "" when got equals the op's expected answer, in the engine's order
// (score descending, then worker id), else a description of the difference.
func Compare(op *oplog.Op, got []engine.Match) string {
	ok := len(got) == len(op.Expect) && len(op.Expect) == len(op.Sizes)
	for i, m := range got {
		if !ok {
			break
		}
		s, in := op.Expect[m.Worker]
		z, in2 := op.Sizes[m.Worker]
		ok = in && in2 && s == m.Score && z == m.Size &&
			(i == 0 || got[i-1].Score > m.Score || got[i-1].Score == m.Score && got[i-1].Worker < m.Worker)
		if tiers, has := op.Tiers[m.Worker]; ok && op.Tiers != nil {
			ok = has && tiers == m.Tiers
		}
	}
	if ok && op.Tiers != nil && len(op.Tiers) != len(got) {
		ok = false
	}
	if ok {
		return ""
	}
	var b strings.Builder
	fmt.Fprintf(&b, "line %d: query of %d blocks\n  want: %s\n  got:  ", op.Line, len(op.Content), formatExpect(op.Expect, op.Sizes))
	gotE, gotS := map[string]int{}, map[string]int{}
	for _, m := range got {
		gotE[m.Worker], gotS[m.Worker] = m.Score, m.Size
	}
	b.WriteString(formatExpect(gotE, gotS))
	if op.Tiers != nil {
		fmt.Fprintf(&b, "\n  want tiers: %v\n  got tiers: ", op.Tiers)
		for _, m := range got {
			fmt.Fprintf(&b, " %s:%v", m.Worker, m.Tiers)
		}
	}
	return b.String()
}

func formatExpect(scores, sizes map[string]int) string {
	names := make([]string, 0, len(scores))
	for n := range scores {
		names = append(names, n)
	}
	for n := range sizes {
		if _, ok := scores[n]; !ok {
			names = append(names, n)
		}
	}
	sort.Strings(names)
	if len(names) == 0 {
		return "{}"
	}
	parts := make([]string, len(names))
	for i, n := range names {
		parts[i] = fmt.Sprintf("%q: score %d size %d", n, scores[n], sizes[n])
	}
	return "{" + strings.Join(parts, ", ") + "}"
}
