package fleet

import (
	"fmt"
	"os"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	if spec := os.Getenv(wakeFloorEnv); spec != "" {
		os.Exit(wakeFloorWriter(spec)) // the writer child of BenchmarkWakeFloor
	}
	if IsQueryChild() { // the query child of TestLoadQueryChild
		if err := QueryChild(os.Stdin, os.Stdout); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	goleak.VerifyTestMain(m)
}
