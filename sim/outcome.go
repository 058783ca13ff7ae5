package sim

import (
	"math"
	"math/bits"
	"slices"
	"time"
)

// durHist is a histogram of durations with relative error under 1/64: a bucket per
// power of two of nanoseconds, cut into 64 linear sub-buckets. It counts the
// inter-token gaps, one per generated token, too many to keep one by one.
type durHist struct {
	counts [64 * 64]int64
	total  int64
}

func durBucket(d time.Duration) int {
	ns := uint64(max(d, 1))
	e := bits.Len64(ns) - 1 // 2^e <= ns < 2^(e+1)
	if e < 6 {
		return int(ns) // exact below 64 ns
	}
	sub := (ns >> (e - 6)) & 63
	return (e-5)*64 + int(sub)
}

// bucketMid is a representative value of bucket i: its midpoint.
func bucketMid(i int) float64 {
	if i < 64 {
		return float64(i)
	}
	e := i/64 + 5
	sub := i % 64
	lo := math.Ldexp(float64(64+sub), e-6)
	return lo + math.Ldexp(0.5, e-6)
}

func (h *durHist) add(d time.Duration, n int64) {
	h.counts[min(durBucket(d), len(h.counts)-1)] += n
	h.total += n
}

// quantile returns the q-quantile in seconds (0 for an empty histogram).
func (h *durHist) quantile(q float64) float64 {
	if h.total == 0 {
		return 0
	}
	rank := int64(math.Ceil(q * float64(h.total)))
	rank = min(max(rank, 1), h.total)
	var seen int64
	for i, c := range h.counts {
		if seen += c; seen >= rank {
			return bucketMid(i) / 1e9
		}
	}
	return 0
}

// quantileOf returns the q-quantile of xs (sorted in place), nearest rank; 0 for none.
func quantileOf(xs []float64, q float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	slices.Sort(xs)
	rank := int(math.Ceil(q * float64(len(xs))))
	return xs[min(max(rank, 1), len(xs))-1]
}

// weightedQuantile returns the smallest index i with at least a q share of the total
// weight at or below it (0 for no weight).
func weightedQuantile(w []int64, q float64) int {
	var total int64
	for _, x := range w {
		total += x
	}
	if total == 0 {
		return 0
	}
	target := q * float64(total)
	var seen int64
	for i, x := range w {
		if seen += x; float64(seen) >= target {
			return i
		}
	}
	return len(w) - 1
}

// Latency is a distribution's p50, p90 and p99, in seconds.
type Latency struct {
	P50, P90, P99 float64
}

// TimedResult is one routing policy's run under time (Simulate).
type TimedResult struct {
	Routing Routing
	// Routers is the number of router replicas.
	Routers  int
	Requests int
	// HitBlocks of Blocks full prompt blocks, and ReusedTokens of Tokens prompt tokens,
	// were held by the engine that served the request when it first admitted it (the
	// zero-time model counts them at arrival).
	HitBlocks, Blocks, ReusedTokens, Tokens int64
	// ReplyHitBlocks of ReplyBlocks are the hit and full prompt blocks that an earlier
	// turn's reply completed (Request.FromReply), a part of HitBlocks and Blocks.
	ReplyHitBlocks, ReplyBlocks int64
	// Turns counts the requests that follow an earlier one's reply (Request.After),
	// and Waited those of them that arrived before it had finished (last token plus
	// the think time): held until then under the closed loop, sent early under the
	// open loop (TimedConfig.OpenLoop).
	Turns, Waited int64
	// OutputTokens is the tokens generated.
	OutputTokens int64
	// TTFT is time to first token (arrival at the router to the end of the step that
	// sampled it), ITL the gap between consecutive tokens of a request (one sample per
	// token after the first), E2E arrival to last token.
	TTFT, ITL, E2E Latency
	// Makespan is the simulated seconds from the first arrival to the last token.
	Makespan float64
	// OutputTokPerS is OutputTokens / Makespan. Goodput is the requests whose TTFT met
	// the SLO (TimedConfig.SLOTTFT) per second of Makespan, and SLOMet their share.
	OutputTokPerS, Goodput, SLOMet float64
	// KVUtilMean and KVUtilP90 are the fraction of the engines' KV blocks in use
	// (pinned by running requests), over time and engines (idle time counts as 0).
	KVUtilMean, KVUtilP90 float64
	// QueueMean, QueueP90 and QueueMax are the requests waiting at an engine, over time
	// and engines (P90 and Max: of one engine's queue).
	QueueMean float64
	QueueP90  int
	QueueMax  int
	// Preemptions counts the running requests the engines preempted (recompute).
	Preemptions int64
	// Steps counts engine steps, and BusyFrac is the share of engine time spent in
	// them.
	Steps    int64
	BusyFrac float64
	// Loads is the number of requests, and LoadTokens the prompt tokens, each worker
	// served.
	Loads, LoadTokens []int64
	// Index describes the side of the indexes the policy queries: the exact index fed
	// by events, and the replicas' own prediction indexes (their calls in
	// EngineSeconds, their queries counted when there is no exact index); zero for the
	// policies that query none (approximate-lru, the baselines).
	Index IndexStats
	// Stages are the ramp's stages, when the run had one (TimedConfig.Ramp).
	Stages []StageResult
	// Seconds is the wall time of the run.
	Seconds float64
}

// BlockHitRate is HitBlocks / Blocks.
func (r TimedResult) BlockHitRate() float64 { return ratio(r.HitBlocks, r.Blocks) }

// ReplyHitRate is ReplyHitBlocks / ReplyBlocks: the hits on blocks a reply completed.
func (r TimedResult) ReplyHitRate() float64 { return ratio(r.ReplyHitBlocks, r.ReplyBlocks) }

// PromptHitRate is the hit rate of the blocks no reply completed.
func (r TimedResult) PromptHitRate() float64 {
	return ratio(r.HitBlocks-r.ReplyHitBlocks, r.Blocks-r.ReplyBlocks)
}

// WaitedShare is Waited / Requests: the share of requests that arrived before the
// reply they repeat was complete.
func (r TimedResult) WaitedShare() float64 { return ratio(r.Waited, int64(r.Requests)) }

// TokenHitRate is ReusedTokens / Tokens.
func (r TimedResult) TokenHitRate() float64 { return ratio(r.ReusedTokens, r.Tokens) }

// MaxMeanLoad is the busiest worker's request count over the mean.
func (r TimedResult) MaxMeanLoad() float64 { return maxMean(r.Loads) }

// MaxMeanTokens is the busiest worker's prompt tokens over the mean.
func (r TimedResult) MaxMeanTokens() float64 { return maxMean(r.LoadTokens) }
