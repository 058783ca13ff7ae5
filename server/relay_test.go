package server_test

import (
	"context"
	"errors"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/kvindex/kvindex/internal/freeport"
	"github.com/kvindex/kvindex/server"
)

// TestNewRelayErrors: a relay without a NATS URL is a configuration error; one whose
// NATS server is down fails within its connect timeout with ErrRelay, naming the URL
// and the attempts made (fabric.Dial), rather than waiting.
func TestNewRelayErrors(t *testing.T) {
	if _, err := server.NewRelay(context.Background(), server.RelayConfig{}); !errors.Is(err, server.ErrConfig) {
		t.Errorf("no URL: %v, want ErrConfig", err)
	}
	url := "nats" + strings.TrimPrefix(freeport.Endpoint(t), "tcp")
	_, err := server.NewRelay(context.Background(), server.RelayConfig{URL: url, ConnectTimeout: 300 * time.Millisecond})
	if !errors.Is(err, server.ErrRelay) || errors.Is(err, server.ErrConfig) || !strings.Contains(err.Error(), "no NATS server at "+url) ||
		!strings.Contains(err.Error(), "attempts") {
		t.Errorf("unreachable NATS: %v, want ErrRelay naming %s and the attempts", err, url)
	}
}

// TestRelayMetricsNeedAuthOffLoopback (issue 33, low items): `relay --listen 0.0.0.0`
// served /metrics, every worker and its stream position, to anyone. A relay listener
// on a non-loopback address now needs MetricsTokenFile (or AllowUnauthenticated),
// refused before NATS is dialled.
func TestRelayMetricsNeedAuthOffLoopback(t *testing.T) {
	ln, err := net.Listen("tcp", "0.0.0.0:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	url := "nats" + strings.TrimPrefix(freeport.Endpoint(t), "tcp")
	if _, err := server.NewRelay(context.Background(), server.RelayConfig{URL: url, Listener: ln}); !errors.Is(err, server.ErrUnauthenticatedListen) {
		t.Fatalf("a public listener without a token: %v", err)
	}
	for _, cfg := range []server.RelayConfig{{MetricsTokenFile: writeTokens(t, testToken)}, {AllowUnauthenticated: true}} {
		cfg.URL, cfg.Listener, cfg.ConnectTimeout = url, ln, 100*time.Millisecond
		if _, err := server.NewRelay(context.Background(), cfg); !errors.Is(err, server.ErrRelay) {
			t.Fatalf("%+v: %v, want it past the check (then NATS is down)", cfg, err)
		}
	}
}
