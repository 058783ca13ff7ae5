package route

import (
	"errors"
	"fmt"
	"math"
	"sync/atomic"
)

// Load is what a router knows of one worker's load. The counts are the router's own
// view (a Tracker fills them from the requests it routed, and from the other replicas'
// when load is shared); Waiting and KVUtil are the worker's queue and KV use, either
// the Tracker's estimate or, better, what the worker itself reports (vLLM's
// num_requests_waiting and kv_cache_usage_perc) laid over it.
type Load struct {
	// Requests counts the requests routed to the worker and not finished, and Tokens
	// their prompt tokens.
	Requests int
	Tokens   int64
	// UncachedTokens is the part of Tokens the router expected to be computed: the
	// prompt tokens of the unfinished requests less the cache hits the router counted
	// on when it routed them (llm-d's in-flight token load).
	UncachedTokens int64
	// PrefillTokens is the part of UncachedTokens still to prefill: that of the
	// requests with no first token yet (Dynamo's active prefill tokens).
	PrefillTokens int64
	// Prefilling counts the requests with no first token yet.
	Prefilling int
	// ActiveBlocks is the KV blocks the unfinished requests hold, each distinct block
	// (by hash) counted once however many requests share it (Dynamo's active blocks).
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
	// ActiveOverlap is how many of the request's blocks (Request.Blocks) are already
	// held by requests in flight on the worker (Tracker.Candidates fills it): Dynamo
	// charges a request only for the blocks not already active. Zero charges them all.
	ActiveOverlap int
	Load          Load
}

// Request is what a policy knows of the request it places.
type Request struct {
	// Tokens is the prompt length in tokens, and BlockSize the workers' KV block size
	// (a block of the overlap holds BlockSize tokens).
	Tokens, BlockSize int
	// Blocks, when known, are the hashes of the prompt's full blocks in order (any
	// chained hash: equal prefixes, equal hashes). The Tracker counts a worker's
	// active blocks by them; without them a request's blocks count as its own.
	Blocks []uint64
}

// blocks is the number of KV blocks the request adds to a worker's active ones before
// sharing: its hashed blocks, or without hashes every block of the prompt, its partial
// last block included.
func (r Request) blocks() int64 {
	if len(r.Blocks) > 0 {
		return int64(len(r.Blocks))
	}
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

// overlap is c's overlap bounded to [0, the request's full blocks].
func (r Request) overlap(c *Candidate) int { return min(max(c.Overlap, 0), r.fullBlocks()) }

// Policy picks a worker for a request.
type Policy interface {
	// Name is the policy's family name as the registry spells it (Families).
	Name() string
	// Pick returns the index in cands of the worker to route req to, or -1 when cands
	// is empty. rnd is a random number that breaks ties (and samples, for a policy
	// with a temperature): equal rnd, equal inputs, equal pick.
	Pick(req Request, cands []Candidate, rnd uint64) int
}

// ErrConfig wraps every invalid policy parameter.
var ErrConfig = errors.New("route: invalid config")

// MaxWeight bounds every weight a policy takes.
const MaxWeight = 1e6

// LeastLoaded picks the worker with the fewest prompt tokens in flight (Load.Tokens),
// ties broken by rnd. It ignores the cache.
type LeastLoaded struct{}

// Name implements Policy.
func (LeastLoaded) Name() string { return FamilyLeastLoaded }

// Pick implements Policy.
func (LeastLoaded) Pick(_ Request, cands []Candidate, rnd uint64) int {
	var buf [64]float64
	vals := buf[:0]
	for i := range cands {
		vals = append(vals, float64(cands[i].Load.Tokens))
	}
	return pickBest(vals, rnd, false)
}

// Random picks a worker uniformly with rnd.
type Random struct{}

// Name implements Policy.
func (Random) Name() string { return FamilyRandom }

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
func (*RoundRobin) Name() string { return FamilyRoundRobin }

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
	if ties <= 1 {
		return best
	}
	k := reduce(rnd, ties)
	for i, v := range vals {
		if v == vals[best] {
			if k == 0 {
				return i
			}
			k--
		}
	}
	return best
}

// reduce maps rnd uniformly onto [0, n) by its high bits (Lemire's multiply-shift).
func reduce(rnd uint64, n int) int {
	hi := (rnd >> 32) * uint64(n)
	return int(hi >> 32)
}

// unit maps rnd onto [0, 1) by its low 53 bits (its high bits break ties).
func unit(rnd uint64) float64 { return float64(rnd&(1<<53-1)) / (1 << 53) }

func checkWeight(name string, w float64) error {
	if math.IsNaN(w) || w < 0 || w > MaxWeight {
		return fmt.Errorf("%w: %s %g, want 0..%g", ErrConfig, name, w, MaxWeight)
	}
	return nil
}
