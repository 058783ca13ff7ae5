package sim

import (
	"fmt"
	"strings"
)

// Knowledge is where a router's picture of the engines' caches comes from.
type Knowledge int

const (
	// Blind routers know nothing of the caches (the baselines).
	Blind Knowledge = iota
	// Events: the exact index, fed by the engines' KV events.
	Events
	// EventsPredict: the exact index, and the router's own decisions as predictions
	// that bridge the events' delay (Config.PredictionTTL).
	EventsPredict
	// ApproxTTL: no events; the router's own decisions as predictions that live
	// DefaultApproximateTTL (Dynamo's approximate mode, 120 s).
	ApproxTTL
	// ApproxLRU: no events; an LRU per engine of the blocks the router sent there,
	// bounded by the engine's capacity (llm-d's approximate prefix cache).
	ApproxLRU
)

// Scoring is how a router combines what it knows into a pick (package route).
type Scoring int

const (
	// ScoreCost is route.Cost: Dynamo's overlap-weighted prefill blocks plus decode
	// blocks, from the router's own load tracking.
	ScoreCost Scoring = iota
	// ScoreWeighted is route.Scorer: llm-d's prefix, KV-utilisation and queue scores,
	// the load from the engines' reported metrics.
	ScoreWeighted
	// ScoreLoad is route.Scorer without the prefix: llm-d's load-only scheduling.
	ScoreLoad
	// ScoreLeastLoaded, ScoreRoundRobin and ScoreRandom are the baselines.
	ScoreLeastLoaded
	ScoreRoundRobin
	ScoreRandom
)

// Routing is one routing policy of Simulate: a scoring and a source of knowledge.
type Routing struct {
	Name      string
	Scoring   Scoring
	Knowledge Knowledge
}

// routings are the timed policies, in report order.
var routings = []Routing{
	{"kv-aware", ScoreCost, Events},
	{"kv-aware-predict", ScoreCost, EventsPredict},
	{"approximate", ScoreCost, ApproxTTL},
	{"approximate-lru", ScoreCost, ApproxLRU},
	{"kv-aware-scorer", ScoreWeighted, Events},
	{"kv-aware-predict-scorer", ScoreWeighted, EventsPredict},
	{"approximate-scorer", ScoreWeighted, ApproxTTL},
	{"approximate-lru-scorer", ScoreWeighted, ApproxLRU},
	{"load-only", ScoreLoad, Blind},
	{"least-loaded", ScoreLeastLoaded, Blind},
	{"round-robin", ScoreRoundRobin, Blind},
	{"random", ScoreRandom, Blind},
}

// Routings returns every timed routing policy, in report order.
func Routings() []Routing { return append([]Routing(nil), routings...) }

// ParseRouting returns the timed routing policy named s.
func ParseRouting(s string) (Routing, error) {
	for _, r := range routings {
		if r.Name == s {
			return r, nil
		}
	}
	names := make([]string, len(routings))
	for i, r := range routings {
		names[i] = r.Name
	}
	return Routing{}, fmt.Errorf("sim: unknown routing policy %q (want one of %s)", s, strings.Join(names, ", "))
}

func (r Routing) String() string { return r.Name }

// events reports whether the policy reads the exact index.
func (r Routing) events() bool { return r.Knowledge == Events || r.Knowledge == EventsPredict }

// predicts reports whether the policy keeps predictions of its own.
func (r Routing) predicts() bool { return r.Knowledge == EventsPredict || r.Knowledge == ApproxTTL }
