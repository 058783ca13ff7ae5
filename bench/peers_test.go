package bench

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// fakePeerEnv makes the test binary act as a peer driver; its value is the mode.
const fakePeerEnv = "KVINDEX_BENCH_FAKE_PEER"

// fakePeer is a peer driver for the tests: "ok" prints a valid result (its verification
// ran unless --no-verify was passed, one of its two checks failed; it wants --coalesce), "fail" exits 3 with a
// message on stderr, "garbage" prints something that is not JSON, "flood" prints more
// than RunPeer reads.
func fakePeer(mode string, args []string) int {
	switch mode {
	case "ok":
		ran := !slices.Contains(args, "--no-verify")
		if !slices.Contains(args, "--coalesce") {
			fmt.Fprintf(os.Stderr, "fake peer: want --coalesce, got %q\n", args)
			return 2
		}
		i := slices.Index(args, "--jump")
		if i < 0 || i+1 >= len(args) || args[i+1] != "7" {
			fmt.Fprintf(os.Stderr, "fake peer: want --jump 7, got %q\n", args)
			return 2
		}
		fmt.Printf(`{"impl":"fake","events":10,"block_ops":40,"rejected":1,
			"verify":{"ran":%t,"passed":1,"failed":1,"scores_passed":2,"first":"line 3: differs"},
			"replay":{"passes":5,"seconds":0.5,"cpu_seconds":0.4,"block_ops_per_sec":80,"events_per_sec":20},
			"replay_coalesced":{"events":4,"passes":3,"seconds":0.1,"cpu_seconds":0.2,"block_ops_per_sec":400,"events_per_sec":40},
			"verify_coalesced":{"ran":%t,"passed":2,"failed":0},
			"rest":{"queries":100,"seconds":1,"p50_ns":300,"p99_ns":900,"p999_ns":2000},
			"load":{"queries":50,"seconds":0.5,"p50_ns":400,"p99_ns":1200,"p999_ns":3000,"events":1000,"events_per_sec":2000,"loops":2},
			"memory":{"memberships":20,"alloc_bytes":1400,"alloc_bytes_per_membership":70,"rss_bytes":2000,"rss_bytes_per_membership":100}}`, ran, ran)
		return 0
	case "fail":
		fmt.Fprintln(os.Stderr, "fake peer: cannot read the log")
		return 3
	case "garbage":
		fmt.Println("this is not json")
		return 0
	case "flood":
		b := bytes.Repeat([]byte{' '}, maxPeerOutput+10)
		os.Stdout.Write(b)
		return 0
	}
	return 2
}

// fakePeerBinary returns a Peer that runs this test binary in mode; the mode travels in
// the environment, which exec passes on.
func fakePeerBinary(t *testing.T, mode string) Peer {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	t.Setenv(fakePeerEnv, mode)
	return Peer{Name: "fake-" + mode, Path: exe}
}

func TestRunPeerDecodesTheDriversResult(t *testing.T) {
	p := fakePeerBinary(t, "ok")
	r, err := RunPeer(context.Background(), p, "unused.jsonl", 7, Options{Queriers: 3})
	if err != nil {
		t.Fatal(err)
	}
	if r.Impl != "fake-ok" || len(r.Events) != 1 || r.Events[0].BlockOpsPerSec != 80 || r.Events[0].Passes != 5 || r.Events[0].Rejected != 1 {
		t.Errorf("events: %+v", r.Events)
	}
	if r.Events[0].CPUBlockOpsPerSec != 100 {
		t.Errorf("events' CPU: %+v", r.Events[0])
	}
	if c := r.Coalesced; c.Events != 4 || c.Passes != 3 || c.BlockOpsPerSec != 400 || c.CPUBlockOpsPerSec != 200 || r.CoalescedVerify.Passed != 2 {
		t.Errorf("coalesced: %+v, verify %+v", c, r.CoalescedVerify)
	}
	if r.Rest.P50 != 300 || r.Rest.P99 != 900 || r.Rest.QueriesPerSec != 100 || r.Rest.Queriers != 1 {
		t.Errorf("rest: %+v", r.Rest)
	}
	if r.Load.P50 != 400 || r.Load.P99 != 1200 || r.Load.EventsPerSec != 2000 || r.Load.Loops != 2 || r.Load.Queriers != 3 {
		t.Errorf("load: %+v", r.Load)
	}
	if r.Memory.Method != MemoryAllocator || r.Memory.BytesPerMembership != 70 || r.Memory.RSSBytesPerMembership != 100 || r.Memory.Memberships != 20 {
		t.Errorf("memory: %+v", r.Memory)
	}
	if r.Verify.Passed != 1 || r.Verify.Failed != 1 || r.Verify.First != "line 3: differs" || r.Verify.ScoresPassed != 2 {
		t.Errorf("verify: %+v", r.Verify)
	}
	r, err = RunPeer(context.Background(), p, "unused.jsonl", 7, Options{SkipVerify: true})
	if err != nil {
		t.Fatal(err)
	}
	if r.Verify != (VerifyResult{}) {
		t.Errorf("--no-verify: verify %+v, want none", r.Verify)
	}
}

