package sim

import (
	"fmt"
	"strings"
	"time"

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

// routerQueues are the replicas' router queues, Dynamo's (route.Queue): for the
// dynamo-cost rows when Route.QueueThreshold is positive (Dynamo ships none). A
// request that reaches its replica while every engine is busy waits there; each step
// end releases the oldest waiting while an engine is not busy. Its time to first
// token counts from when it reached the router.
type routerQueues struct {
	qs    []*route.Queue[int32] // by replica
	at    map[int32]time.Duration
	cands []route.Candidate
}

// newRouterQueues returns the queues of a run, nil when it has none. An engine's
// batched-token budget is the step's (ChunkTokens: vLLM's max_num_batched_tokens,
// which Dynamo's workers publish).
func newRouterQueues(rt Routing, cfg TimedConfig) (*routerQueues, error) {
	if rt.Family != route.FamilyDynamoCost || cfg.Route.QueueThreshold <= 0 {
		return nil, nil
	}
	rq := &routerQueues{at: map[int32]time.Duration{}}
	for range cfg.Routers {
		q, err := route.NewQueue[int32](cfg.Route.QueueThreshold, int64(cfg.ChunkTokens))
		if err != nil {
			return nil, fmt.Errorf("%w: %w", ErrConfig, err)
		}
		rq.qs = append(rq.qs, q)
	}
	return rq, nil
}

// busy reports whether every engine is busy for replica ri's tracker.
func (rq *routerQueues) busy(f *fleet, ri int) bool {
	rq.cands = f.reps[ri].tracker.Candidates(f.name, route.Request{}, nil, rq.cands)
	return rq.qs[ri].Busy(rq.cands)
}

// park holds request i at replica ri when every engine is busy (Dynamo's enqueue),
// and reports whether it did.
func (rq *routerQueues) park(f *fleet, ri int, i int) bool {
	if rq == nil {
		return false
	}
	if _, again := rq.at[int32(i)]; again || !rq.busy(f, ri) {
		return false
	}
	if !rq.qs[ri].Push(int32(i)) {
		return false // past route.MaxQueueLen: routed at once
	}
	rq.at[int32(i)] = f.now
	return true
}

// arrival is when request i reached its router: when it was parked, or now.
func (rq *routerQueues) arrival(i int32, now time.Duration) time.Duration {
	if rq == nil {
		return now
	}
	if at, ok := rq.at[i]; ok {
		delete(rq.at, i)
		return at
	}
	return now
}

// drain routes the requests waiting at each replica, oldest first, while an engine
// is not busy (Dynamo's update, on each prefill completion and free).
func (rq *routerQueues) drain(f *fleet) error {
	if rq == nil {
		return nil
	}
	for ri, q := range rq.qs {
		for q.Len() > 0 && !rq.busy(f, ri) {
			i, _ := q.Pop()
			if err := f.route(int(i)); err != nil {
				return err
			}
		}
	}
	return nil
}

// noteGenerated reports engine k's running requests' output so far to their
// replicas' trackers, for Dynamo's router_track_output_blocks.
func (f *fleet) noteGenerated(k int) {
	if !f.cfg.Route.TrackOutputBlocks {
		return
	}
	for _, j := range f.eng[k].running {
		f.reps[j.router].tracker.Generated(j.idx, j.generated)
	}
}
