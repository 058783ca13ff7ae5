package sim

import (
	"fmt"
	"math/rand/v2"
	"strings"

	"github.com/kvindex/kvindex/engine"
)

// Policy is a routing policy.
type Policy int

// The policies, in the order reports list them.
const (
	// KVAware sends a request to the worker with the longest cached prefix (asked of the
	// index with FindMatches) among those whose assigned request count is under 1.1
	// times the mean; ties go to the least loaded, then the lowest index.
	KVAware Policy = iota
	// Random picks a worker uniformly with a generator seeded by Config.Seed.
	Random
	// RoundRobin cycles through the workers in order.
	RoundRobin
	// LeastLoaded picks the worker with the fewest assigned prompt tokens, then the
	// lowest index. (By request count it would be round-robin: every request counts 1.)
	LeastLoaded
	// KVAwarePredict is KVAware that also records each decision as a prediction
	// (engine.Predict, Config.PredictionTTL): the requests that arrive before the chosen
	// worker's events see where their prefix is going.
	KVAwarePredict
	// Approximate is KVAware on predictions alone: the index gets no events, only the
	// router's own decisions (approximate routing, for engines that publish nothing).
	Approximate
	// KVWeighted is KVAware scoring each worker by its weighted prefix over the tiers
	// (engine.Match.Weighted with Config.TierWeights, Dynamo's 1, 0.75, 0.25 by default)
	// instead of its device prefix alone.
	KVWeighted
	// KVAnyTier is KVAware scoring each worker by its prefix over every tier, a host
	// block counting as much as a device block (engine.Match.Score).
	KVAnyTier
)

var policyNames = [...]string{"kv-aware", "random", "round-robin", "least-loaded", "kv-aware-predict", "approximate", "kv-weighted", "kv-any-tier"}

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

// ParsePolicy returns the policy named s (as String spells it).
func ParsePolicy(s string) (Policy, error) {
	for i, n := range policyNames {
		if s == n {
			return Policy(i), nil
		}
	}
	return 0, fmt.Errorf("sim: unknown policy %q (want one of %s)", s, strings.Join(policyNames[:], ", "))
}

// router holds a policy's state: the requests and prompt tokens assigned to each worker.
type router struct {
	policy Policy
	loads  []int64 // requests
	tokens []int64 // prompt tokens
	total  int64
	rng    *rand.Rand
	next   int
}

func newRouter(p Policy, workers int, seed uint64) *router {
	return &router{
		policy: p,
		loads:  make([]int64, workers),
		tokens: make([]int64, workers),
		rng:    rand.New(rand.NewPCG(seed, 0x726f75746572)), // "router"
	}
}

// pick chooses a worker for a request of tokens prompt tokens and counts the request
// against it. scores[i] is worker i's matched prefix in blocks, weighted or not (only
// the policies that query read it).
func (r *router) pick(scores []float64, tokens int) int {
	var w int
	switch r.policy {
	case KVAware, KVAwarePredict, Approximate, KVWeighted, KVAnyTier:
		w = r.kvAware(scores)
	case Random:
		w = r.rng.IntN(len(r.loads))
	case RoundRobin:
		w = r.next
		r.next = (r.next + 1) % len(r.loads)
	default:
		w = r.leastLoaded()
	}
	r.loads[w]++
	r.tokens[w] += int64(tokens)
	r.total++
	return w
}

func (r *router) leastLoaded() int {
	best := 0
	for i, l := range r.tokens {
		if l < r.tokens[best] {
			best = i
		}
	}
	return best
}

func (r *router) kvAware(scores []float64) int {
	n := int64(len(r.loads))
	best := -1
	for i, l := range r.loads {
		// l < 1.1 * total/n, in integers: 10*l*n < 11*total. Before the first
		// request nobody is under the mean; then every worker is eligible.
		if r.total > 0 && 10*l*n >= 11*r.total {
			continue
		}
		if best < 0 || scores[i] > scores[best] || (scores[i] == scores[best] && l < r.loads[best]) {
			best = i
		}
	}
	return best
}
