package subscriber

import (
	"context"
	"fmt"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/kvindex/kvindex/engine"
	"github.com/kvindex/kvindex/internal/cputime"
)

// BenchmarkRefusingEndpoints runs 1,000 subscribers whose endpoints refuse connections
// for 20 s (the backoff's ramp from ReconnectMin to its ReconnectMax cap included) and
// reports the process's CPU over the run in cores; b.N is not used. Run:
// go test -run '^$' -bench BenchmarkRefusingEndpoints -benchtime 1x ./subscriber/
func BenchmarkRefusingEndpoints(b *testing.B) {
	eng, err := engine.New(engine.Config{Shards: 1})
	if err != nil {
		b.Fatal(err)
	}
	defer eng.Close()
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	c0, ok := cputime.Process()
	if !ok {
		b.Skip("no process CPU time on this system")
	}
	w0 := time.Now()
	for i := range 1000 {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			b.Fatal(err)
		}
		addr := l.Addr().String()
		l.Close() // nothing listens there now: every dial is refused
		s, err := New(Config{Endpoint: "tcp://" + addr, Worker: fmt.Sprint("w", i), Index: eng})
		if err != nil {
			b.Fatal(err)
		}
		wg.Add(1)
		go func() { defer wg.Done(); _ = s.Run(ctx) }()
	}
	time.Sleep(20 * time.Second) // the window measured
	c1, _ := cputime.Process()
	b.ReportMetric(float64(c1-c0)/float64(time.Since(w0)), "cores")
	cancel()
	wg.Wait()
}
