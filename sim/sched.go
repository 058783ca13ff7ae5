package sim

import (
	"fmt"
	"time"

	"github.com/kvindex/kvindex/engine"
	"github.com/kvindex/kvindex/hash"
)

// job is one request's life on a timed engine. Its tokens are its prompt and then the
// tokens it generates; a token's KV is computed in the step after the one that
// sampled it (the prompt's in prefill chunks).
type job struct {
	idx    int32 // the request's index in the workload
	router int32 // the router replica that placed it
	worker int   // the engine serving it
	r      *Request
	output int // tokens to generate, >= 1
	// hashes are the engine hashes of every full block the request can ever fill:
	// its prompt's, then those its output completes.
	hashes    []uint64
	seqLen    int // prompt + generated tokens
	computed  int // tokens with KV
	generated int
	blocks    []int32 // the physical blocks it holds, in order
	cached    int     // leading blocks of blocks that carry their hash
	step      int     // tokens scheduled in the current step
	// memo and memoGen remember, while the job waits, the blocks that held its
	// leading hashes at its last admission attempt and their cache generations: a
	// block still in the same generation still holds the hash, and is still the
	// first block cached under it (only an eviction changes that), so the next
	// attempt re-reads blocks instead of the hash map.
	memo     []int32
	memoGen  []uint32
	arrival  time.Duration
	lastTok  time.Duration
	started  bool // scheduled at least once: its hits are counted
	firstTok time.Duration
	preempts int
	hit      int // prefix hit at its first admission, in blocks
}

// decoding reports whether the job's step is a decode: one sampled token's KV.
func (j *job) decoding() bool { return j.generated > 0 && j.step == 1 && j.computed == j.seqLen-1 }

// engineParams are the scheduler settings every timed engine shares.
type engineParams struct {
	blockSize int
	budget    int // tokens per step (vLLM's max_num_batched_tokens)
	maxSeqs   int // running requests at most (max_num_seqs)
	cost      CostModel
	outSalt   uint64 // seeds the content of generated blocks no request repeats
}

// stepEvents buffers a step's events: vLLM publishes the events of a step when the
// step completes, so they leave the engine at the step's end.
type stepEvents struct {
	evs    []bufEvent
	blocks []engine.Block
}

type bufEvent struct {
	parent    uint64
	hasParent bool
	stored    bool
	off, n    int
	seq       uint64
}

func (s *stepEvents) stored(_ string, _ engine.Tier, parent uint64, hasParent bool, blocks []engine.Block) error {
	s.evs = append(s.evs, bufEvent{parent: parent, hasParent: hasParent, stored: true, off: len(s.blocks), n: len(blocks)})
	s.blocks = append(s.blocks, blocks...)
	return nil
}

func (s *stepEvents) removed(_ string, _ engine.Tier, seq uint64) error {
	s.evs = append(s.evs, bufEvent{seq: seq})
	return nil
}

// flush hands the buffered events to em, in order, and empties the buffer.
func (s *stepEvents) flush(worker string, em emitter) error {
	for _, e := range s.evs {
		var err error
		if e.stored {
			err = em.stored(worker, engine.TierDevice, e.parent, e.hasParent, s.blocks[e.off:e.off+e.n:e.off+e.n])
		} else {
			err = em.removed(worker, engine.TierDevice, e.seq)
		}
		if err != nil {
			return err
		}
	}
	s.evs, s.blocks = s.evs[:0], s.blocks[:0]
	return nil
}

