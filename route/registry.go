package route

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"
)

// The policy families: how a router turns what it knows into a pick.
const (
	// FamilyDynamoCost is Cost: NVIDIA Dynamo's KV router.
	FamilyDynamoCost = "dynamo-cost"
	// FamilyLLMDScorer is Scorer: llm-d's weighted prefix, KV-use and queue scorers.
	FamilyLLMDScorer = "llmd-scorer"
	// FamilyLLMDAffinity is Affinity: llm-d's sticky-until-saturated default.
	FamilyLLMDAffinity = "llmd-affinity"
	// FamilyLLMDLoad is Scorer without the prefix: llm-d's load-only scheduling.
	FamilyLLMDLoad = "llmd-load"
	// FamilyLongestPrefix is LongestPrefix.
	FamilyLongestPrefix = "longest-prefix"
	// FamilyLeastLoaded, FamilyRoundRobin and FamilyRandom are the cache-blind
	// baselines.
	FamilyLeastLoaded = "least-loaded"
	FamilyRoundRobin  = "round-robin"
	FamilyRandom      = "random"
)

// Knowledge is where a router's picture of the workers' caches comes from.
type Knowledge string

// The knowledge sources.
const (
	// Blind: none (the cache-blind families).
	Blind Knowledge = ""
	// Exact: the index, fed by the engines' KV events.
	Exact Knowledge = "exact"
	// ExactPredict: the index, and each routed request's blocks recorded on its
	// worker for a short time (the events' delay plus a margin), bridging the delay.
	ExactPredict Knowledge = "exact+predict"
	// ExactSticky: the index, and each routed request's blocks recorded on its worker
	// for DefaultStickyTTL: the router keeps sending a conversation where it sent it
	// even when an early eviction event says part of it left (llm-d's PreRequest
	// speculative entries, in spirit).
	ExactSticky Knowledge = "exact+sticky"
	// ApproxTTL: no events; each routed request's blocks recorded on its worker for
	// 120 s (Dynamo's approximate mode, router_ttl_secs).
	ApproxTTL Knowledge = "approx-ttl"
	// ApproxLRU: no events; an LRU per worker of the blocks routed there, bounded by
	// an estimate of its capacity (llm-d's approximate prefix cache, ApproxCache).
	ApproxLRU Knowledge = "approx-lru"
)

// DefaultStickyTTL is how long ExactSticky keeps a routed request's blocks on its
// worker: Dynamo's approximate TTL (router_ttl_secs, 120 s), long enough to span a
// conversation's think time.
const DefaultStickyTTL = 120 * time.Second

// Knowledges lists the knowledge sources of the cache-aware families, in report order.
func Knowledges() []Knowledge {
	return []Knowledge{Exact, ExactPredict, ExactSticky, ApproxTTL, ApproxLRU}
}

// Exact reports whether k reads the event-fed index.
func (k Knowledge) Exact() bool { return k == Exact || k == ExactPredict || k == ExactSticky }

// Predicts reports whether k records the router's own decisions with a lifetime.
func (k Knowledge) Predicts() bool { return k == ExactPredict || k == ExactSticky || k == ApproxTTL }

// Family is one policy family of the registry.
type Family struct {
	// Name is the family's name (Family* constants).
	Name string
	// CacheAware says the family reads a knowledge source; the others are Blind.
	CacheAware bool
	// Follows names the peer code the family follows (its type's doc lists where it
	// differs).
	Follows string
}

var families = []Family{
	{FamilyDynamoCost, true, "ai-dynamo/dynamo lib/kv-router/src/scheduling/selector/default.rs, sequences/single.rs"},
	{FamilyLLMDScorer, true, "llm-d/llm-d-router pkg/epp/framework/plugins/scheduling/scorer (precise-prefix-cache-scorer, kv-cache-utilization and queue scorers)"},
	{FamilyLLMDAffinity, true, "llm-d/llm-d-router pkg/epp/framework/plugins/scheduling (prefix-cache-affinity-filter, token-load-scorer)"},
	{FamilyLongestPrefix, true, "sgl-project/sglang sgl-router/src/policies/cache_aware.rs"},
	{FamilyLLMDLoad, false, "llm-d/llm-d-inference-scheduler (kv-cache-utilization and queue scorers alone)"},
	{FamilyLeastLoaded, false, ""},
	{FamilyRoundRobin, false, ""},
	{FamilyRandom, false, ""},
}

// Families returns the registry's families, in report order.
func Families() []Family { return slices.Clone(families) }

// Params are the tunables of every family; the zero value is every family's defaults.
type Params struct {
	// OverlapWeight and Temperature are dynamo-cost's.
	OverlapWeight, Temperature float64
	// PrefixWeight, KVWeight and QueueWeight are llmd-scorer's (all zero: llm-d's
	// defaults); llmd-load uses KVWeight and QueueWeight (both zero: 1 and 1).
	PrefixWeight, KVWeight, QueueWeight float64
	// PrefixMinMax gives llmd-scorer the earlier precise scorer's min-max prefix
	// score (Scorer.MinMax).
	PrefixMinMax bool
	// Affinity is llmd-affinity's.
	Affinity Affinity
	// LongestPrefixCap is longest-prefix's cap (0: none).
	LongestPrefixCap float64
	// QueueThreshold is dynamo-cost's router queue (Queue): a positive value puts
	// one in front at that threshold; 0, Dynamo's default (router_queue_threshold
	// unset), and a negative value (QueueOff) leave it out. A router that cannot
	// hold requests (kvindex serve answers each pick at once) has none.
	QueueThreshold float64
	// TrackOutputBlocks is Dynamo's router_track_output_blocks for the router's
	// Tracker (TrackerConfig.TrackOutputBlocks): off by default, as Dynamo ships it.
	TrackOutputBlocks bool
}

