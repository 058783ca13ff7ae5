package server_test

import (
	"fmt"
	"log/slog"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/kvindex/kvindex/internal/fakevllm"
	"github.com/kvindex/kvindex/internal/freeport"
	"github.com/kvindex/kvindex/server"
)

// TestHostileEngineEndpoint: what listens on one engine's endpoint sends a frame
// header declaring 2^50 bytes (zmq4 alone panics in a goroutine nobody recovers and the
// process exits). The server keeps answering, counts the refusals in /metrics, the
// other engine's worker is untouched, and the worker recovers once a good publisher
// takes the endpoint.
func TestHostileEngineEndpoint(t *testing.T) {
	hostile, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := make(chan struct{}, 64)
	served := make(chan struct{})
	go func() {
		defer close(served)
		fakevllm.ServeHostile(hostile, fakevllm.LongHeader(0x04, 1<<50), closed)
	}()
	// Registered before start's: runs after the server stopped dialling, and waits for
	// ServeHostile and its connections, so none outlives the test.
	t.Cleanup(func() {
		hostile.Close()
		<-served
	})
	good, err := fakevllm.ListenPub("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer good.Close()
	goodEP := "tcp://" + good.Addr()
	badEP := "tcp://" + hostile.Addr().String()
	cfg := server.Config{
		Listen: "127.0.0.1:0",
		Engines: []server.EngineConfig{
			{Endpoint: badEP, Worker: "bad", BlockSize: 4},
			{Endpoint: goodEP, Worker: "good", BlockSize: 4},
		},
		ReconnectMin: server.Duration(time.Millisecond),
		ReconnectMax: server.Duration(20 * time.Millisecond),
	}
	s, c := start(t, cfg)
	for i := 0; i < 3; i++ {
		<-closed
	}
	hostile.Close()
	var health map[string]any
	if got := c.do("GET", "/healthz", "", &health); got != 200 || health["status"] != "ok" {
		t.Fatalf("healthz: %d %v", got, health)
	}
	waitState := func(worker, state string) {
		t.Helper()
		deadline := time.Now().Add(15 * time.Second)
		for {
			var ws struct{ Workers []server.WorkerInfo }
			c.do("GET", "/v1/workers", "", &ws)
			for _, w := range ws.Workers {
				if w.Worker == worker && w.State == state {
					return
				}
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s not %s: %+v", worker, state, ws.Workers)
			}
			good.Send()
			time.Sleep(5 * time.Millisecond) // pacing of a bounded probe loop
		}
	}
	waitState("good", "live")
	m := c.text("/metrics")
	if !strings.Contains(m, `kvindex_peers_refused_total{worker="bad"}`) || strings.Contains(m, `kvindex_peers_refused_total{worker="bad"} 0`) {
		t.Fatalf("refusals not counted:\n%s", grep(m, "peers_refused"))
	}
	if !strings.Contains(m, `kvindex_peers_refused_total{worker="good"} 0`) {
		t.Fatalf("good worker touched:\n%s", grep(m, "peers_refused"))
	}
	// A good publisher takes the hostile endpoint: the worker recovers.
	back, err := fakevllm.ListenPub(badEP[len("tcp://"):])
	if err != nil {
		t.Fatal(err)
	}
	defer back.Close()
	good = back
	waitState("bad", "live")
	_ = s
}

func grep(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return fmt.Sprint(out)
}

// TestReadyzNeverConnected: an engine that never connected (a mistyped endpoint, far
// more often than a dead engine) keeps /readyz at 503 after the grace period removed
// it, naming it and its last error, and its subscriber says so in the log at once
// (the rule itself, engines that did connect included: TestSubWaiting).
func TestReadyzNeverConnected(t *testing.T) {
	good, err := fakevllm.ListenPub("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer good.Close()
	cfg := server.Config{
		Listen: "127.0.0.1:0",
		Engines: []server.EngineConfig{
			{Endpoint: freeport.Endpoint(t), Worker: "typo", BlockSize: 4},
			{Endpoint: "tcp://" + good.Addr(), Worker: "good", BlockSize: 4},
		},
		Grace:        server.Duration(100 * time.Millisecond),
		ReconnectMin: server.Duration(time.Millisecond),
		ReconnectMax: server.Duration(20 * time.Millisecond),
	}
	var logs lockedLog
	_, c := startWith(t, cfg, server.Options{Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	state := func(worker string) string {
		var ws struct{ Workers []server.WorkerInfo }
		c.do("GET", "/v1/workers", "", &ws)
		for _, w := range ws.Workers {
			if w.Worker == worker {
				return w.State
			}
		}
		return ""
	}
	deadline := time.Now().Add(15 * time.Second)
	for state("typo") != "removed" || state("good") != "live" {
		if time.Now().After(deadline) {
			t.Fatalf("typo is %s, good %s", state("typo"), state("good"))
		}
		good.Send()
		time.Sleep(5 * time.Millisecond) // pacing of a bounded probe loop
	}
	var ready struct {
		Ready   bool
		Waiting []string
	}
	if code := c.do("GET", "/readyz", "", &ready); code != 503 || ready.Ready || len(ready.Waiting) != 1 ||
		!strings.HasPrefix(ready.Waiting[0], "typo (never connected: ") {
		t.Errorf("readyz with a never-connected engine removed: %d %+v", code, ready)
	}
	if !strings.Contains(logs.String(), "publisher unreachable") || !strings.Contains(logs.String(), "worker=typo") {
		t.Errorf("no warning for the unreachable publisher in the log:\n%s", logs.String())
	}
}
