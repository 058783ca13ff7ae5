package bench

import (
	"errors"
	"fmt"
	"runtime"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvindex/kvindex/engine"
	"github.com/kvindex/kvindex/internal/cputime"
	"github.com/kvindex/kvindex/internal/replay"
)

// Options tunes Run. Zero fields mean their defaults.
type Options struct {
	// Duration is the time budget of each timed measurement. Default 400ms.
	Duration time.Duration
	// Producers lists the producer goroutine counts MeasureEvents runs with.
	// Default {1, 2, 4}.
	Producers []int
	// Queriers is the number of query goroutines under load. Default 2.
	Queriers int
	// MaxPasses bounds the passes of one MeasureEvents. Default 15.
	MaxPasses int
	// MaxLoops bounds the streamer's loops over the stream under load, after its
	// untimed first one. Default 50.
	MaxLoops int
	// SkipVerify skips the correctness replay.
	SkipVerify bool
}

func (o Options) withDefaults() Options {
	if o.Duration <= 0 {
		o.Duration = 400 * time.Millisecond
	}
	if len(o.Producers) == 0 {
		o.Producers = []int{1, 2, 4}
	}
	if o.Queriers <= 0 {
		o.Queriers = 2
	}
	if o.MaxPasses <= 0 {
		o.MaxPasses = 15
	}
	if o.MaxLoops <= 0 {
		o.MaxLoops = 50
	}
	return o
}

// Result is everything Run measured for one implementation.
type Result struct {
	Impl   string
	Verify VerifyResult
	Events []EventResult // one per Options.Producers entry
	Load   QueryResult   // Queriers goroutines while one streamer applies events
	Rest   QueryResult   // one querier on the index a full pass left
	Memory MemoryResult
	// Coalesced is the events measurement (one producer) on the workload's Coalesced
	// form, and CoalescedVerify its verification; zero where not measured
	// (CompareRounds measures them).
	Coalesced       EventResult
	CoalescedVerify VerifyResult
}

// VerifyResult counts the checked queries of a sequential replay.
type VerifyResult struct {
	Passed, Failed int
	// First describes the first failure.
	First string
	// ScoresPassed (peers only, 0 otherwise) counts the checked queries whose scores,
	// sizes aside, equal the expected ones.
	ScoresPassed int
}

// EventResult is one MeasureEvents.
type EventResult struct {
	Producers int
	Passes    int
	// Seconds is the median pass: all events, then Sync.
	Seconds        float64
	Events         int
	BlockOps       int64
	EventsPerSec   float64
	BlockOpsPerSec float64
	// CPUSeconds is the process CPU time (every thread's, user and system) of the pass
	// whose CPU time is the median; CPUBlockOpsPerSec is BlockOps over it. 0 where the
	// platform does not tell (cputime.Process), or the driver of a peer did not report it.
	CPUSeconds        float64
	CPUBlockOpsPerSec float64
	// AllocsPerEvent is heap allocations (runtime.MemStats.Mallocs) per event, over
	// every pass.
	AllocsPerEvent float64
	// Rejected counts the stored events the index rejected in one pass.
	Rejected int
}

// QueryResult is one MeasureQueries.
type QueryResult struct {
	Queriers      int
	Queries       int
	Seconds       float64
	QueriesPerSec float64
	// Latency percentiles of FindMatches, in nanoseconds.
	P50, P99, P999 int64
	// AllocsPerQuery is heap allocations per query over the timed window (under load it
	// includes the streamer's).
	AllocsPerQuery float64
	// RoundsPerQuery and ProbesPerQuery are a sharded engine's round trips to the
	// shards and probes per query over the window (engine.Stats.QueryRounds,
	// QueryProbes); -1 for an implementation that does not count them.
	RoundsPerQuery, ProbesPerQuery float64
	// Under load: events the streamer applied in the window, their rate, and its loops.
	Events       int64
	EventsPerSec float64
	Loops        int
}

// MemoryResult is one MeasureMemory.
type MemoryResult struct {
	// Memberships is the sum of the workers' sizes after one full pass.
	Memberships int64
	// HeapBytes is the growth of the live heap (HeapAlloc after a GC) over the pass.
	HeapBytes          int64
	BytesPerMembership float64
	// Method says how HeapBytes was measured: MemoryHeap for the Go implementations,
	// MemoryAllocator for the peers (whose drivers also report RSSBytesPerMembership).
	Method                string
	RSSBytesPerMembership float64
}

// The ways MemoryResult.HeapBytes is measured.
const (
	// MemoryHeap is the growth of the Go heap (HeapAlloc after a GC).
	MemoryHeap = "heap"
	// MemoryAllocator is the live bytes a peer driver's counting global allocator saw.
	MemoryAllocator = "alloc"
)