// timedEngine is one worker under time: a vLLM v1-style continuous-batching scheduler
// over a mockEngine's block pool. Each step it spends a token budget on the running
// requests first (a decode token each, or the next chunk of a prefill), preempting the
// most recently admitted running request (recompute: its blocks are freed, and it
// waits at the head of the queue) when the pool cannot give a running request its
// next block; then, if nothing was preempted, it admits waiting requests in order
// while the budget, the pool and max_num_seqs allow. The step lasts what the cost
// model says; at its end every request whose KV caught up with its tokens samples one
// more, and those that have all their output finish and free their blocks.
//
// Everything here is owned by the goroutine running Simulate.
type timedEngine struct {
	m       *mockEngine
	p       *engineParams
	waiting []*job // FIFO from whead; preempted jobs go back to the front
	whead   int
	running []*job // admission order
	batch   []*job // the current step's
	fin     []*job // the current step's finished jobs
	b       Batch
	busy    bool
	stepEnd time.Duration
	ev      stepEvents
	st      engineStats
}

// engineStats are one engine's time-weighted gauges and counters.
type engineStats struct {
	busy        time.Duration
	steps       int64
	preemptions int64
	kvArea      float64    // utilisation x seconds, over steps
	kvHist      [101]int64 // nanoseconds spent at each utilisation percent, over steps
	qLast       time.Duration
	qArea       float64 // waiting requests x seconds
	qHist       []int64 // nanoseconds spent at each queue depth
}

func newTimedEngine(m *mockEngine, p *engineParams) *timedEngine {
	return &timedEngine{m: m, p: p}
}

func (e *timedEngine) queued() int { return len(e.waiting) - e.whead }

// noteQueue accounts the queue depth up to now; call it before every change.
func (e *timedEngine) noteQueue(now time.Duration) {
	dt := now - e.st.qLast
	if dt <= 0 {
		return
	}
	q := e.queued()
	e.st.qArea += float64(q) * dt.Seconds()
	for len(e.st.qHist) <= q {
		e.st.qHist = append(e.st.qHist, 0)
	}
	e.st.qHist[q] += int64(dt)
	e.st.qLast = now
}

func (e *timedEngine) pushBack(now time.Duration, j *job) {
	e.noteQueue(now)
	if e.whead > 0 && e.whead*2 >= len(e.waiting) {
		n := copy(e.waiting, e.waiting[e.whead:])
		clear(e.waiting[n:])
		e.waiting, e.whead = e.waiting[:n], 0
	}
	e.waiting = append(e.waiting, j)
}

func (e *timedEngine) pushFront(j *job) {
	if e.whead > 0 {
		e.whead--
		e.waiting[e.whead] = j
	} else {
		e.waiting = append(e.waiting, nil)
		copy(e.waiting[1:], e.waiting)
		e.waiting[0] = j
	}
}

func (e *timedEngine) popFront() {
	e.waiting[e.whead] = nil
	e.whead++
}

// content is the content hash of the request's k-th full block: its prompt's, then
// the ones its output completes (Request.Next), then hashes of the engine's own that
// no request repeats.
func (e *timedEngine) content(j *job, k int) uint64 {
	if k < len(j.r.Blocks) {
		return j.r.Blocks[k]
	}
	if n := k - len(j.r.Blocks); n < len(j.r.Next) {
		return j.r.Next[n]
	}
	return hash.Next(e.p.outSalt^uint64(j.idx), uint64(k))
}

// assign readies a routed request for this engine: its engine hashes.
func (e *timedEngine) assign(j *job) {
	n := (j.r.Tokens + j.output - 1) / e.p.blockSize
	j.hashes = j.hashes[:0]
	p := e.m.noneHash
	for k := range n {
		p = engineHash(p, e.content(j, k))
		j.hashes = append(j.hashes, p)
	}
	j.seqLen = j.r.Tokens
}

// prefixHit returns the number of leading full blocks of the job's current tokens the
// engine holds; j.memo holds the first of the blocks holding each.
func (e *timedEngine) prefixHit(j *job) int {
	full := j.seqLen / e.p.blockSize
	k := 0
	for k < len(j.memo) {
		b := &e.m.blocks[j.memo[k]]
		if !b.hashed || b.gen != j.memoGen[k] {
			break
		}
		k++
	}
	j.memo, j.memoGen = j.memo[:k], j.memoGen[:k]
	for k < full {
		b, ok := e.m.cached.get(j.hashes[k])
		if !ok {
			break
		}
		j.memo = append(j.memo, b)
		j.memoGen = append(j.memoGen, e.m.blocks[b].gen)
		k++
	}
	return min(k, full)
}

