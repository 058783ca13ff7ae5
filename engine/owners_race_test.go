package engine

import (
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/kvindex/kvindex/internal/invariants"
)

// raceSweepChild is set in the environment of the child processes TestOwnersRace
// starts: each is this test binary, running one subtest of TestRaceSweep
// (racesweep_test.go), which skips everywhere else.
const raceSweepChild = "KVINDEX_RACE_SWEEP_CHILD"

// TestOwnersRace checks that the ownership rules of the package documentation are what
// the race detector enforces: it runs each subtest of TestRaceSweep (racesweep_test.go)
// in a child process of this same test binary, which the detector must be built into.
// In each, two goroutines that are not the owner of one piece of state (a worker's
// bookkeeping, a shard's table, a worker's tables on the locked index beside a query,
// the prediction table, the worker registry) touch it at once: the child must fail
// with a DATA RACE report. The control
// subtest does the same work as the owner and must pass, so that a detector that
// reports everything fails the test too. With -tags invariants, a non-owner's access
// may instead stop at the owner check (package internal/invariants), which panics before
// the detector sees the race; that counts as reported. Skipped without -race (make test's
// race-invariants phase runs it; it reuses that phase's binary, so it costs six short
// child runs and no build).
func TestOwnersRace(t *testing.T) {
	if !underRace {
		t.Skip("needs the race detector: go test -race runs it (make test's race-invariants phase)")
	}
	bin, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	for _, owner := range []string{"worker", "shard-table", "locked-tables", "predictions", "registry", "control"} {
		t.Run(owner, func(t *testing.T) {
			cmd := exec.Command(bin, "-test.run", "^TestRaceSweep$/^"+owner+"$", "-test.count=1", "-test.v")
			cmd.Env = append(os.Environ(), "GORACE=halt_on_error=0", raceSweepChild+"=1")
			out, err := cmd.CombinedOutput()
			raced := strings.Contains(string(out), "WARNING: DATA RACE") ||
				// With -tags invariants an owner-only method checks its caller first
				// and panics before the racing access (make test's build; make
				// test-long's go test -race runs the sweep without the checks).
				invariants.Enabled && strings.Contains(string(out), "panic: invariants: ") && strings.Contains(string(out), " ran on goroutine ")
			ran := strings.Contains(string(out), "=== RUN   TestRaceSweep/"+owner)
			switch {
			case !ran:
				t.Fatalf("the subtest did not run (err %v):\n%s", err, out)
			case owner == "control" && (raced || err != nil):
				t.Fatalf("the owner's own accesses were reported (err %v):\n%s", err, out)
			case owner != "control" && (!raced || err == nil):
				t.Fatalf("two non-owners racing on the %s's state were not reported (err %v):\n%s", owner, err, out)
			}
		})
	}
}
