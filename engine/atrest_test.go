package engine

import (
	"context"
	"fmt"
	"testing"

	"github.com/kvindex/kvindex/internal/oplog"
)

// BenchmarkTraceQueriesAtRest loads the trace-driven log (KVINDEX_OPS names another)
// and then answers its queries in a loop against the final state, with no events: the
// query path alone, warm. ns/op is per query. set=all asks every query of the log;
// set=round2 only those a one-shard engine answers with more than one round trip (the
// queries round 2 and narrow change: 54 of the conversation trace's 750 at rest).
func BenchmarkTraceQueriesAtRest(b *testing.B) {
	ops, queries := traceQueries(b)
	ctx := context.Background()
	load := func(cfg Config) *Engine { return loadAtRest(b, ops, cfg, nil) }
	var round2 [][]uint64
	{
		e := load(Config{Shards: 2}) // (one shard walks: no rounds)
		for _, q := range queries {
			r := e.Stats().QueryRounds
			if _, err := e.FindMatches(ctx, q, nil); err != nil {
				b.Fatal(err)
			}
			if e.Stats().QueryRounds-r > 1 {
				round2 = append(round2, q)
			}
		}
		e.Close()
	}
	for _, cfg := range []Config{{LockedIndex: true}, {Shards: 1}, {Shards: 2}} {
		e := load(cfg)
		for _, set := range []struct {
			name string
			qs   [][]uint64
		}{{"all", queries}, {"round2", round2}} {
			b.Run(fmt.Sprintf("locked=%v/shards=%d/set=%s", cfg.LockedIndex, cfg.WithDefaults().Shards, set.name), func(b *testing.B) {
				if len(set.qs) == 0 {
					b.Skip("no such query in this log")
				}
				var dst []Match
				var err error
				for i := 0; i < b.N; i++ {
					if dst, err = e.FindMatches(ctx, set.qs[i%len(set.qs)], dst[:0]); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
		e.Close()
	}
}

// BenchmarkQueryWork counts the work of the trace-driven log's queries at rest (KVINDEX_OPS
// names another log) on a two-shard engine (one shard walks) with 8 and 16 dense landings (denseShort,
// denseLandings): round trips and probes per query (Stats.QueryRounds, QueryProbes), the
// measurement behind noteDense's choice between them. The next wave is never sent early
// (SetSpeculation), so the counts do not depend on timing; ns/op is the time of one pass
// over the queries.
func BenchmarkQueryWork(b *testing.B) {
	ops, queries := traceQueries(b)
	ctx := context.Background()
	for _, dense := range []int{denseShort, denseLandings} {
		b.Run(fmt.Sprintf("dense=%d", dense), func(b *testing.B) {
			e := loadAtRest(b, ops, Config{Shards: 2}, func(e *Engine) {
				SetDenseLandings(e, dense)
				SetSpeculation(e, false)
			})
			defer e.Close()
			var err error
			before := e.Stats()
			var dst []Match
			for b.Loop() {
				for _, q := range queries {
					if dst, err = e.FindMatches(ctx, q, dst[:0]); err != nil {
						b.Fatal(err)
					}
				}
			}
			st := e.Stats()
			n := float64(st.Queries - before.Queries)
			b.ReportMetric(float64(st.QueryRounds-before.QueryRounds)/n, "rounds/query")
			b.ReportMetric(float64(st.QueryProbes-before.QueryProbes)/n, "probes/query")
		})
	}
}

// traceQueries reads the trace-driven log (KVINDEX_OPS names another) and returns its ops
// and its queries' content hashes.
func traceQueries(b *testing.B) (ops []oplog.Op, queries [][]uint64) {
	ops = ceilingOps(b)
	for i := range ops {
		if ops[i].Kind == oplog.Query {
			queries = append(queries, ops[i].Content)
		}
	}
	return ops, queries
}

// loadAtRest returns an engine of cfg that has applied every event of ops, after a
// Barrier; setup, when not nil, runs first (test hooks are set before any call).
func loadAtRest(b *testing.B, ops []oplog.Op, cfg Config, setup func(*Engine)) *Engine {
	e, err := New(cfg)
	if err != nil {
		b.Fatal(err)
	}
	if setup != nil {
		setup(e)
	}
	for i := range ops {
		if ops[i].Kind == oplog.Query {
			continue
		}
		ev := ceilingEvent(&ops[i])
		if err := e.Apply(&ev); err != nil && !IsRejection(err) {
			b.Fatal(err)
		}
	}
	if err := e.Barrier(context.Background()); err != nil {
		b.Fatal(err)
	}
	return e
}