// Run runs every measurement of impl on w: Verify, MeasureEvents for each producer count,
// MeasureQueries under load and at rest, and MeasureMemory. It fails on the first error
// that is not a rejection of the contract; a failed verification is reported in the
// result, not as an error.
func Run(impl Impl, w *Workload, opt Options) (Result, error) {
	opt = opt.withDefaults()
	res := Result{Impl: impl.Name}
	var err error
	if !opt.SkipVerify {
		if res.Verify, err = Verify(impl, w); err != nil {
			return res, err
		}
	}
	for _, p := range opt.Producers {
		er, err := MeasureEvents(impl, w, p, opt.Duration, opt.MaxPasses)
		if err != nil {
			return res, err
		}
		res.Events = append(res.Events, er)
	}
	if res.Load, err = MeasureQueries(impl, w, opt.Queriers, opt.Duration, true, opt.MaxLoops); err != nil {
		return res, err
	}
	if res.Rest, err = MeasureQueries(impl, w, 1, opt.Duration, false, 0); err != nil {
		return res, err
	}
	if res.Memory, err = MeasureMemory(impl, w); err != nil {
		return res, err
	}
	return res, nil
}

// Verify replays w sequentially on a fresh index and checks every query that carries an
// expected answer, after a Sync.
func Verify(impl Impl, w *Workload) (VerifyResult, error) {
	var res VerifyResult
	idx, err := impl.New()
	if err != nil {
		return res, err
	}
	defer idx.Close()
	var got []engine.Match
	for _, s := range w.steps {
		if s >= 0 {
			if err := idx.Apply(&w.Events[s]); err != nil && !engine.IsRejection(err) {
				return res, fmt.Errorf("%s: event %d: %w", impl.Name, s, err)
			}
			continue
		}
		op := &w.checks[^s]
		if err := idx.Sync(); err != nil {
			return res, err
		}
		if got, err = idx.FindMatches(op.Content, got[:0]); err != nil {
			return res, err
		}
		msg := replay.Compare(op, got)
		if msg == "" {
			res.Passed++
			continue
		}
		if res.Failed++; res.First == "" {
			res.First = msg
		}
	}
	return res, nil
}

// settle waits, after a forced collection, until the process has used no more than
// settleIdle of CPU time over a settleStep of sleep (at most settleMax), so that a timed
// region starts with the runtime idle. Without it a one-thread replay pass of the
// conversation trace read 1.1-1.2 ms more CPU time than wall-clock time (5-9% of a
// pass; the runtime's work on its other threads), where the peers' drivers, which do
// not collect, read none; with it about half the passes read within 0.2 ms of their
// wall-clock time and the rest still 0.7-1.1 ms above it (work the runtime starts
// during the pass). Where the platform does not tell CPU time it sleeps one step.
func settle() {
	for waited := time.Duration(0); waited < settleMax; waited += settleStep {
		c0, ok := cputime.Process()
		time.Sleep(settleStep)
		c1, _ := cputime.Process()
		if !ok || c1-c0 <= settleIdle {
			return
		}
	}
}

const (
	settleStep = 5 * time.Millisecond
	settleIdle = 100 * time.Microsecond
	settleMax  = 200 * time.Millisecond
)

// applyPass applies the events below limit with one goroutine per part (a single part:
// the caller's goroutine), from the workload's flat form (flatten), then Syncs. It
// returns the rejections.
func applyPass(idx Index, w *Workload, parts [][]int32, limit int) (int, error) {
	f := w.flatten()
	if len(parts) == 1 {
		rej := 0
		var ev engine.Event
		for _, i := range parts[0][:prefix(parts[0], limit)] {
			if err := idx.Apply(f.event(w, i, &ev)); err != nil {
				if !engine.IsRejection(err) {
					return rej, err
				}
				rej++
			}
		}
		return rej, idx.Sync()
	}
	var wg sync.WaitGroup
	rej := make([]int, len(parts))
	errs := make([]error, len(parts))
	start := make(chan struct{})
	for pi, part := range parts {
		part = part[:prefix(part, limit)]
		wg.Go(func() {
			<-start
			var ev engine.Event
			for _, i := range part {
				if err := idx.Apply(f.event(w, i, &ev)); err != nil {
					if !engine.IsRejection(err) {
						errs[pi] = err
						return
					}
					rej[pi]++
				}
			}
		})
	}
	close(start)
	wg.Wait()
	n := 0
	for _, r := range rej {
		n += r
	}
	if err := errors.Join(errs...); err != nil {
		return n, err
	}
	return n, idx.Sync()
}

