package route

import (
	"errors"
	"fmt"
	"math"
	"sync/atomic"
)

// Load is what a router knows of one worker's load. The first four fields are the
// router's own view (a Tracker fills them from the requests it routed); Waiting and
// KVUtil are what the worker itself reports (vLLM's num_requests_waiting and
// kv_cache_usage_perc), as fresh as the router's last scrape.
type Load struct {
	// Requests counts the requests routed to the worker and not finished, and Tokens
	// their prompt tokens.
	Requests int
	Tokens   int64
	// PrefillTokens is the part of Tokens still to prefill: the prompt tokens of the
	// requests with no first token yet, less the cache hits the router expected for
	// them.
	PrefillTokens int64
	// ActiveBlocks is the KV blocks of the unfinished requests (their prompts').
	ActiveBlocks int64
	// Waiting is the number of requests queued at the worker, not yet running.
	Waiting int
	// KVUtil is the fraction of the worker's KV blocks in use, in [0, 1].
	KVUtil float64
}

// Candidate is one worker a policy may pick.
type Candidate struct {
	// Overlap is the number of leading blocks of the request the worker holds (the
	// index's engine.Match.Score, or a tier of it).
	Overlap int
	Load    Load
}

// Request is what a policy knows of the request it places.
type Request struct {
	// Tokens is the prompt length in tokens, and BlockSize the workers' KV block size
	// (a block of the overlap holds BlockSize tokens).
	Tokens, BlockSize int
}

// blocks is the number of KV blocks the prompt takes, its partial last block included.
func (r Request) blocks() int64 {
	if r.BlockSize <= 0 {
		return 0
	}
	return int64((r.Tokens + r.BlockSize - 1) / r.BlockSize)
}

// fullBlocks is the number of full blocks of the prompt: the most an overlap can be.
func (r Request) fullBlocks() int {
	if r.BlockSize <= 0 {
		return 0
	}
	return r.Tokens / r.BlockSize
}

// Policy picks a worker for a request.
type Policy interface {
	// Name is the policy's name as flags and reports spell it.
	Name() string
	// Pick returns the index in cands of the worker to route req to, or -1 when cands
	// is empty. rnd is a random number that breaks ties: equal rnd, equal inputs, equal
	// pick.
	Pick(req Request, cands []Candidate, rnd uint64) int
}

// ErrConfig wraps every invalid policy parameter.
var ErrConfig = errors.New("route: invalid config")

// DefaultOverlapWeight is Cost's default OverlapWeight: Dynamo's default
// kv-overlap-score-weight.
const DefaultOverlapWeight = 1.0

// MaxWeight bounds every weight a policy takes.
const MaxWeight = 1e6

// Cost is Dynamo's KV router cost: for each worker,
//
//	cost = OverlapWeight * prefill blocks + decode blocks
//	prefill blocks = (Load.PrefillTokens + req.Tokens - Overlap*BlockSize) / BlockSize
//	decode blocks  = Load.ActiveBlocks + the request's blocks
//
// and the cheapest worker wins. A larger OverlapWeight favours the cache (time to first
// token), a smaller one the balance of running requests (inter-token latency). The zero
// value has weight DefaultOverlapWeight.
type Cost struct {
	OverlapWeight float64
}

// NewCost returns a Cost with the given overlap weight (0: the default), or an error
// for a negative, non-finite or larger than MaxWeight one.
func NewCost(overlapWeight float64) (Cost, error) {
	if err := checkWeight("overlap weight", overlapWeight); err != nil {
		return Cost{}, err
	}
	return Cost{OverlapWeight: overlapWeight}, nil
}

// Name implements Policy.
func (Cost) Name() string { return "cost" }

// Costs returns each candidate's cost in blocks, into dst (reused when large enough).
func (c Cost) Costs(req Request, cands []Candidate, dst []float64) []float64 {
	w := c.OverlapWeight
	if w == 0 {
		w = DefaultOverlapWeight
	}
	dst = dst[:0]
	bs := float64(max(req.BlockSize, 1))
	reqBlocks := req.blocks()
	full := req.fullBlocks()
	for i := range cands {
		ov := min(max(cands[i].Overlap, 0), full)
		l := &cands[i].Load
		prefill := float64(max(l.PrefillTokens, 0)+int64(req.Tokens)-int64(ov)*int64(req.BlockSize)) / bs
		decode := float64(max(l.ActiveBlocks, 0) + reqBlocks)
		dst = append(dst, w*prefill+decode)
	}
	return dst
}

// Pick implements Policy: the least cost, ties broken by rnd.
func (c Cost) Pick(req Request, cands []Candidate, rnd uint64) int {
	var buf [64]float64
	costs := c.Costs(req, cands, buf[:0])
	return pickBest(costs, rnd, false)
}

// Scorer weights. The defaults are those of llm-d's benchmarked configurations.
const (
	DefaultPrefixWeight = 2.0
	DefaultKVWeight     = 1.0
	DefaultQueueWeight  = 1.0
)

// Scorer is llm-d's weighted scoring: for each worker,
//
//	score = PrefixWeight * Overlap/full blocks of the request
//	      + KVWeight     * (1 - Load.KVUtil)
//	      + QueueWeight  * (max Waiting - Waiting) / (max Waiting - min Waiting)
//
// (the queue score is 1 for every worker when all wait the same), and the highest
// score wins. The zero value has the default weights; to switch a scorer off, give it
// a weight so small it never decides (NewScorer rejects none of 0..MaxWeight, but a
// Scorer with all three zero is the default).
type Scorer struct {
	PrefixWeight, KVWeight, QueueWeight float64
}