func TestRunPeerReportsBrokenDrivers(t *testing.T) {
	for mode, want := range map[string]string{
		"fail":    "cannot read the log",
		"garbage": "bad output",
		"flood":   "output over",
	} {
		t.Run(mode, func(t *testing.T) {
			_, err := RunPeer(context.Background(), fakePeerBinary(t, mode), "unused.jsonl", 7, Options{})
			if err == nil || !strings.Contains(err.Error(), want) {
				t.Fatalf("err = %v, want one that says %q", err, want)
			}
		})
	}
	_, err := RunPeer(context.Background(), Peer{Name: "absent", Path: filepath.Join(t.TempDir(), "absent")}, "x", 7, Options{})
	if err == nil {
		t.Fatal("a missing binary: no error")
	}
}

func TestCompareRoundsAlternatesAndVerifiesOnce(t *testing.T) {
	w := Builtin(2, 1500)
	p := fakePeerBinary(t, "ok")
	opt := Options{Duration: 5 * time.Millisecond, MaxPasses: 2, MaxLoops: 1, Queriers: 1}
	var progress bytes.Buffer
	sums, err := CompareRounds(context.Background(), w, "unused.jsonl", 7, []Impl{LockedImpl()}, []Peer{p}, opt, 2, &progress)
	if err != nil {
		t.Fatal(err)
	}
	if len(sums) != 2 || sums[0].Impl != "locked" || sums[1].Impl != "fake-ok" {
		t.Fatalf("summaries %+v", sums)
	}
	for _, s := range sums {
		if len(s.Rounds) != 2 {
			t.Fatalf("%s: %d rounds, want 2", s.Impl, len(s.Rounds))
		}
		if len(s.Rounds[0].Events) != 1 || s.Rounds[0].Events[0].Producers != 1 {
			t.Errorf("%s: events %+v, want one producer only", s.Impl, s.Rounds[0].Events)
		}
		if v := s.Rounds[1].Verify; v.Passed+v.Failed != 0 {
			t.Errorf("%s: round 2 verified (%+v); only the first should", s.Impl, v)
		}
	}
	if v := sums[0].Rounds[0].Verify; v.Passed != w.Checked || v.Failed != 0 {
		t.Errorf("locked: verify %+v, want %d passed", v, w.Checked)
	}
	if sums[0].Failed() || !sums[1].Failed() {
		t.Errorf("Failed: locked %v, fake %v; want false, true", sums[0].Failed(), sums[1].Failed())
	}
	// Rounds alternate: every implementation's round 1 comes before any round 2.
	lines := strings.Split(strings.TrimSpace(progress.String()), "\n")
	want := []string{"round 1/2: locked", "round 1/2: fake-ok", "round 2/2: locked", "round 2/2: fake-ok"}
	if len(lines) != len(want) {
		t.Fatalf("progress:\n%s", progress.String())
	}
	for i, l := range lines {
		if !strings.Contains(l, want[i]) {
			t.Errorf("progress line %d = %q, want %q", i, l, want[i])
		}
	}
	if _, err := CompareRounds(context.Background(), w, "x", 7, nil, nil, opt, 0, nil); err == nil {
		t.Error("0 rounds: no error")
	}
}

