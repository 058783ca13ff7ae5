package server

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"strings"
	"testing"
)

// TestCheckFDs: serve warns at start when the file-descriptor limit is below what its
// engines need (a SUB connection each, a listener per bound one, the replays), and is
// silent when it is not.
func TestCheckFDs(t *testing.T) {
	defer func(f func() (uint64, bool)) { fdLimit = f }(fdLimit)
	cfg := Config{Listen: "127.0.0.1:0", MaxConcurrentReplays: 8}
	for i := range 3 {
		cfg.Engines = append(cfg.Engines, EngineConfig{Endpoint: fmt.Sprintf("tcp://127.0.0.1:%d", 20001+i), Bind: i == 0})
	}
	var logs bytes.Buffer
	s, err := New(cfg, Options{Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Shutdown(context.Background())
	need := fdsNeeded(3, 1, 8)
	fdLimit = func() (uint64, bool) { return uint64(need), true }
	s.checkFDs()
	if logs.Len() != 0 {
		t.Fatalf("warned at a limit of %d: %s", need, logs.String())
	}
	fdLimit = func() (uint64, bool) { return uint64(need - 1), true }
	s.checkFDs()
	if out := logs.String(); !strings.Contains(out, "file descriptor limit below") || !strings.Contains(out, fmt.Sprintf("needed=%d", need)) ||
		!strings.Contains(out, "bound=1") {
		t.Fatalf("log %q", out)
	}
}
