package route

import (
	"fmt"
	"math"
)

// DefaultOverlapWeight is Cost's default OverlapWeight: Dynamo's default
// kv-overlap-score-weight (router_kv_overlap_score_weight, 1.0).
const DefaultOverlapWeight = 1.0

// MaxTemperature bounds Cost's Temperature.
const MaxTemperature = 100.0

// Cost is NVIDIA Dynamo's KV router cost (ai-dynamo/dynamo at
// a4bdb9bfa1eed0afd4d67331f0938f9d5e3b58ed: DefaultWorkerScorer::worker_logit,
// minimum_cost_index and softmax_sample_index in
// lib/kv-router/src/scheduling/selector/default.rs; the loads of
// WorkerLoadProjection, potential_decode_blocks, in
// lib/kv-router/src/sequences/prompt_registry.rs and single.rs). For each worker,
// with the request placed there:
//
//	logit          = OverlapWeight * prefill blocks + decode blocks
//	prefill blocks = (Load.PrefillTokens + req.Tokens - Overlap*BlockSize) / BlockSize
//	decode blocks  = Load.ActiveBlocks + (the request's blocks - ActiveOverlap)
//
// which is Dynamo's prefill_load_scale x max(0, raw_prefill_blocks -
// overlap_score_credit x device_overlap_blocks) + decode_cost_blocks +
// decode_active_request_weight x active_requests at its defaults (scheduling/config.rs:
// credit 1, credit decay 0, scale 1, active-request weight 0). PrefillTokens is the
// uncached prompt tokens of the requests routed there with no first token yet
// (Dynamo's active_prefill_tokens, which decay only under router_prefill_load_model
// "aic", off by default: sequences/prefill_tracker.rs); ActiveBlocks the distinct
// blocks (by hash) the requests in flight there hold, so a block shared by many
// requests, or already active for this one, costs once. With Temperature 0 the least
// logit wins, ties uniformly by rnd (as Dynamo's minimum_cost_index draws among
// them); above 0 a worker is drawn with probability
// softmax(-logit / (max - min) / Temperature), as Dynamo's softmax_sample_index.
//
// Where it differs from Dynamo: a request without block hashes adds its full block
// count (Dynamo adds none); output blocks are not counted (Dynamo's default,
// router_track_output_blocks off); host and disk tiers get no credit of their own
// (Dynamo's host_cache_hit_weight 0.75 and disk_cache_hit_weight 0.25: the caller's
// Overlap may weigh tiers so); data-parallel ranks are separate candidates only if
// the caller makes them so. The zero value has weight DefaultOverlapWeight and
// temperature 0.
type Cost struct {
	OverlapWeight float64
	Temperature   float64
}

// NewCost returns a Cost with the given overlap weight (0: the default) and
// temperature, or an error for a negative, non-finite or too large one.
func NewCost(overlapWeight, temperature float64) (Cost, error) {
	if err := checkWeight("overlap weight", overlapWeight); err != nil {
		return Cost{}, err
	}
	if !(temperature >= 0 && temperature <= MaxTemperature) {
		return Cost{}, fmt.Errorf("%w: temperature %g, want 0..%g", ErrConfig, temperature, MaxTemperature)
	}
	return Cost{OverlapWeight: overlapWeight, Temperature: temperature}, nil
}

// Name implements Policy.
func (Cost) Name() string { return FamilyDynamoCost }

// Costs returns each candidate's logit in blocks, into dst (reused when large enough).
func (c Cost) Costs(req Request, cands []Candidate, dst []float64) []float64 {
	w := c.OverlapWeight
	if w == 0 {
		w = DefaultOverlapWeight
	}
	dst = dst[:0]
	bs := float64(max(req.BlockSize, 1))
	reqBlocks := req.blocks()
	for i := range cands {
		l := &cands[i].Load
		prefill := float64(max(l.PrefillTokens, 0)+int64(req.Tokens)-int64(req.overlap(&cands[i]))*int64(req.BlockSize)) / bs
		fresh := reqBlocks - min(max(int64(cands[i].ActiveOverlap), 0), reqBlocks)
		decode := float64(max(l.ActiveBlocks, 0) + fresh)
		dst = append(dst, w*prefill+decode)
	}
	return dst
}

// Pick implements Policy: the least logit, ties broken by rnd; or, with a
// temperature, a softmax draw by rnd.
func (c Cost) Pick(req Request, cands []Candidate, rnd uint64) int {
	var buf [64]float64
	costs := c.Costs(req, cands, buf[:0])
	if c.Temperature > 0 {
		return softmaxPick(costs, c.Temperature, rnd)
	}
	return pickBest(costs, rnd, false)
}

// softmaxPick draws an index with probability proportional to
// exp(-v/(max-min)/temperature) (lower values likelier), uniformly when all are equal,
// by unit(rnd): Dynamo's softmax_sample.
func softmaxPick(vals []float64, temperature float64, rnd uint64) int {
	if len(vals) == 0 {
		return -1
	}
	lo, hi := vals[0], vals[0]
	for _, v := range vals {
		lo, hi = min(lo, v), max(hi, v)
	}
	if lo == hi {
		return reduce(rnd, len(vals))
	}
	// The largest scaled value is -lo/(hi-lo)/T; subtracting it keeps exp in (0, 1].
	top := -lo / (hi - lo) / temperature
	sum := 0.0
	for _, v := range vals {
		sum += math.Exp(-v/(hi-lo)/temperature - top)
	}
	u, acc := unit(rnd)*sum, 0.0
	for i, v := range vals {
		acc += math.Exp(-v/(hi-lo)/temperature - top)
		if u < acc {
			return i
		}
	}
	return len(vals) - 1
}
