package route

import (
	"fmt"
	"math"
)

// Scorer weights. The defaults are those of llm-d's benchmarked configurations.
const (
	DefaultPrefixWeight = 2.0
	DefaultKVWeight     = 1.0
	DefaultQueueWeight  = 1.0
)

// Scorer is llm-d's weighted scoring (llm-d/llm-d-router
// pkg/epp/framework/plugins/scheduling/scorer/preciseprefixcache/precise_prefix_cache.go,
// Scorer.Score; GIE's kv-cache-utilization-scorer and queue-scorer). For each worker,
//
//	score = PrefixWeight * prefix + KVWeight * (1 - Load.KVUtil) + QueueWeight * queue
//	queue = (max Waiting - Waiting) / (max Waiting - min Waiting), 1 when all equal
//
// and the highest score wins, ties by rnd. The prefix score is Overlap / the request's
// full blocks, as llm-d's precise scorer now normalises (absoluteScoredPods: "score /
// totalBlocks, clipped to [0, 1]") and GIE's approximate prefix plugin always has;
// with MinMax it is the earlier precise scorer's (llm-d/llm-d-inference-scheduler
// pkg/plugins/scorer/utils.go, indexedScoresToNormalizedScoredPods): the workers
// holding some of the prefix min-max normalised among themselves, (Overlap - min) /
// (max - min), 1 for all when they hold the same, 0 for the workers holding none.
//
// Where it differs from llm-d: the prefix is in blocks of the index (llm-d's precise
// scorer counts blocks of its own tokenisation, weighted by tier in later versions);
// Waiting and KVUtil are whatever the caller fills (a Tracker's estimate, or the
// engines' metrics), read at pick time rather than at llm-d's scrape interval. The
// zero value has the default weights and the absolute prefix score.
type Scorer struct {
	PrefixWeight, KVWeight, QueueWeight float64
	MinMax                              bool
}

// NewScorer returns a Scorer with the given weights, or an error for a negative,
// non-finite or larger than MaxWeight one. All three zero means the defaults.
func NewScorer(prefix, kv, queue float64, minMax bool) (Scorer, error) {
	for _, w := range []struct {
		name string
		v    float64
	}{{"prefix weight", prefix}, {"KV weight", kv}, {"queue weight", queue}} {
		if err := checkWeight(w.name, w.v); err != nil {
			return Scorer{}, err
		}
	}
	return Scorer{PrefixWeight: prefix, KVWeight: kv, QueueWeight: queue, MinMax: minMax}, nil
}

// Name implements Policy.
func (s Scorer) Name() string {
	if s.PrefixWeight == 0 && (s.KVWeight != 0 || s.QueueWeight != 0) {
		return FamilyLLMDLoad
	}
	return FamilyLLMDScorer
}

