package server_test

import (
	"context"
	"errors"
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
