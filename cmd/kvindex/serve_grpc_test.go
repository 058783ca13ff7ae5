package main

import (
	"context"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/kvindex/kvindex/client"
	"github.com/kvindex/kvindex/internal/freeport"
)

var grpcListening = regexp.MustCompile(`gRPC on (\S+)`)

// TestServeGRPC: kvindex serve --grpc answers over gRPC beside HTTP, and drains both.
func TestServeGRPC(t *testing.T) {
	var out, errOut syncBuffer
	endpoint := freeport.Endpoint(t)
	done, cancel := background(t, func(ctx context.Context) int {
		return serveMain(ctx, []string{"--listen", "127.0.0.1:0", "--grpc", "127.0.0.1:0",
			"--engine", "endpoint=" + endpoint + ",model=m,block_size=2", "--log-level", "error"}, &out, &errOut)
	})
	waitListening(t, &out, &errOut)
	m := grpcListening.FindStringSubmatch(out.String())
	if m == nil {
		t.Fatalf("no gRPC address in %q", out.String())
	}
	c, err := client.Dial(m[1])
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, stop := context.WithTimeout(context.Background(), 10*time.Second)
	defer stop()
	if live, err := c.Live(ctx); err != nil || !live {
		t.Fatalf("live %v, %v", live, err)
	}
	resp, err := c.MatchTokens(ctx, "m", []uint32{1, 2, 3, 4, 5})
	if err != nil || resp.Blocks != 2 || resp.Namespace != "model=m;" {
		t.Fatalf("%v, %v", resp, err)
	}
	if ws, err := c.Workers(ctx); err != nil || len(ws) != 1 {
		t.Fatalf("%v, %v", ws, err)
	}
	cancel()
	select {
	case code := <-done:
		if code != 0 || !strings.Contains(out.String(), "stopped") {
			t.Fatalf("exit %d, stdout %q, stderr %q", code, out.String(), errOut.String())
		}
	case <-time.After(15 * time.Second):
		t.Fatal("serve did not stop")
	}
}

func TestServeGRPCBadAddress(t *testing.T) {
	code, _, errs := runCLI(t, "serve", "--engine", "endpoint=tcp://h:1", "--grpc", "nope")
	if code != 2 || !strings.Contains(errs, "grpc.listen") {
		t.Fatalf("exit %d, stderr %q", code, errs)
	}
}