func (s Scorer) weights() (p, kv, q float64) {
	if s.PrefixWeight == 0 && s.KVWeight == 0 && s.QueueWeight == 0 {
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
	minP, maxP := math.MaxInt, 0 // over the workers holding some prefix
	for i := range cands {
		minQ, maxQ = min(minQ, cands[i].Load.Waiting), max(maxQ, cands[i].Load.Waiting)
		if ov := req.overlap(&cands[i]); ov > 0 {
			minP, maxP = min(minP, ov), max(maxP, ov)
		}
	}
	full := req.fullBlocks()
	for i := range cands {
		l := &cands[i].Load
		ov := req.overlap(&cands[i])
		prefix := 0.0
		switch {
		case !s.MinMax && full > 0:
			prefix = float64(ov) / float64(full)
		case s.MinMax && ov > 0 && maxP == minP:
			prefix = 1
		case s.MinMax && ov > 0:
			prefix = float64(ov-minP) / float64(maxP-minP)
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

// llm-d's sticky-until-saturated defaults (llm-d/llm-d-router
// pkg/epp/framework/plugins/scheduling/filter/prefixcacheaffinity/plugin.go,
// DefaultConfig; pkg/epp/framework/plugins/scheduling/scorer/tokenload/token_load.go).
const (
	// DefaultAffinityThreshold is the prefix share at which a worker is sticky.
	DefaultAffinityThreshold = 0.80
	// DefaultPeakPrefillThroughput is the prefill rate, in tokens per second, that
	// turns in-flight tokens into an estimated time to first token (llm-d's
	// calibration of Qwen3-32B on two H100s, TP 2).
	DefaultPeakPrefillThroughput = 15928.0
	// DefaultMaxTTFTPenalty is how much later, in milliseconds, the best sticky
	// worker's estimated first token may come than the best other worker's before
	// stickiness breaks.
	DefaultMaxTTFTPenaltyMs = 18000.0
	// DefaultQueueThresholdTokens is the token load at which the token-load score
	// reaches 0 (128 requests of 32K tokens).
	DefaultQueueThresholdTokens = 4194304
)

// Affinity is llm-d's "sticky until saturated" default: the prefix-cache-affinity
// filter, then the token-load scorer (llm-d/llm-d-router
// pkg/epp/framework/plugins/scheduling/filter/prefixcacheaffinity/plugin.go and
// pkg/epp/framework/plugins/scheduling/scorer/tokenload/token_load.go; the
// optimized-baseline guide of llm-d/llm-d). The filter keeps the sticky workers,
// those holding at least Threshold of the request's full blocks, unless none is, or
// the best sticky one's estimated time to first token,
//
//	TTFT ms = Load.UncachedTokens / PeakPrefillThroughput * 1000,
//
// exceeds the best other one's by more than MaxTTFTPenaltyMs: then it keeps all. Among
// those kept the token-load scorer picks the highest
//
//	score = 1 - min(Load.UncachedTokens + req.Tokens - Overlap*BlockSize, QueueThresholdTokens) / QueueThresholdTokens
//
// (1 for a worker with no load), ties by rnd.
//
// Where it differs from llm-d: no exploration probability (llm-d's default is 0 too);
// the prefix share is in the index's blocks, not llm-d's approximate producer's; the
// in-flight tokens are the Tracker's, counted from routing until Finished. The zero
// value has llm-d's defaults.
type Affinity struct {
	Threshold             float64
	PeakPrefillThroughput float64
	MaxTTFTPenaltyMs      float64
	QueueThresholdTokens  int64
}

// NewAffinity returns an Affinity, zero fields taking llm-d's defaults, or an error
// for a threshold outside [0, 1] or a negative or non-finite rate, penalty or token
// threshold.
func NewAffinity(a Affinity) (Affinity, error) {
	switch {
	case !(a.Threshold >= 0 && a.Threshold <= 1):
		return Affinity{}, fmt.Errorf("%w: affinity threshold %g, want 0..1", ErrConfig, a.Threshold)
	case !(a.PeakPrefillThroughput >= 0 && a.PeakPrefillThroughput <= 1e12):
		return Affinity{}, fmt.Errorf("%w: peak prefill throughput %g tokens/s, want 0..1e12", ErrConfig, a.PeakPrefillThroughput)
	case !(a.MaxTTFTPenaltyMs >= 0 && a.MaxTTFTPenaltyMs <= 1e9):
		return Affinity{}, fmt.Errorf("%w: max TTFT penalty %g ms, want 0..1e9", ErrConfig, a.MaxTTFTPenaltyMs)
	case a.QueueThresholdTokens < 0:
		return Affinity{}, fmt.Errorf("%w: queue threshold %d tokens, want >= 0", ErrConfig, a.QueueThresholdTokens)
	}
	return a.withDefaults(), nil
}

func (a Affinity) withDefaults() Affinity {
	if a.Threshold == 0 {
		a.Threshold = DefaultAffinityThreshold
	}
	if a.PeakPrefillThroughput == 0 {
		a.PeakPrefillThroughput = DefaultPeakPrefillThroughput
	}
	if a.MaxTTFTPenaltyMs == 0 {
		a.MaxTTFTPenaltyMs = DefaultMaxTTFTPenaltyMs
	}
	if a.QueueThresholdTokens == 0 {
		a.QueueThresholdTokens = DefaultQueueThresholdTokens
	}
	return a
}

// Name implements Policy.
func (Affinity) Name() string { return FamilyLLMDAffinity }

// Sticky reports which candidates the affinity filter keeps, into dst.
func (a Affinity) Sticky(req Request, cands []Candidate, dst []bool) []bool {
	a = a.withDefaults()
	dst = dst[:0]
	full := req.fullBlocks()
	bestSticky, bestOther := math.Inf(1), math.Inf(1)
	any := false
	for i := range cands {
		share := 0.0
		if full > 0 {
			share = float64(req.overlap(&cands[i])) / float64(full)
		}
		s := share >= a.Threshold
		ttft := float64(max(cands[i].Load.UncachedTokens, 0)) / a.PeakPrefillThroughput * 1000
		if s {
			bestSticky, any = min(bestSticky, ttft), true
		} else {
			bestOther = min(bestOther, ttft)
		}
		dst = append(dst, s)
	}
	if !any || bestSticky-bestOther > a.MaxTTFTPenaltyMs {
		for i := range dst {
			dst[i] = true
		}
	}
	return dst
}

// TokenLoads returns each candidate's token-load score, into dst.
func (a Affinity) TokenLoads(req Request, cands []Candidate, dst []float64) []float64 {
	a = a.withDefaults()
	dst = dst[:0]
	limit := float64(a.QueueThresholdTokens)
	for i := range cands {
		load := float64(max(cands[i].Load.UncachedTokens, 0) + int64(max(req.Tokens-req.overlap(&cands[i])*req.BlockSize, 0)))
		dst = append(dst, 1-min(load, limit)/limit)
	}
	return dst
}

// Pick implements Policy.
func (a Affinity) Pick(req Request, cands []Candidate, rnd uint64) int {
	var kb [64]bool
	var sb [64]float64
	keep := a.Sticky(req, cands, kb[:0])
	scores := a.TokenLoads(req, cands, sb[:0])
	for i := range scores {
		if !keep[i] {
			scores[i] = math.Inf(-1)
		}
	}
	return pickBest(scores, rnd, true)
}
