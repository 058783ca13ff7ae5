package main

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvindex/kvindex/internal/freeport"
)

// TestMain (with goleak.VerifyTestMain) is in sim_test.go.

// syncBuffer is an io.Writer safe for the server's and the test's goroutines.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

var listening = regexp.MustCompile(`listening on (\S+)`)

// waitListening polls the output for the listening line and returns the address.
func waitListening(t *testing.T, out *syncBuffer, errOut *syncBuffer) string {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		if m := listening.FindStringSubmatch(out.String()); m != nil {
			return m[1]
		}
		if time.Now().After(deadline) {
			t.Fatalf("serve never listened; stdout %q stderr %q", out.String(), errOut.String())
		}
		time.Sleep(5 * time.Millisecond) // bounded poll of a condition
	}
}

// background runs a command's main under a cancellable context and returns its exit
// code's channel and the cancel; a cleanup cancels it and waits until it has returned, so
// no test leaves a command running, whether the test passes or fails.
func background(t *testing.T, main func(ctx context.Context) int) (done <-chan int, cancel context.CancelFunc) {
	ctx, cancel := context.WithCancel(context.Background())
	ch := make(chan int, 1)
	exited := make(chan struct{})
	go func() {
		ch <- main(ctx)
		close(exited)
	}()
	t.Cleanup(func() {
		cancel()
		<-exited
	})
	return ch, cancel
}

func writeConfig(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(t.TempDir(), "serve.json")
	if err := os.WriteFile(p, b, 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestServeRejectsBadInput(t *testing.T) {
	bad := filepath.Join(t.TempDir(), "bad.json")
	os.WriteFile(bad, []byte(`{"listen": "127.0.0.1:0", "engines": [{"endpoint": "tcp://h:1"}], "typo": 1}`), 0o600)
	noEngines := writeConfig(t, map[string]any{"listen": "127.0.0.1:0"})
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--bogus"}, "flag provided but not defined"},
		{[]string{"extra"}, "unexpected argument"},
		{[]string{}, "at least one engine"},
		{[]string{"--engine", "replay=tcp://h:2"}, "endpoint= is required"},
		{[]string{"--engine", "endpoint=tcp://h:1,color=red"}, "unknown key"},
		{[]string{"--engine", "endpoint=tcp://h:1,dp_ranks=x"}, "dp_ranks"},
		{[]string{"--engine", "endpoint=tcp://*:1"}, "must name a host"},
		{[]string{"--engine", "endpoint=tcp://h:1", "--policy", "best"}, "policy"},
		{[]string{"--engine", "endpoint=tcp://h:1", "--log-level", "loud"}, "log-level"},
		{[]string{"--config", bad}, "unknown field \"typo\""},
		{[]string{"--config", noEngines}, "at least one engine"},
		{[]string{"--engine", "endpoint=tcp://h:1", "--tiers", "CPU"}, "not MEDIUM=TIER"},
		{[]string{"--engine", "endpoint=tcp://h:1", "--tiers", "CPU=ram"}, `unknown tier "ram"`},
		{[]string{"--engine", "endpoint=tcp://h:1", "--tier-weights", "1,0.5"}, "tier_weights has 2 numbers"},
		{[]string{"--engine", "endpoint=tcp://h:1", "--tier-weights", "1,0.5,x"}, "not a number"},
		{[]string{"--engine", "endpoint=tcp://h:1", "--tier-weights", "1,1.5,0"}, "want a number in [0, 1]"},
		{[]string{"--engine", "endpoint=tcp://h:1,media=GPU|TAPE"}, `medium "TAPE" in Media has no tier`},
	} {
		var out, errOut syncBuffer
		code := serveMain(context.Background(), tc.args, &out, &errOut)
		if code != 2 || !strings.Contains(errOut.String(), tc.want) {
			t.Errorf("%q: exit %d, stderr %q; want 2 and %q", tc.args, code, errOut.String(), tc.want)
		}
	}
	// A file without engines plus an engine flag is complete; --check prints the
	// merged configuration.
	var out, errOut syncBuffer
	if code := serveMain(context.Background(), []string{"--config", noEngines, "--engine", "endpoint=tcp://h:1,model=m,dp_ranks=2", "--check", "--listen", "127.0.0.1:0"}, &out, &errOut); code != 0 {
		t.Fatalf("check: exit %d: %s", code, errOut.String())
	}
	var cfg map[string]any
	if err := json.Unmarshal([]byte(out.String()), &cfg); err != nil || cfg["listen"] != "127.0.0.1:0" {
		t.Fatalf("check output %q: %v", out.String(), err)
	}
	// --tiers adds to the file's tiers; --tier-weights replaces its weights.
	tiered := writeConfig(t, map[string]any{"tiers": map[string]string{"NVME": "disk"}, "tier_weights": []float64{1, 0.5, 0.1}})
	out = syncBuffer{}
	if code := serveMain(context.Background(), []string{"--config", tiered, "--engine", "endpoint=tcp://h:1", "--check", "--listen", "127.0.0.1:0",
		"--tiers", "CPU=disk,HBM=device", "--tier-weights", "1,0.4,0.2"}, &out, &errOut); code != 0 {
		t.Fatalf("check: exit %d: %s", code, errOut.String())
	}
	var got struct {
		Tiers       map[string]string `json:"tiers"`
		TierWeights []float64         `json:"tier_weights"`
	}
	if err := json.Unmarshal([]byte(out.String()), &got); err != nil || len(got.Tiers) != 3 || got.Tiers["NVME"] != "disk" ||
		got.Tiers["CPU"] != "disk" || got.Tiers["HBM"] != "device" || len(got.TierWeights) != 3 || got.TierWeights[1] != 0.4 {
		t.Fatalf("check output %q: %v", out.String(), err)
	}
}

func TestServeRunsAndStopsOnCancel(t *testing.T) {
	cfgPath := writeConfig(t, map[string]any{
		"listen":  "127.0.0.1:0",
		"engines": []map[string]any{{"endpoint": freeport.Endpoint(t), "model": "m", "worker": "w"}},
	})
	var out, errOut syncBuffer
	done, cancel := background(t, func(ctx context.Context) int {
		return serveMain(ctx, []string{"--config", cfgPath, "--grace", "1h", "--log-level", "warn"}, &out, &errOut)
	})
	addr := waitListening(t, &out, &errOut)
	tr := &http.Transport{}
	defer tr.CloseIdleConnections()
	hc := &http.Client{Transport: tr, Timeout: 5 * time.Second}
	resp, err := hc.Get("http://" + addr + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("healthz %d", resp.StatusCode)
	}
	resp, err = hc.Post("http://"+addr+"/v1/match", "application/json", strings.NewReader(`{"tokens":[1,2]}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("match %d", resp.StatusCode)
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
