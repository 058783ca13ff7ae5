package main

import (
	"context"
	"io"
	"os"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/kvindex/kvindex/subscriber/pubtest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestSmoke runs the load generator end to end at a tiny scale.
func TestSmoke(t *testing.T) {
	if testing.Short() {
		t.Skip("SKIP in -short: starts the publisher and a server")
	}
	pubtest.Require(t)
	wd, _ := os.Getwd()
	trace, err := FindTrace(wd)
	if err != nil {
		t.Skipf("SKIP: %v", err)
	}
	rep, err := Run(context.Background(), Options{
		Trace: trace, Ranks: 2, BlockSize: 16, Capacity: 20000, Burst: 40, EventRate: 50, Queries: 20,
		Concurrency: []int{1, 4}, Modes: []string{"hashes", "tokens"}, APIs: []string{"http", "grpc"}, Duration: 300 * time.Millisecond,
		MaxRequests: 2000, PublisherSeconds: 30,
	}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Results) != 8 || rep.Workers != 2 || rep.Blocks == 0 {
		t.Fatalf("report %+v", rep)
	}
	for _, r := range rep.Results {
		if r.Requests == 0 || r.Errors != 0 || r.MeanScore <= 0 {
			t.Fatalf("level %+v", r)
		}
	}
	md := rep.Markdown("go run ./bench/loadgen")
	if !strings.Contains(md, "| http | hashes | 4 |") || !strings.Contains(md, "| grpc | tokens | 1 |") || !strings.Contains(md, "p99") {
		t.Fatalf("markdown:\n%s", md)
	}
}
