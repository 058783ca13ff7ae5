package engine

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// RaceSweepEnv runs TestOwnersRace (make race sets it).
const raceSweepEnv = "KVINDEX_RACE_SWEEP"

// TestOwnersRace checks that the ownership rules of the package documentation are what
// the race detector enforces: it builds this package's tests once with -race and -tags
// racesweep and runs each subtest of TestRaceSweep (racesweep_test.go) in that binary.
// In each, two goroutines that are not the owner of one piece of state (a worker's
// bookkeeping, a shard's table, a probe batch, the prediction table, the worker
// registry) touch it at once: the child must fail with a DATA RACE report. The control
// subtest does the same work as the owner and must pass, so that a detector that
// reports everything fails the test too. Skipped unless KVINDEX_RACE_SWEEP is set (one
// build of the package with the detector: about a minute on two cores).
func TestOwnersRace(t *testing.T) {
	if os.Getenv(raceSweepEnv) == "" {
		t.Skip("set " + raceSweepEnv + "=1 (make race does) to build the racy owners' tests with -race and run them")
	}
	bin := filepath.Join(t.TempDir(), "racesweep.test")
	build := exec.Command("go", "test", "-race", "-tags", "racesweep", "-c", "-o", bin, ".")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go test -race -tags racesweep -c: %v\n%s", err, out)
	}
	for _, owner := range []string{"worker", "shard-table", "probe-batch", "predictions", "registry", "control"} {
		t.Run(owner, func(t *testing.T) {
			cmd := exec.Command(bin, "-test.run", "^TestRaceSweep$/^"+owner+"$", "-test.count=1", "-test.v")
			cmd.Env = append(os.Environ(), "GORACE=halt_on_error=0")
			out, err := cmd.CombinedOutput()
			raced := strings.Contains(string(out), "WARNING: DATA RACE")
			ran := strings.Contains(string(out), "--- ")
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
