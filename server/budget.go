package server

import (
	"cmp"
	"fmt"

	"github.com/kvindex/kvindex/route"
	"github.com/kvindex/kvindex/subscriber"
)

// The memory budget: the most serve's memory can grow by what its clients and peers
// send, as a function of the configuration alone. Each term is bounded by a limit that
// is checked before the memory is taken (admit.go, the engine's namespace table and
// prediction bounds, the subscribers' frame guard); the constants are what one unit of
// each costs, measured (TestMemoryBudget drives every input to its limit at once and
// checks the RSS against Total):
//
//	requests    = RequestExpansion × (in_flight_bytes + probes), probes being the gRPC
//	              health service's budget (4 × grpc.max_message_bytes when gRPC is on)
//	              a body parses into at most 7 bytes a byte (JSON "1," is 2 bytes and
//	              8 as a uint64 token, 4 more as the uint32 the hasher reads) plus the
//	              body; a gRPC message into at most 9 (a 1-byte varint is 8 bytes as a
//	              uint64 hash), plus the message
//	connections = 2 × max_connections × ConnBytes (HTTP and gRPC each: buffers,
//	              goroutine stacks, HTTP/2 framers and windows)
//	answers     = 2 × max_connections × max_matches × MatchBytes (a call in flight per
//	              connection writes one answer of at most max_matches matches)
//	namespaces  = index.namespace_bytes (the engine's namespace table, accounted)
//	predictions = index.predicted_blocks × PredictedBlockBytes
//	tracking    = routing.max_in_flight × (TrackedRequestBytes + MaxRequestIDBytes +
//	              ownerBytes + clientEntryBytes) +
//	              routing.max_tracked_blocks × route.TrackedBlockBytes
//	              the routed requests the load-aware policies count, each under its
//	              owner and a request id of at most MaxRequestIDBytes, the per-client
//	              shares (at worst one client per request), and the block hashes the
//	              tracker keeps of them (past its bound a request counts unshared)
//	engines     = Σ over bound and dialled engine ranks of (10 + connections) ×
//	              max_message_bytes (zmq4's queue and each connection's frame)
//	Total       = GCFactor × (requests + connections + answers + namespaces +
//	              predictions + tracking + engines)
//
// GCFactor is the Go collector's: with GOGC=100 the heap may reach twice what is live
// before a collection. The blocks the engines hold are not in it: engines are trusted to
// hold what their caches hold (about 70 bytes per membership, BENCHMARKS.md).

// Unit costs of the memory budget.
const (
	RequestExpansion    = 10       // bytes held per in-flight request byte, gRPC's 9 and the body
	ConnBytes           = 96 << 10 // one open connection
	MatchBytes          = 256      // one match of an answer, encoded and decoded
	PredictedBlockBytes = 64       // a predicted block: content, prefix, share of its entry
	TrackedRequestBytes = 256      // a routed request of one block tracked, besides its id (249 measured)
	GCFactor            = 2
	zmq4QueueMessages   = 10
)

// MemoryBudget is the memory budget of a configuration, by term (see the comment at the
// top of budget.go).
type MemoryBudget struct {
	Requests, Connections, Answers, Namespaces, Predictions, Tracking, Engines int64
}

// Total is the budget: every term, times GCFactor.
func (b MemoryBudget) Total() int64 {
	return GCFactor * (b.Requests + b.Connections + b.Answers + b.Namespaces + b.Predictions + b.Tracking + b.Engines)
}

func (b MemoryBudget) String() string {
	mib := func(v int64) string { return fmt.Sprintf("%.1f MiB", float64(v)/(1<<20)) }
	return fmt.Sprintf("requests %s, connections %s, answers %s, namespaces %s, predictions %s, tracking %s, engines %s: total %s",
		mib(b.Requests), mib(b.Connections), mib(b.Answers), mib(b.Namespaces), mib(b.Predictions), mib(b.Tracking), mib(b.Engines), mib(b.Total()))
}

// Budget returns the memory budget of cfg, defaults filled in.
func Budget(cfg Config) MemoryBudget {
	c := cfg.withDefaults()
	l := c.Limits.withDefaults()
	ec := c.Index.Engine().WithDefaults()
	conns := int64(l.MaxConnections)
	msg := int64(c.MaxMessageBytes)
	if msg == 0 {
		msg = subscriber.DefaultMaxMessageBytes
	}
	var probe int64 // the gRPC health service's own budget (admit.go)
	if c.GRPC.Listen != "" {
		probe = probeMessages * int64(c.GRPC.withDefaults().MaxMessageBytes)
	}
	var engines int64
	for _, e := range c.Engines {
		if e.Endpoint == "" {
			continue
		}
		ranks := int64(max(e.DPRanks, 1))
		perRank := int64(zmq4QueueMessages + 1)
		if e.Bind {
			perRank = zmq4QueueMessages + subscriber.MaxBoundConns
		}
		engines += ranks * perRank * msg
	}
	return MemoryBudget{
		Requests:    RequestExpansion * (l.InFlightBytes + probe),
		Connections: 2 * conns * ConnBytes,
		Answers:     2 * conns * int64(c.MaxMatches) * MatchBytes,
		Namespaces:  ec.NamespaceBytes,
		Predictions: int64(ec.PredictedBlocks) * PredictedBlockBytes,
		Tracking: int64(cmp.Or(c.Routing.MaxInFlight, route.DefaultMaxInFlight))*(TrackedRequestBytes+MaxRequestIDBytes+ownerBytes+clientEntryBytes) +
			int64(cmp.Or(c.Routing.MaxTrackedBlocks, route.DefaultMaxBlocks))*route.TrackedBlockBytes,
		Engines: engines,
	}
}