// NewScorer returns a Scorer with the given weights, or an error for a negative,
// non-finite or larger than MaxWeight one. All three zero means the defaults.
func NewScorer(prefix, kv, queue float64) (Scorer, error) {
	for _, w := range []struct {
		name string
		v    float64
	}{{"prefix weight", prefix}, {"KV weight", kv}, {"queue weight", queue}} {
		if err := checkWeight(w.name, w.v); err != nil {
			return Scorer{}, err
		}
	}
	return Scorer{PrefixWeight: prefix, KVWeight: kv, QueueWeight: queue}, nil
}

// Name implements Policy.
func (Scorer) Name() string { return "scorer" }

func (s Scorer) weights() (p, kv, q float64) {
	if s == (Scorer{}) {
		return DefaultPrefixWeight, DefaultKVWeight, DefaultQueueWeight
	}
	return s.PrefixWeight, s.KVWeight, s.QueueWeight
}

// Scores returns each candidate's score, into dst (reused when large enough).
func (s Scorer) Scores(req Request, cands []Candidate, dst []float64) []float64 {
	wp, wkv, wq := s.weights()
	dst = dst[:0]
	if len(cands) == 0 {
		return dst
	}
	minQ, maxQ := cands[0].Load.Waiting, cands[0].Load.Waiting
	for i := range cands {
		minQ, maxQ = min(minQ, cands[i].Load.Waiting), max(maxQ, cands[i].Load.Waiting)
	}
	full := req.fullBlocks()
	for i := range cands {
		l := &cands[i].Load
		prefix := 0.0
		if full > 0 {
			prefix = float64(min(max(cands[i].Overlap, 0), full)) / float64(full)
		}
		kv := 1 - min(max(l.KVUtil, 0), 1)
		queue := 1.0
		if maxQ > minQ {
			queue = float64(maxQ-l.Waiting) / float64(maxQ-minQ)
		}
		dst = append(dst, wp*prefix+wkv*kv+wq*queue)
	}
	return dst
}

// Pick implements Policy: the highest score, ties broken by rnd.
func (s Scorer) Pick(req Request, cands []Candidate, rnd uint64) int {
	var buf [64]float64
	return pickBest(s.Scores(req, cands, buf[:0]), rnd, true)
}

// LeastLoaded picks the worker with the fewest prompt tokens queued and running
// (Load.Tokens), ties broken by rnd. It ignores the cache.
type LeastLoaded struct{}

// Name implements Policy.
func (LeastLoaded) Name() string { return "least-loaded" }

// Pick implements Policy.
func (LeastLoaded) Pick(_ Request, cands []Candidate, rnd uint64) int {
	best, ties := -1, 0
	for i := range cands {
		switch t := cands[i].Load.Tokens; {
		case best < 0 || t < cands[best].Load.Tokens:
			best, ties = i, 1
		case t == cands[best].Load.Tokens:
			ties++
		}
	}
	return nthTie(ties, rnd, func(yield func(int) bool) {
		for i := range cands {
			if cands[i].Load.Tokens == cands[best].Load.Tokens && !yield(i) {
				return
			}
		}
	}, best)
}

// Random picks a worker uniformly with rnd.
type Random struct{}

// Name implements Policy.
func (Random) Name() string { return "random" }

// Pick implements Policy.
func (Random) Pick(_ Request, cands []Candidate, rnd uint64) int {
	if len(cands) == 0 {
		return -1
	}
	return reduce(rnd, len(cands))
}

// RoundRobin cycles through the candidates in order: the n-th Pick returns n modulo
// the number of candidates. Its counter is atomic, so one RoundRobin may serve
// concurrent callers; it is the only stateful policy, used by pointer.
type RoundRobin struct {
	next atomic.Uint64
}

// Name implements Policy.
func (*RoundRobin) Name() string { return "round-robin" }

// Pick implements Policy.
func (r *RoundRobin) Pick(_ Request, cands []Candidate, _ uint64) int {
	if len(cands) == 0 {
		return -1
	}
	return int((r.next.Add(1) - 1) % uint64(len(cands)))
}

// pickBest returns the index of the least (or, with highest, the greatest) value, the
// ties among them broken by rnd; -1 for none.
func pickBest(vals []float64, rnd uint64, highest bool) int {
	best, ties := -1, 0
	for i, v := range vals {
		better := best < 0 || v < vals[best]
		if highest {
			better = best < 0 || v > vals[best]
		}
		switch {
		case better:
			best, ties = i, 1
		case v == vals[best]:
			ties++
		}
	}
	return nthTie(ties, rnd, func(yield func(int) bool) {
		for i, v := range vals {
			if v == vals[best] && !yield(i) {
				return
			}
		}
	}, best)
}

// nthTie returns the (rnd mod ties)-th index the sequence yields, or first when there
// is at most one tie.
func nthTie(ties int, rnd uint64, seq func(func(int) bool), first int) int {
	if ties <= 1 {
		return first
	}
	k := reduce(rnd, ties)
	out := first
	seq(func(i int) bool {
		if k == 0 {
			out = i
			return false
		}
		k--
		return true
	})
	return out
}

// reduce maps rnd uniformly onto [0, n) by its high bits (Lemire's multiply-shift).
func reduce(rnd uint64, n int) int {
	hi := (rnd >> 32) * uint64(n)
	return int(hi >> 32)
}

func checkWeight(name string, w float64) error {
	if math.IsNaN(w) || w < 0 || w > MaxWeight {
		return fmt.Errorf("%w: %s %g, want 0..%g", ErrConfig, name, w, MaxWeight)
	}
	return nil
}
