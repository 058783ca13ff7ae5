package report

import (
	"fmt"

	"github.com/kvindex/kvindex/sim"
)

// WorkloadInfo is what the reports say about the workload.
type WorkloadInfo struct {
	Name      string `json:"name"`
	Source    string `json:"source"`
	Trace     string `json:"trace,omitempty"`
	Requests  int    `json:"requests"`
	Tokens    int64  `json:"tokens"`
	Blocks    int64  `json:"blocks"`
	BlockSize int    `json:"block_size"`
	// TraceIDHitRate is the trace's own infinite-cache ceiling at 512-token ids.
	TraceIDHitRate *float64 `json:"trace_id_block_hit_rate,omitempty"`
}

// JSON shapes shared by the reports.
type (
	// HitsJSON is a run's prefix hits: the ceiling's, and each policy's (embedded).
	HitsJSON struct {
		BlockHitRate float64 `json:"block_hit_rate"`
		TokenHitRate float64 `json:"token_hit_rate"`
		HitBlocks    int64   `json:"hit_blocks"`
		Blocks       int64   `json:"blocks"`
	}
	IndexJSON struct {
		Policy        string  `json:"policy"`
		EventsApplied uint64  `json:"events_applied"`
		Rejected      int64   `json:"rejected_events"`
		Queries       int64   `json:"queries"`
		BlockOps      int64   `json:"block_ops"`
		EngineSeconds float64 `json:"engine_seconds"`
		BlockOpsPerS  float64 `json:"block_ops_per_s"`
		// The latencies are left out for a run without queries, the heap per membership
		// for one that did not measure it (sweep points): absent, not 0.
		P50                *int64   `json:"find_matches_p50_ns,omitempty"`
		P99                *int64   `json:"find_matches_p99_ns,omitempty"`
		P999               *int64   `json:"find_matches_p999_ns,omitempty"`
		Memberships        int64    `json:"memberships"`
		BytesPerMembership *float64 `json:"bytes_per_membership,omitempty"`
	}
)

// IndexOf is a run's index side; measured says whether the run measured its heap (sim.Config.MeasureMemory).
func IndexOf(r sim.Result, measured bool) IndexJSON {
	s := r.Index
	ix := IndexJSON{
		Policy: r.Policy.String(), EventsApplied: s.Events, Rejected: s.Rejected, Queries: s.Queries,
		BlockOps: s.BlockOps(), EngineSeconds: s.EngineSeconds, BlockOpsPerS: s.BlockOpsPerS(),
		Memberships: s.Memberships,
	}
	if s.Queries > 0 {
		ix.P50, ix.P99, ix.P999 = ptr(s.FindMatchesP50), ptr(s.FindMatchesP99), ptr(s.FindMatchesP999)
	}
	if measured {
		ix.BytesPerMembership = ptr(s.BytesPerMembership())
	}
	return ix
}

// HitsOf is a run's hits: it takes a policy's run or the ceiling: both count their blocks and tokens so.
func HitsOf(h interface {
	BlockHitRate() float64
	TokenHitRate() float64
}, hitBlocks, blocks int64) HitsJSON {
	return HitsJSON{BlockHitRate: h.BlockHitRate(), TokenHitRate: h.TokenHitRate(), HitBlocks: hitBlocks, Blocks: blocks}
}

// Pct writes a rate as a percentage; Micros nanoseconds as microseconds.
func Pct(x float64) string { return fmt.Sprintf("%.2f%%", 100*x) }

// nameWidth is a table's policy column width: least, or the longest of the n names
// name(i) gives, so that every row lines up with the header whatever the names.
func nameWidth(least, n int, name func(int) string) int {
	for i := range n {
		least = max(least, len(name(i)))
	}
	return least
}

func Micros(ns int64) string { return fmt.Sprintf("%.1f µs", float64(ns)/1e3) }

// ChartLine says where a sweep's chart went, or how to get one.
func ChartLine(path string) string {
	if path == "" {
		return "no chart written (--chart FILE.svg draws one)"
	}
	return "chart written to " + path
}

func ptr[T any](v T) *T { return &v }
