package sim

import (
	"fmt"
	"math"
	"math/rand/v2"
	"strings"

	"github.com/kvindex/kvindex/engine"
	"github.com/kvindex/kvindex/route"
)

// Policy is a routing policy of the zero-time model (Run): a row of package route's
// registry, the load it reads being the requests and prompt tokens assigned so far.
type Policy int

// The policies, in the order reports list them.
const (
	// KVAware is route.LongestPrefix (capped at ZeroTimeCap times the mean request
	// count) over the exact index's device prefix: longest-prefix/exact.
	KVAware Policy = iota
	// Random is route.Random, seeded by Config.Seed.
	Random
	// RoundRobin is route.RoundRobin.
	RoundRobin
	// LeastLoaded is route.LeastLoaded: the fewest assigned prompt tokens.
	LeastLoaded
	// KVAwarePredict is KVAware that also records each decision as a prediction
	// (engine.Predict, Config.PredictionTTL): longest-prefix/exact+predict.
	KVAwarePredict
	// Approximate is KVAware on predictions alone, the index getting no events:
	// longest-prefix/approx-ttl.
	Approximate
	// KVWeighted is KVAware scoring each worker by its weighted prefix over the tiers
	// (engine.Match.Weighted with Config.TierWeights, Dynamo's 1, 0.75, 0.25 by default)
	// instead of its device prefix alone: longest-prefix/exact:weighted-tiers.
	KVWeighted
	// KVAnyTier is KVAware scoring each worker by its prefix over every tier, a host
	// block counting as much as a device block (engine.Match.Score):
	// longest-prefix/exact:any-tier.
	KVAnyTier
)

// ZeroTimeCap is the zero-time longest-prefix policies' cap (route.LongestPrefix.Cap):
// a worker with 1.1 times the mean requests assigned is not eligible.
const ZeroTimeCap = 1.1

var policyNames = [...]string{"longest-prefix/exact", "random", "round-robin", "least-loaded",
	"longest-prefix/exact+predict", "longest-prefix/approx-ttl",
	"longest-prefix/exact:weighted-tiers", "longest-prefix/exact:any-tier"}

// zeroTimeAliases are the names earlier releases gave the zero-time policies.
var zeroTimeAliases = map[string]Policy{
	"kv-aware": KVAware, "kv-aware-predict": KVAwarePredict, "approximate": Approximate,
	"kv-weighted": KVWeighted, "kv-any-tier": KVAnyTier,
}

// Policies returns every policy, in report order.
func Policies() []Policy {
	return []Policy{KVAware, Random, RoundRobin, LeastLoaded, KVAwarePredict, Approximate, KVWeighted, KVAnyTier}
}

// queries reports whether the policy asks the index.
func (p Policy) queries() bool {
	return p == KVAware || p == KVAwarePredict || p == Approximate || p == KVWeighted || p == KVAnyTier
}

// score is a match's score under a policy that queries: the device prefix (KVAware,
// KVAwarePredict, Approximate; predictions count as device blocks), the weighted
// prefix (KVWeighted) or the prefix over every tier (KVAnyTier). Without tiers all
// three are the match's Score.
func (p Policy) score(m *engine.Match, w engine.Weights) float64 {
	switch p {
	case KVWeighted:
		return m.Weighted(w)
	case KVAnyTier:
		return float64(m.Score)
	default:
		return float64(m.Tiers[engine.TierDevice])
	}
}

// predicts reports whether the policy records its decisions as predictions.
func (p Policy) predicts() bool { return p == KVAwarePredict || p == Approximate }

func (p Policy) String() string {
	if p >= 0 && int(p) < len(policyNames) {
		return policyNames[p]
	}
	return fmt.Sprintf("Policy(%d)", int(p))
}

// ParsePolicy returns the policy named s (as String spells it, or an old name).
func ParsePolicy(s string) (Policy, error) {
	for i, n := range policyNames {
		if s == n {
			return Policy(i), nil
		}
	}
	if p, ok := zeroTimeAliases[s]; ok {
		return p, nil
	}
	return 0, fmt.Errorf("sim: unknown zero-time policy %q (want one of %s)", s, strings.Join(policyNames[:], ", "))
}

// route returns the policy's route policy.
func (p Policy) route() route.Policy {
	switch p {
	case Random:
		return route.Random{}
	case RoundRobin:
		return &route.RoundRobin{}
	case LeastLoaded:
		return route.LeastLoaded{}
	}
	return route.LongestPrefix{Cap: ZeroTimeCap}
}

// scoreScale turns a (possibly tier-weighted, fractional) prefix score into the whole
// Overlap route.LongestPrefix compares: orders scores to 1/1024 of a block.
const scoreScale = 1024

// router holds a policy's state: the requests and prompt tokens assigned to each
// worker, which are the load its route policy reads.
type router struct {
	policy route.Policy
	loads  []int64 // requests
	tokens []int64 // prompt tokens
	total  int64
	rng    *rand.Rand
	cands  []route.Candidate
}

func newRouter(p Policy, workers int, seed uint64) *router {
	return &router{
		policy: p.route(),
		loads:  make([]int64, workers),
		tokens: make([]int64, workers),
		rng:    rand.New(rand.NewPCG(seed, 0x726f75746572)), // "router"
		cands:  make([]route.Candidate, workers),
	}
}

// pick chooses a worker for a request of tokens prompt tokens and counts the request
// against it. scores[i] is worker i's matched prefix in blocks, weighted or not (nil
// for the policies that do not query).
func (r *router) pick(scores []float64, tokens int) int {
	for i := range r.cands {
		c := &r.cands[i]
		*c = route.Candidate{Load: route.Load{Requests: int(r.loads[i]), Tokens: r.tokens[i]}}
		if scores != nil {
			c.Overlap = int(math.Round(scores[i] * scoreScale))
		}
	}
	// Ties go to the lowest index (rnd 0: the first of the tied), as the conformance
	// logs of gen-ops were made; only the random policy draws.
	var rnd uint64
	if _, ok := r.policy.(route.Random); ok {
		rnd = r.rng.Uint64()
	}
	w := r.policy.Pick(route.Request{Tokens: tokens}, r.cands, rnd)
	r.loads[w]++
	r.tokens[w] += int64(tokens)
	r.total++
	return w
}
