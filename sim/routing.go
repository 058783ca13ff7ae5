package sim

import (
	"fmt"
	"strings"

	"github.com/kvindex/kvindex/route"
)

// The knowledge sources of package route, as Simulate provides them: the exact index
// fed by the simulated engines' events, the replica's own predictions (engine.Predict
// with a lifetime) and its approximate LRU (route.ApproxCache).
const (
	Blind         = route.Blind
	Events        = route.Exact
	EventsPredict = route.ExactPredict
	EventsSticky  = route.ExactSticky
	ApproxTTL     = route.ApproxTTL
	ApproxLRU     = route.ApproxLRU
)

// Routing is one routing policy of Simulate: a row of package route's registry (a
// policy family and a knowledge source), named as the registry names it.
type Routing struct {
	Name string
	// Family is the route family, Knowledge where its picture of the caches comes
	// from.
	Family    string
	Knowledge route.Knowledge
}

// Row returns the routing's registry row.
func (r Routing) Row() route.Row { return route.Row{Family: r.Family, Knowledge: r.Knowledge} }

func routingOf(row route.Row) Routing {
	return Routing{Name: row.Name(), Family: row.Family, Knowledge: row.Knowledge}
}

// defaultRows are the rows a run compares unless told otherwise: each cache-aware
// family of the peers with exact events and with the approximate knowledge its peer
// ships (Dynamo's TTL, llm-d's LRU), then load-only and round-robin.
var defaultRows = []string{
	"dynamo-cost/exact", "dynamo-cost/approx-ttl",
	"llmd-scorer/exact", "llmd-scorer/approx-lru",
	"llmd-affinity/exact", "llmd-affinity/approx-lru",
	"llmd-load", "round-robin",
}

// Routings returns the timed policies a run compares by default, in report order.
func Routings() []Routing {
	out := make([]Routing, 0, len(defaultRows))
	for _, n := range defaultRows {
		r, err := ParseRouting(n)
		if err != nil {
			panic(err) // defaultRows are registry rows
		}
		out = append(out, r)
	}
	return out
}

// AllRoutings returns every row of the registry as a timed policy.
func AllRoutings() []Routing {
	var out []Routing
	for _, row := range route.Rows() {
		out = append(out, routingOf(row))
	}
	return out
}

// ParseRouting returns the timed routing policy named s: a registry row
// (route.ParseRow: "FAMILY/KNOWLEDGE", a blind family, or an old name kept as an
// alias).
func ParseRouting(s string) (Routing, error) {
	row, err := route.ParseRow(strings.TrimSpace(s))
	if err != nil {
		return Routing{}, fmt.Errorf("sim: %w", err)
	}
	return routingOf(row), nil
}

func (r Routing) String() string { return r.Name }

// events reports whether the policy reads the exact index.
func (r Routing) events() bool { return r.Knowledge.Exact() }

// predicts reports whether the policy keeps predictions of its own.
func (r Routing) predicts() bool { return r.Knowledge.Predicts() }