// MeasureEvents applies every event of w to fresh indexes, split among producers
// goroutines by worker, until the passes' time reaches budget (at least one pass, at
// most maxPasses). Index creation and Close are not timed; the final Sync is.
func MeasureEvents(impl Impl, w *Workload, producers int, budget time.Duration, maxPasses int) (EventResult, error) {
	res := EventResult{Producers: producers, Events: len(w.Events), BlockOps: w.BlockOps}
	if producers < 1 {
		return res, errors.New("bench: producers must be >= 1")
	}
	parts := w.partition(producers)
	var secs, cpus []float64
	var total time.Duration
	var mallocs uint64
	var m0, m1 runtime.MemStats
	for res.Passes < max(1, maxPasses) && (res.Passes == 0 || total < budget) {
		idx, err := impl.New()
		if err != nil {
			return res, err
		}
		runtime.GC() // start every pass from the same heap, outside the timed region
		settle()
		runtime.ReadMemStats(&m0)
		c0, cpuOK := cputime.Process()
		t0 := time.Now()
		rej, err := applyPass(idx, w, parts, len(w.Events))
		d := time.Since(t0)
		if c1, ok := cputime.Process(); ok && cpuOK {
			cpus = append(cpus, (c1 - c0).Seconds())
		}
		runtime.ReadMemStats(&m1)
		idx.Close()
		if err != nil {
			return res, fmt.Errorf("%s: %w", impl.Name, err)
		}
		res.Passes++
		res.Rejected = rej
		total += d
		mallocs += m1.Mallocs - m0.Mallocs
		secs = append(secs, d.Seconds())
	}
	res.Seconds = median(secs)
	if res.Seconds > 0 {
		res.EventsPerSec = float64(res.Events) / res.Seconds
		res.BlockOpsPerSec = float64(res.BlockOps) / res.Seconds
	}
	if res.CPUSeconds = median(cpus); res.CPUSeconds > 0 {
		res.CPUBlockOpsPerSec = float64(res.BlockOps) / res.CPUSeconds
	}
	if n := res.Passes * res.Events; n > 0 {
		res.AllocsPerEvent = float64(mallocs) / float64(n)
	}
	return res, nil
}

// streamer applies a workload's events in a loop, resetting the index (a remove_worker
// per worker) before each loop after the first, until stopped or after maxLoops loops
// beyond the first.
type streamer struct {
	idx Index
	w   *Workload
	// stop is set by the query side when it is done; done is set by the streamer when
	// it exits, for whatever reason.
	stop, done atomic.Bool
	// warm is closed by the streamer when its first loop is over (or when it exits);
	// it then waits for start to be closed before it goes on. events counts the events
	// applied after start.
	warm, start chan struct{}
	events      atomic.Int64
	// Written by the streamer, read after it has exited.
	loops int
	err   error
}

func (s *streamer) run(maxLoops int) {
	warmed := false
	defer func() {
		if !warmed {
			close(s.warm)
		}
		s.done.Store(true)
	}()
	resets := make([]engine.Event, len(s.w.Workers))
	for i, name := range s.w.Workers {
		resets[i] = engine.Event{Kind: engine.EventRemoveWorker, Worker: name}
	}
	for loop := 0; loop <= maxLoops; loop++ {
		if loop > 0 {
			// Reset, so that this loop means what the first one did.
			for i := range resets {
				if err := s.idx.Apply(&resets[i]); err != nil {
					s.err = err
					return
				}
				s.events.Add(1)
			}
		}
		for i := range s.w.Events {
			if s.stop.Load() {
				return
			}
			if err := s.idx.Apply(&s.w.Events[i]); err != nil && !engine.IsRejection(err) {
				s.err = err
				return
			}
			s.events.Add(1)
		}
		if loop == 0 {
			warmed = true
			close(s.warm)
			<-s.start
			s.events.Store(0)
		} else {
			s.loops++
		}
	}
}

