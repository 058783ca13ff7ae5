package route

import (
	"fmt"
	"math"
)

// LongestPrefix sends a request to the worker holding the longest prefix of it, among
// those whose requests in flight (Load.Requests) are under Cap times the mean; ties
// go to the fewest requests, then by rnd. Cap 0 considers every worker. It is the
// simplest cache-aware router (SGLang's cache-aware policy and the vLLM production
// stack's prefix-aware one balance with a cap of this kind: sgl-project/sglang
// sgl-router/src/policies/cache_aware.rs, balance_rel_threshold), and the one whose
// hit rates the zero-time simulation measures (capped at 1.1).
//
// Where it differs from SGLang: the prefix comes from the index (SGLang keeps an
// approximate radix tree of the text it routed); the cap is relative only (SGLang also
// has an absolute one, balance_abs_threshold) and, when nobody is under it, the
// longest prefix still wins rather than the least loaded.
type LongestPrefix struct {
	Cap float64
}

// MaxCap bounds LongestPrefix's Cap.
const MaxCap = 1e6

// NewLongestPrefix returns a LongestPrefix with the given cap (0: none, else >= 1).
func NewLongestPrefix(capRatio float64) (LongestPrefix, error) {
	if !(capRatio == 0 || capRatio >= 1 && capRatio <= MaxCap) {
		return LongestPrefix{}, fmt.Errorf("%w: longest-prefix cap %g, want 0 or 1..%g", ErrConfig, capRatio, MaxCap)
	}
	return LongestPrefix{Cap: capRatio}, nil
}

// Name implements Policy.
func (LongestPrefix) Name() string { return FamilyLongestPrefix }

// Pick implements Policy.
func (p LongestPrefix) Pick(req Request, cands []Candidate, rnd uint64) int {
	total := 0
	for i := range cands {
		total += cands[i].Load.Requests
	}
	limit := math.Inf(1)
	if p.Cap > 0 && total > 0 && len(cands) > 0 {
		limit = p.Cap * float64(total) / float64(len(cands))
	}
	// The overlap first, then fewer requests: overlaps and request counts are far
	// below 2^20, so one float orders both exactly.
	key := func(c *Candidate) float64 {
		return float64(c.Overlap)*(1<<21) - float64(min(c.Load.Requests, 1<<20))
	}
	var buf [64]float64
	vals := buf[:0]
	eligible := false
	for i := range cands {
		if float64(cands[i].Load.Requests) >= limit {
			vals = append(vals, math.Inf(-1))
			continue
		}
		eligible = true
		vals = append(vals, key(&cands[i]))
	}
	if !eligible { // nobody under the cap: the longest prefix still wins
		for i := range cands {
			vals[i] = key(&cands[i])
		}
	}
	return pickBest(vals, rnd, true)
}