// freeBlocks is the number of blocks on the free queue.
func (e *timedEngine) freeBlocks() int { return len(e.m.blocks) - e.m.inUse }

// preempt frees a running job's blocks and puts it back at the head of the queue, to
// be recomputed from whatever of its blocks stay cached.
func (e *timedEngine) preempt(now time.Duration, j *job) {
	e.m.release(j.blocks)
	j.blocks, j.cached, j.computed = j.blocks[:0], 0, 0
	j.preempts++
	e.noteQueue(now)
	e.pushFront(j)
	e.st.preemptions++
}

// grow gives job j (running, at index i) the blocks for upto tokens, preempting
// running jobs from the tail while the pool is short. It reports false when j itself
// was preempted.
func (e *timedEngine) grow(now time.Duration, i int, upto int) (bool, error) {
	j := e.running[i]
	need := (upto+e.p.blockSize-1)/e.p.blockSize - len(j.blocks)
	for need > e.freeBlocks() {
		last := len(e.running) - 1
		victim := e.running[last]
		e.running[last] = nil
		e.running = e.running[:last]
		e.preempt(now, victim)
		if victim == j {
			return false, nil
		}
	}
	for range need {
		b, err := e.m.allocate(&e.ev)
		if err != nil {
			return false, err
		}
		j.blocks = append(j.blocks, b)
	}
	return true, nil
}

// admit tries to start the job at the head of the queue: it reuses the longest prefix
// the engine caches (at most (tokens-1)/B blocks, vLLM always computes the last
// token), and needs the pool to hold the blocks of its first chunk. It returns the
// tokens scheduled (0: not admitted) and, for a first admission, the prefix hit.
func (e *timedEngine) admit(j *job, budget int) (n, hit, reused int, err error) {
	B := e.p.blockSize
	hit = e.prefixHit(j)
	reused = reusable(hit, j.seqLen, B)
	n = min(j.seqLen-reused*B, budget)
	need := (reused*B+n+B-1)/B - reused
	onFree := 0 // reused blocks on the free queue: pinning takes them off
	for _, b := range j.memo[:reused] {
		if e.m.blocks[b].ref == 0 {
			onFree++
		}
	}
	if need > e.freeBlocks()-onFree {
		return 0, hit, reused, nil
	}
	for _, b := range j.memo[:reused] {
		e.m.pin(b)
		j.blocks = append(j.blocks, b)
	}
	j.memo, j.memoGen = j.memo[:0], j.memoGen[:0]
	j.cached, j.computed = reused, reused*B
	for range need {
		b, err := e.m.allocate(&e.ev)
		if err != nil {
			return 0, hit, reused, err
		}
		j.blocks = append(j.blocks, b)
	}
	return n, hit, reused, nil
}

// admitted is called for each job's first admission with its prefix hit and reuse.
type admitted func(j *job, hit, reused int)