// MeasureQueries issues w's queries from queriers goroutines for budget (goroutine g
// takes queries g, g+queriers, ... cyclically) and records each call's latency.
//
// Under load, one streamer goroutine applies the events in a loop (see streamer): the
// window starts when its first, untimed loop has filled the index and ends at budget or
// when the streamer has done maxLoops more loops. At rest, the index first gets every
// event (untimed) and nothing else runs.
func MeasureQueries(impl Impl, w *Workload, queriers int, budget time.Duration, load bool, maxLoops int) (QueryResult, error) {
	res := QueryResult{Queriers: queriers}
	if queriers < 1 {
		return res, errors.New("bench: queriers must be >= 1")
	}
	if len(w.Queries) == 0 {
		return res, nil
	}
	idx, err := impl.New()
	if err != nil {
		return res, err
	}
	defer idx.Close()
	if !load {
		if _, err := applyPass(idx, w, w.partition(1), len(w.Events)); err != nil {
			return res, fmt.Errorf("%s: %w", impl.Name, err)
		}
	}
	var st *streamer
	var swg sync.WaitGroup
	if load {
		st = &streamer{idx: idx, w: w, warm: make(chan struct{}), start: make(chan struct{})}
		swg.Go(func() { st.run(max(1, maxLoops)) })
		<-st.warm
	}
	runtime.GC()
	settle()
	var m0, m1 runtime.MemStats
	runtime.ReadMemStats(&m0)
	qw, counts := idx.(queryWorker)
	var r0, p0 uint64
	if counts {
		r0, p0, counts = qw.QueryWork()
	}
	if st != nil {
		close(st.start)
	}
	lats := make([][]int64, queriers)
	errs := make([]error, queriers)
	var wg sync.WaitGroup
	t0 := time.Now()
	for g := range queriers {
		wg.Go(func() {
			lat := make([]int64, 0, 1<<14)
			var dst []engine.Match
			for k := g; ; k += queriers {
				if k > g && st != nil && st.done.Load() {
					break // (each querier issues at least one query)
				}
				q := w.Queries[k%len(w.Queries)]
				t := time.Now()
				var err error
				dst, err = idx.FindMatches(q, dst[:0])
				d := time.Since(t)
				if err != nil {
					errs[g] = err
					break
				}
				lat = append(lat, d.Nanoseconds())
				if t.Add(d).Sub(t0) >= budget {
					break
				}
			}
			lats[g] = lat
		})
	}
	wg.Wait()
	elapsed := time.Since(t0)
	if st != nil {
		st.stop.Store(true)
		swg.Wait()
	}
	runtime.ReadMemStats(&m1)
	if err := errors.Join(errs...); err != nil {
		return res, fmt.Errorf("%s: %w", impl.Name, err)
	}
	if st != nil && st.err != nil {
		return res, fmt.Errorf("%s: streamer: %w", impl.Name, st.err)
	}
	all := slices.Concat(lats...)
	res.Queries = len(all)
	res.Seconds = elapsed.Seconds()
	if res.Seconds > 0 {
		res.QueriesPerSec = float64(res.Queries) / res.Seconds
	}
	res.RoundsPerQuery, res.ProbesPerQuery = -1, -1
	if res.Queries > 0 {
		res.AllocsPerQuery = float64(m1.Mallocs-m0.Mallocs) / float64(res.Queries)
		if counts {
			r1, p1, _ := qw.QueryWork()
			res.RoundsPerQuery = float64(r1-r0) / float64(res.Queries)
			res.ProbesPerQuery = float64(p1-p0) / float64(res.Queries)
		}
	}
	res.P50, res.P99, res.P999 = replay.Percentile(all, 0.50), replay.Percentile(all, 0.99), replay.Percentile(all, 0.999)
	if st != nil {
		res.Events, res.Loops = st.events.Load(), st.loops
		if res.Seconds > 0 {
			res.EventsPerSec = float64(res.Events) / res.Seconds
		}
	}
	return res, nil
}

// MeasureMemory applies every event to a fresh index and reports the live-heap growth
// per membership held at the end. It forces garbage collections.
func MeasureMemory(impl Impl, w *Workload) (MemoryResult, error) {
	res := MemoryResult{Method: MemoryHeap}
	var m0, m1 runtime.MemStats
	runtime.GC()
	runtime.GC()
	runtime.ReadMemStats(&m0)
	idx, err := impl.New()
	if err != nil {
		return res, err
	}
	defer idx.Close()
	if _, err := applyPass(idx, w, w.partition(1), len(w.Events)); err != nil {
		return res, fmt.Errorf("%s: %w", impl.Name, err)
	}
	res.Memberships = idx.Blocks()
	runtime.GC()
	runtime.ReadMemStats(&m1)
	runtime.KeepAlive(idx)
	res.HeapBytes = int64(m1.HeapAlloc) - int64(m0.HeapAlloc)
	if res.Memberships > 0 {
		res.BytesPerMembership = float64(res.HeapBytes) / float64(res.Memberships)
	}
	return res, nil
}

// median sorts xs and returns their median (the mean of the middle two for an even
// count), 0 for none.
func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	sort.Float64s(xs)
	n := len(xs)
	if n%2 == 1 {
		return xs[n/2]
	}
	return (xs[n/2-1] + xs[n/2]) / 2
}
