//go:build unix

package main

import (
	"context"
	"encoding/json"
	"net/http"
	"os"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kvindex/kvindex/internal/freeport"
	"github.com/kvindex/kvindex/server"
)

// TestServeSIGHUPReloads: SIGHUP re-reads --config and applies its engine list's
// difference (the flag's engine stays, a removed engine goes, a new one comes); a
// setting that changed in the file but needs a restart is named in the log; a file
// that no longer validates changes nothing.
func TestServeSIGHUPReloads(t *testing.T) {
	a, b, f := freeport.Endpoint(t), freeport.Endpoint(t), freeport.Endpoint(t)
	file := writeConfig(t, map[string]any{"engines": []map[string]any{{"endpoint": a, "worker": "a", "model": "m"}}})
	var out, errOut syncBuffer
	done, cancel := background(t, func(ctx context.Context) int {
		return serveMain(ctx, []string{"--config", file, "--listen", "127.0.0.1:0", "--engine", "endpoint=" + f + ",worker=flag,model=m"}, &out, &errOut)
	})
	addr := waitListening(t, &out, &errOut)
	engines := func() []string {
		resp, err := http.Get("http://" + addr + "/v1/engines")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var v struct{ Engines []server.EngineInfo }
		if err := json.NewDecoder(resp.Body).Decode(&v); err != nil {
			t.Fatal(err)
		}
		var keys []string
		for _, e := range v.Engines {
			keys = append(keys, e.Key)
		}
		slices.Sort(keys)
		return keys
	}
	if got := engines(); !slices.Equal(got, []string{"a", "flag"}) {
		t.Fatalf("engines at start %v", got)
	}
	hup := func(cfg string, wantLog string) {
		t.Helper()
		if err := os.WriteFile(file, []byte(cfg), 0o600); err != nil {
			t.Fatal(err)
		}
		n := strings.Count(errOut.String(), wantLog)
		if err := syscall.Kill(os.Getpid(), syscall.SIGHUP); err != nil {
			t.Fatal(err)
		}
		deadline := time.Now().Add(10 * time.Second)
		for strings.Count(errOut.String(), wantLog) == n {
			if time.Now().After(deadline) {
				t.Fatalf("no %q in the log after SIGHUP: %s", wantLog, errOut.String())
			}
			time.Sleep(5 * time.Millisecond) // bounded poll of a condition
		}
	}
	hup(`{"policy": "round-robin", "engines": [{"endpoint": "`+b+`", "worker": "b", "model": "m"}]}`, "msg=reloaded")
	if got := engines(); !slices.Equal(got, []string{"b", "flag"}) {
		t.Fatalf("engines after the reload %v", got)
	}
	if log := errOut.String(); !strings.Contains(log, "added=b removed=a") || !strings.Contains(log, "not_applied=policy") {
		t.Fatalf("reload log: %s", log)
	}
	// Invalid: the engines stay.
	hup(`{"engines": [{"endpoint": "tcp://*:1"}]}`, "reload failed")
	if got := engines(); !slices.Equal(got, []string{"b", "flag"}) {
		t.Fatalf("engines after a bad reload %v", got)
	}
	cancel()
	if code := <-done; code != 0 {
		t.Fatalf("exit %d: %s", code, errOut.String())
	}
}

func TestServeSIGTERMDrains(t *testing.T) {
	var out, errOut syncBuffer
	endpoint := freeport.Endpoint(t) // here: freeport may call t.Fatal
	done := make(chan int, 1)
	go func() {
		done <- commands["serve"].run([]string{"--listen", "127.0.0.1:0", "--engine", "endpoint=" + endpoint, "--log-level", "error"}, &out, &errOut)
	}()
	// The serve command installs its SIGTERM handler before it listens, so once it says it
	// listens a SIGTERM reaches the handler, not the test process's default action.
	waitListening(t, &out, &errOut)
	if err := syscall.Kill(os.Getpid(), syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case code := <-done:
		if code != 0 {
			t.Fatalf("exit %d, stderr %q", code, errOut.String())
		}
	case <-time.After(15 * time.Second):
		t.Fatal("serve did not stop on SIGTERM")
	}
}