// QueueOff is a Params.QueueThreshold that turns dynamo-cost's router queue off.
const QueueOff = -1.0

// Row is one policy: a family and the knowledge source it reads (Blind for the
// cache-blind families). Its name is "FAMILY/KNOWLEDGE", or the family's alone.
type Row struct {
	Family    string
	Knowledge Knowledge
}

// Name returns the row's name.
func (r Row) Name() string {
	if r.Knowledge == Blind {
		return r.Family
	}
	return r.Family + "/" + string(r.Knowledge)
}

func (r Row) String() string { return r.Name() }

// aliases are the names earlier releases used, kept so configurations and scripts
// keep working (docs/routing.md lists them).
var aliases = map[string]string{
	"cost":                    FamilyDynamoCost,
	"scorer":                  FamilyLLMDScorer,
	"load-only":               FamilyLLMDLoad,
	"kv-aware":                "dynamo-cost/exact",
	"kv-aware-predict":        "dynamo-cost/exact+predict",
	"approximate":             "dynamo-cost/approx-ttl",
	"approximate-lru":         "dynamo-cost/approx-lru",
	"kv-aware-scorer":         "llmd-scorer/exact",
	"kv-aware-predict-scorer": "llmd-scorer/exact+predict",
	"approximate-scorer":      "llmd-scorer/approx-ttl",
	"approximate-lru-scorer":  "llmd-scorer/approx-lru",
}

// Aliases returns the old names and the names they stand for.
func Aliases() map[string]string {
	return maps.Clone(aliases)
}

// ParseRow returns the row named s: "FAMILY/KNOWLEDGE" for a cache-aware family, the
// family alone for a blind one (or for a cache-aware one, meaning its exact row), or
// an alias. The error names the families and knowledge sources.
func ParseRow(s string) (Row, error) {
	if a, ok := aliases[s]; ok {
		s = a
	}
	fam, k, slash := strings.Cut(s, "/")
	f, ok := family(fam)
	if !ok {
		return Row{}, fmt.Errorf("%w: unknown policy %q (want FAMILY or FAMILY/KNOWLEDGE; families %s; knowledge %s)",
			ErrConfig, s, strings.Join(FamilyNames(), ", "), knowledgeNames())
	}
	switch {
	case !f.CacheAware && k != "":
		return Row{}, fmt.Errorf("%w: policy %q: %s reads no cache, so takes no knowledge source", ErrConfig, s, fam)
	case !f.CacheAware:
		return Row{Family: fam}, nil
	case !slash:
		return Row{Family: fam, Knowledge: Exact}, nil
	case !slices.Contains(Knowledges(), Knowledge(k)):
		return Row{}, fmt.Errorf("%w: policy %q: unknown knowledge source %q (want %s)", ErrConfig, s, k, knowledgeNames())
	}
	return Row{Family: fam, Knowledge: Knowledge(k)}, nil
}

// FamilyNames returns the families' names, in report order.
func FamilyNames() []string {
	out := make([]string, len(families))
	for i, f := range families {
		out[i] = f.Name
	}
	return out
}

func knowledgeNames() string {
	var b []string
	for _, k := range Knowledges() {
		b = append(b, string(k))
	}
	return strings.Join(b, ", ")
}

func family(name string) (Family, bool) {
	for _, f := range families {
		if f.Name == name {
			return f, true
		}
	}
	return Family{}, false
}

// New returns the policy of row r with parameters p, or an error for an unknown
// family or an invalid parameter. The knowledge source does not change the policy:
// it decides only where the candidates' overlaps come from.
func New(r Row, p Params) (Policy, error) {
	switch r.Family {
	case FamilyDynamoCost:
		return NewCost(p.OverlapWeight, p.Temperature)
	case FamilyLLMDScorer:
		return NewScorer(p.PrefixWeight, p.KVWeight, p.QueueWeight, p.PrefixMinMax)
	case FamilyLLMDLoad:
		kv, q := p.KVWeight, p.QueueWeight
		if kv == 0 && q == 0 {
			kv, q = DefaultKVWeight, DefaultQueueWeight
		}
		return NewScorer(0, kv, q, false)
	case FamilyLLMDAffinity:
		return NewAffinity(p.Affinity)
	case FamilyLongestPrefix:
		return NewLongestPrefix(p.LongestPrefixCap)
	case FamilyLeastLoaded:
		return LeastLoaded{}, nil
	case FamilyRoundRobin:
		return &RoundRobin{}, nil
	case FamilyRandom:
		return Random{}, nil
	}
	return nil, fmt.Errorf("%w: unknown policy family %q (want one of %s)", ErrConfig, r.Family, strings.Join(FamilyNames(), ", "))
}

// Rows returns every row of the registry: each cache-aware family with each knowledge
// source, then the blind families, in report order.
func Rows() []Row {
	var out []Row
	for _, f := range families {
		if !f.CacheAware {
			out = append(out, Row{Family: f.Name})
			continue
		}
		for _, k := range Knowledges() {
			out = append(out, Row{Family: f.Name, Knowledge: k})
		}
	}
	return out
}
