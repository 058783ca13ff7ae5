package route

import (
	"fmt"
	"math"
)

// Dynamo's router queue parameters (ai-dynamo/dynamo lib/kv-router/src/scheduling/queue.rs,
// DEFAULT_MAX_BATCHED_TOKENS; router_queue_threshold in scheduling/config.rs). Dynamo
// ships the queue off: router_queue_threshold is unset by default (KvRouterConfig::default,
// and --router-queue-threshold in components/src/dynamo/common/configuration/groups/
// kv_router_args.py at 021d6169e7d13b9efdf45110b0697cb3cf0fc309: "Unset by default;
// setting a numeric value enables router queueing").
const (
	// DefaultQueueThreshold is the threshold NewQueue takes for 0: the fraction of a
	// worker's batched-token budget its prefill tokens in flight must exceed for the
	// worker to be busy, 16 (the router_queue_threshold Dynamo's configuration
	// defaulted to where it set one, scheduling/config.rs at
	// 0243c51bb6e8958be89df4978b5761677c9adc23).
	DefaultQueueThreshold = 16.0
	// DefaultMaxBatchedTokens is the budget of a worker that does not publish its
	// max_num_batched_tokens: Dynamo's DEFAULT_MAX_BATCHED_TOKENS, 10,000,000, large
	// enough that such a worker is never busy.
	DefaultMaxBatchedTokens = 10_000_000
	// MaxQueueThreshold bounds Queue's Threshold.
	MaxQueueThreshold = 1e6
	// MaxQueueLen bounds the requests a Queue holds.
	MaxQueueLen = 1 << 24
)

// Queue is Dynamo's router queue (ai-dynamo/dynamo lib/kv-router/src/scheduling/queue.rs,
// SchedulerQueue with the default first-come-first-served policy): a request that
// arrives while every worker is busy waits at the router, and the waiting requests
// are routed, oldest first, each time a worker's load drops (Dynamo calls update on
// every prefill completion and every free) for as long as some worker is not busy.
// A worker is busy when its prefill tokens in flight (Load.PrefillTokens: the
// uncached prompt tokens of its requests with no first token yet, Dynamo's
// active_tokens) exceed Threshold times its batched-token budget
// (MaxBatchedTokens: vLLM's max_num_batched_tokens, which Dynamo's workers publish).
// A request is routed with the load as it is when it leaves the queue, so it
// follows the freed capacity.
//
// Where it differs from Dynamo: one budget for every worker (Dynamo reads each
// worker's); no priority bumps (Dynamo's fcfs orders by arrival less a per-request
// priority_jump, zero unless the request sets one), and no lcfs or wspt ordering; no
// cap on the queued tokens (router_queue_by_incoming_missing_isl, unbounded by
// default in Dynamo too) beyond MaxQueueLen. The zero value is not usable; NewQueue
// makes one. Not safe for concurrent use: its owner (a router's routing loop)
// serialises Push, Pop and Busy.
type Queue[T any] struct {
	threshold float64
	budget    float64 // threshold x max batched tokens, in tokens
	items     []T
	head      int
}

// NewQueue returns an empty Queue whose workers are busy past threshold (0: the
// default, DefaultQueueThreshold) times maxBatchedTokens (0: DefaultMaxBatchedTokens)
// prefill tokens in flight. Dynamo's threshold 0.0, busy at any prefill in flight, is
// any threshold below 1/maxBatchedTokens.
func NewQueue[T any](threshold float64, maxBatchedTokens int64) (*Queue[T], error) {
	if threshold == 0 {
		threshold = DefaultQueueThreshold
	}
	if maxBatchedTokens == 0 {
		maxBatchedTokens = DefaultMaxBatchedTokens
	}
	switch {
	case !(threshold > 0 && threshold <= MaxQueueThreshold):
		return nil, fmt.Errorf("%w: queue threshold %g, want 0..%g", ErrConfig, threshold, MaxQueueThreshold)
	case maxBatchedTokens < 1 || maxBatchedTokens > math.MaxInt32:
		return nil, fmt.Errorf("%w: max batched tokens %d, want 1..%d", ErrConfig, maxBatchedTokens, math.MaxInt32)
	}
	return &Queue[T]{threshold: threshold, budget: threshold * float64(maxBatchedTokens)}, nil
}

// Threshold returns the queue's threshold.
func (q *Queue[T]) Threshold() float64 { return q.threshold }

// Busy reports whether every candidate is busy: its prefill tokens in flight above
// the budget. No candidates is not busy, so that a request finds out there is nowhere
// to route it (Dynamo's checked_any).
func (q *Queue[T]) Busy(cands []Candidate) bool {
	for i := range cands {
		if float64(cands[i].Load.PrefillTokens) <= q.budget {
			return false
		}
	}
	return len(cands) > 0
}

// Push parks a request at the back of the queue; false when MaxQueueLen wait already.
func (q *Queue[T]) Push(item T) bool {
	if q.Len() >= MaxQueueLen {
		return false
	}
	if q.head > 0 && q.head*2 >= len(q.items) {
		n := copy(q.items, q.items[q.head:])
		clear(q.items[n:])
		q.items, q.head = q.items[:n], 0
	}
	q.items = append(q.items, item)
	return true
}

// Pop takes the oldest request waiting, if any.
func (q *Queue[T]) Pop() (T, bool) {
	var zero T
	if q.head == len(q.items) {
		return zero, false
	}
	it := q.items[q.head]
	q.items[q.head] = zero
	q.head++
	return it, true
}

// Len returns the number of requests waiting.
func (q *Queue[T]) Len() int { return len(q.items) - q.head }