func TestWritePeerTableShowsMediansAndMethods(t *testing.T) {
	w := Builtin(1, 500)
	mk := func(ops float64, p50 int64, bpm float64, method string) Result {
		return Result{Events: []EventResult{{BlockOpsPerSec: ops}}, Rest: QueryResult{P50: p50, P99: 2 * p50},
			Load: QueryResult{P50: 3 * p50, P99: 4 * p50}, Memory: MemoryResult{BytesPerMembership: bpm, Method: method, RSSBytesPerMembership: bpm + 10}}
	}
	ours := Summary{Impl: "locked", Rounds: []Result{mk(1e6, 1000, 200, MemoryHeap), mk(3e6, 3000, 210, MemoryHeap), mk(2e6, 2000, 190, MemoryHeap)}}
	ours.Rounds[0].Verify = VerifyResult{Passed: 4}
	peer := Summary{Impl: "smg-x", Rounds: []Result{mk(20e6, 300, 70, MemoryAllocator), mk(30e6, 500, 66, MemoryAllocator)}}
	peer.Rounds[0].Verify = VerifyResult{Passed: 3, Failed: 1, First: "line 9: wrong", ScoresPassed: 4}
	var b bytes.Buffer
	h := Header{Command: "kvindex bench --peers x", Workload: w}
	if err := WritePeerTable(&b, h, []Summary{ours, peer}, 3, true); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	for _, want := range []string{
		"`kvindex bench --peers x`",
		"| locked | 2.00M | 2.00 µs | 4.00 µs | 6.00 µs | 8.00 µs | 200 (heap) | 4/4 |",
		"| smg-x | 25.0M | 400 ns | 800 ns | 1.20 µs | 1.60 µs | 68 (alloc; RSS 78) | 3/4 (scores 4) |",
		"smg-x: first mismatch: line 9: wrong",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("table lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "locked: first mismatch") {
		t.Errorf("a passing implementation reports a mismatch:\n%s", out)
	}
}

func TestFindPeers(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "smg-positional"), []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "smg-chain"), []byte("not executable"), 0o644); err != nil {
		t.Fatal(err)
	}
	found, missing := FindPeers(dir)
	if len(found) != 1 || found[0].Name != "smg-positional" || found[0].Path != filepath.Join(dir, "smg-positional") {
		t.Errorf("found %+v", found)
	}
	if !slices.Equal(missing, []string{"smg-chain"}) {
		t.Errorf("missing %q, want [smg-chain]", missing)
	}
}

func TestWritePeerTableGivesLikeForLikeRatios(t *testing.T) {
	w := Builtin(1, 500)
	mk := func(wall, cpu, cwall, ccpu float64) Result {
		return Result{Events: []EventResult{{BlockOpsPerSec: wall, CPUBlockOpsPerSec: cpu}},
			Coalesced:       EventResult{BlockOpsPerSec: cwall, CPUBlockOpsPerSec: ccpu},
			CoalescedVerify: VerifyResult{Passed: 5}}
	}
	ours := Summary{Impl: "locked", Rounds: []Result{mk(1e6, 2e6, 3e6, 4e6), mk(2e6, 2e6, 2e6, 2e6)}}
	chain := Summary{Impl: ratioPeer, Rounds: []Result{mk(2e6, 4e6, 6e6, 8e6), mk(1e6, 1e6, 4e6, 4e6)}}
	// p50 at rest: ours 300 and 500 ns, its 200 and 250 (ratios 1.5 and 2). Memory: our heap
	// 60 B against its RSS 40 and 80 (its allocator count, 400, is not what is compared).
	for k, p50 := range []int64{300, 500} {
		ours.Rounds[k].Rest.P50 = p50
		ours.Rounds[k].Memory = MemoryResult{BytesPerMembership: 60, Method: MemoryHeap}
	}
	for k, p50 := range []int64{200, 250} {
		chain.Rounds[k].Rest.P50 = p50
		chain.Rounds[k].Memory = MemoryResult{BytesPerMembership: 400, Method: MemoryAllocator, RSSBytesPerMembership: float64(40 * (k + 1))}
	}
	var b bytes.Buffer
	if err := WritePeerTable(&b, Header{Command: "x", Workload: w}, []Summary{ours, chain}, 2, true); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	for _, want := range []string{
		"| locked | 1.50M | 2.00M | 2.50M | 3.00M | 5/5 |",
		// Per round: CPU per event 0.5 and 2, coalesced 0.5 and 0.5; wall 0.5 and 2, 0.5 and 0.5.
		"| locked | 1.25 | 0.50 | 1.25 | 0.50 | 1.75 | 1.12 |",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("table lacks %q:\n%s", want, out)
		}
	}
	// Without the peer, no ratio table.
	b.Reset()
	if err := WritePeerTable(&b, Header{Command: "x", Workload: w}, []Summary{ours}, 2, true); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(b.String(), "Like for like") {
		t.Errorf("a ratio table without %s:\n%s", ratioPeer, b.String())
	}
}
