package fleet

import (
	"github.com/kvindex/kvindex/internal/fakevllm"
	"os"

	"context"
	"testing"
	"time"
)

// small is the CI-sized fleet: 16 engines with small caches, a warm-up that fills them
// and one level (a few seconds in all).
func small() Config {
	return Config{
		Fleet: fakevllm.FleetConfig{Engines: 16, Workload: fakevllm.Workload{Capacity: 128, MaxSessionBlocks: 32}},
		Rates: []float64{800}, Duration: 2 * time.Second, WarmupRate: 4000, WarmupMax: 20 * time.Second,
		QueryRate: 100, ProbeRate: 20, Drain: 20 * time.Second,
		// Lag and the generator's pace depend on the machine (and -race): only what is
		// lost is asserted.
		MaxLag: time.Hour,
	}
}

// held fails the test for every level (warm-up included) that published nothing or
// lost anything.
func held(t *testing.T, rep *Report) {
	t.Helper()
	levels := rep.Levels
	if rep.Warmup != nil {
		levels = append([]Level{*rep.Warmup}, levels...)
	}
	if len(levels) == 0 {
		t.Fatal("no level ran")
	}
	for _, l := range levels {
		t.Logf("%s", l.line())
		if l.Loss > 0 || l.Unrecoverable > 0 || l.Stale > 0 || l.SizeMismatch > 0 {
			t.Errorf("level at %.0f/s lost something: %v", l.Offered, l.Why)
		}
		// What serve applied while the level ran (AppliedRate) depends on the machine: on
		// a loaded one a short level's batches may all be applied in the drain. That
		// every published batch was applied by the drain's end is Loss.
		if l.Published == 0 {
			t.Errorf("level at %.0f/s published nothing", l.Offered)
		}
	}
}

// TestLoadNothingLost is the fleet load test at CI size: every batch published is
// applied, every worker holds exactly its engine's blocks, queries and probes answer.
func TestLoadNothingLost(t *testing.T) {
	rep, err := Run(context.Background(), small())
	if err != nil {
		t.Fatal(err)
	}
	held(t, rep)
	l := rep.Levels[0]
	if l.Lag.N == 0 || l.Match[APIHTTP].N == 0 || l.Match[APIGRPC].N == 0 || l.MatchErrors > 0 {
		t.Errorf("probes %d, http %d, grpc %d queries, %d errors (%s)", l.Lag.N, l.Match[APIHTTP].N, l.Match[APIGRPC].N, l.MatchErrors, l.LastError)
	}
	// Each query is timed from its scheduled start and from its send, which comes no
	// earlier: both summaries count the same queries, and each percentile from the send
	// is at most the one from the schedule.
	for _, api := range []string{APIHTTP, APIGRPC} {
		m, s := l.Match[api], l.MatchSent[api]
		if s.N != m.N || s.P50 > m.P50 || s.P99 > m.P99 || s.P50 <= 0 {
			t.Errorf("%s: from the schedule %+v, from the send %+v", api, m, s)
		}
	}
}

// TestLoadQueryChild runs the match clients in the query child (this test binary again,
// TestMain): the child gets serve's addresses and the fleet's request chains from the
// generator, and its queries come back to the level's figures, each API's answered
// without error, the same queries timed from their schedule and their send.
func TestLoadQueryChild(t *testing.T) {
	cfg := small()
	cfg.NoWarmup = true
	cfg.QueryCommand = []string{os.Args[0]}
	rep, err := Run(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	held(t, rep)
	l := rep.Levels[0]
	if l.MatchErrors > 0 || l.MatchSkipped > 0 {
		t.Errorf("%d errors (%s), %d skipped", l.MatchErrors, l.LastError, l.MatchSkipped)
	}
	// 100 queries/s over 2 s, the two APIs in turn: about 100 each, fewer where the
	// child had no request chain yet.
	for _, api := range []string{APIHTTP, APIGRPC} {
		m, s := l.Match[api], l.MatchSent[api]
		if m.N < 20 || s.N != m.N || s.P50 > m.P50 || s.P99 > m.P99 || s.P50 <= 0 {
			t.Errorf("%s: from the schedule %+v, from the send %+v", api, m, s)
		}
	}
}

// TestLoadStallRecovered stalls every engine's PUB writes mid-level with queues small
// enough to overflow: live messages drop, every subscriber sees a gap, and the replays
// must bring every worker back to its engine's exact state.
func TestLoadStallRecovered(t *testing.T) {
	cfg := small()
	cfg.NoWarmup, cfg.NoQueries, cfg.ProbeRate = true, true, 5
	cfg.Fleet.HWMBytes = 4 << 10
	cfg.Stall = 600 * time.Millisecond
	rep, err := Run(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	held(t, rep)
	l := rep.Levels[0]
	if l.Dropped == 0 || l.Gaps == 0 || l.Recovered == 0 || l.ReplaysServed == 0 {
		t.Fatalf("dropped %d, gaps %d, recovered %d, replays served %d: the stall tested nothing", l.Dropped, l.Gaps, l.Recovered, l.ReplaysServed)
	}
}

// TestLoadConnectMode: the engines connect to serve's bound endpoints (bind=true), as
// vLLM does when its endpoint names a host; nothing is lost either.
func TestLoadConnectMode(t *testing.T) {
	cfg := small()
	cfg.Fleet.Connect = true
	rep, err := Run(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	held(t, rep)
}