// schedule forms the next step at now and returns its duration; 0 when there is
// nothing to run.
func (e *timedEngine) schedule(now time.Duration, first admitted) (time.Duration, error) {
	budget := e.p.budget
	e.batch = e.batch[:0]
	preempted := false
	for i := 0; i < len(e.running) && budget > 0; i++ {
		j := e.running[i]
		n := min(j.seqLen-j.computed, budget)
		if (j.computed+n+e.p.blockSize-1)/e.p.blockSize > len(j.blocks) {
			before := e.st.preemptions
			ok, err := e.grow(now, i, j.computed+n)
			if err != nil {
				return 0, err
			}
			preempted = preempted || e.st.preemptions > before
			if !ok {
				break
			}
		}
		j.step = n
		e.batch = append(e.batch, j)
		budget -= n
	}
	for !preempted && e.queued() > 0 && budget > 0 && len(e.running) < e.p.maxSeqs {
		j := e.waiting[e.whead]
		n, hit, reused, err := e.admit(j, budget)
		if err != nil {
			return 0, err
		}
		if n == 0 {
			break
		}
		if !j.started {
			j.started = true
			first(j, hit, reused)
		}
		e.noteQueue(now)
		e.popFront()
		e.running = append(e.running, j)
		j.step = n
		e.batch = append(e.batch, j)
		budget -= n
	}
	if len(e.batch) == 0 {
		if e.queued() > 0 || len(e.running) > 0 {
			return 0, fmt.Errorf("sim: worker %s: nothing schedulable with %d waiting and %d running", e.m.name, e.queued(), len(e.running))
		}
		return 0, nil
	}
	if err := e.cacheFull(); err != nil {
		return 0, err
	}
	e.b.Chunks, e.b.Decodes, e.b.DecodeContext = e.b.Chunks[:0], 0, 0
	for _, j := range e.batch {
		if j.decoding() {
			e.b.Decodes++
			e.b.DecodeContext += int64(j.computed)
		} else {
			e.b.Chunks = append(e.b.Chunks, Chunk{New: j.step, Context: j.computed})
		}
	}
	d := e.p.cost.StepTime(&e.b)
	util := float64(e.m.inUse) / float64(len(e.m.blocks))
	e.st.kvArea += util * d.Seconds()
	e.st.kvHist[min(int(util*100), 100)] += int64(d)
	e.st.busy += d
	e.st.steps++
	e.busy, e.stepEnd = true, now+d
	return d, nil
}

// cacheFull caches the blocks the step fills, as vLLM does when it schedules them: one
// stored event per request, under the block before them.
func (e *timedEngine) cacheFull() error {
	for _, j := range e.batch {
		full := (j.computed + j.step) / e.p.blockSize
		if full <= j.cached {
			continue
		}
		from := j.cached
		var parent uint64
		if from > 0 {
			parent = j.hashes[from-1]
		}
		e.m.ev = e.m.ev[:0]
		for k, p := from, parent; k < full; k, p = k+1, j.hashes[k] {
			c := e.content(j, k)
			e.m.cache(j.blocks[k], j.hashes[k], c, p, k > 0)
			e.m.ev = append(e.m.ev, engine.Block{Content: c, Seq: j.hashes[k]})
		}
		j.cached = full
		if err := e.ev.stored(e.m.name, engine.TierDevice, parent, from > 0, e.m.ev); err != nil {
			return err
		}
	}
	return nil
}

// stepDone ends the step at now: each job's scheduled tokens get their KV; a job
// whose KV caught up samples a token (its first: tok, else itl with the gap since its
// last), and a job with all its output finishes (done) and frees its blocks.
func (e *timedEngine) stepDone(now, dur time.Duration, tok func(j *job), itl *durHist, done func(j *job)) {
	e.busy = false
	steady := int64(0) // tokens whose gap is this step: the common case, counted at once
	e.fin = e.fin[:0]
	for _, j := range e.batch {
		j.computed += j.step
		j.step = 0
		if j.computed < j.seqLen {
			continue
		}
		j.generated++
		j.seqLen++
		switch gap := now - j.lastTok; {
		case j.generated == 1:
			tok(j)
		case gap == dur:
			steady++
		default:
			itl.add(gap, 1)
		}
		j.lastTok = now
		if j.generated == j.output {
			e.m.release(j.blocks)
			j.blocks = j.blocks[:0]
			e.fin = append(e.fin, j)
		}
	}
	if steady > 0 {
		itl.add(dur, steady)
	}
	if len(e.fin) == 0 {
		return
	}
	keep := e.running[:0]
	for _, j := range e.running {
		if j.generated < j.output {
			keep = append(keep, j)
		}
	}
	clear(e.running[len(keep):])
	e.running = keep
	for _, j := range e.fin {
		done(j)
	}
}
