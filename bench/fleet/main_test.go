package fleet

import (
	"os"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	if spec := os.Getenv(wakeFloorEnv); spec != "" {
		os.Exit(wakeFloorWriter(spec)) // the writer child of BenchmarkWakeFloor
	}
	goleak.VerifyTestMain(m)
}
