package server_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kvindex/kvindex/internal/freeport"
	"github.com/kvindex/kvindex/server"
)

// engineKeys returns the keys of the engines of source, sorted.
func engineKeys(s *server.Server, source string) []string {
	var out []string
	for _, e := range s.Engines() {
		if e.Source == source {
			out = append(out, e.Key)
		}
	}
	slices.Sort(out)
	return out
}

// waitFor polls cond (bounded) until it holds.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	waitForState(t, func() (bool, string) { return cond(), "still waiting for " + what })
}

// waitForState is waitFor whose condition also says what it saw: the last reading is
// the failure's message.
func waitForState(t *testing.T, cond func() (done bool, state string)) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		done, state := cond()
		if done {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out after 10 s: %s", state)
		}
		time.Sleep(5 * time.Millisecond) // bounded poll of a condition
	}
}

// TestFileDiscovery: the engines file's engines are served from the start; a change
// (written in place or renamed over it) adds, removes and replaces engines and leaves
// the others' subscribers running; a file that stops parsing changes nothing and is
// counted, and an engine the server rejects leaves the file's other engines applied.
func TestFileDiscovery(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "engines.json")
	eps := map[string]string{}
	for _, w := range []string{"a", "b", "c", "d"} {
		eps[w] = freeport.Endpoint(t)
	}
	write := func(content string, rename bool) {
		t.Helper()
		target := path
		if rename {
			target = path + ".tmp"
		}
		if err := os.WriteFile(target, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		if rename {
			if err := os.Rename(target, path); err != nil {
				t.Fatal(err)
			}
		}
	}
	list := func(workers ...string) string {
		var es []server.EngineConfig
		for _, w := range workers {
			es = append(es, server.EngineConfig{Endpoint: eps[w], Worker: w, Model: "m"})
		}
		b, _ := json.Marshal(es)
		return string(b)
	}
	write(list("a", "b"), false)
	cfg := server.Config{Listen: "127.0.0.1:0", Discovery: server.DiscoveryConfig{
		File: &server.FileDiscovery{Path: path, Interval: server.Duration(10 * time.Millisecond)}}}
	s, c := start(t, cfg)
	if got := engineKeys(s, server.SourceFile); !slices.Equal(got, []string{"a", "b"}) {
		t.Fatalf("engines at start %v", got)
	}
	subOf := func(w string) any {
		for _, sub := range s.Subscribers() {
			if sub.Worker() == w {
				return sub
			}
		}
		return nil
	}
	b0 := subOf("b")

	write(`{"engines": `+list("b", "c")+`}`, true)
	waitFor(t, "b, c", func() bool { return slices.Equal(engineKeys(s, server.SourceFile), []string{"b", "c"}) })
	if subOf("b") != b0 {
		t.Fatal("b's subscriber was replaced by a change that left it alone")
	}

	// Unparseable: nothing changes, the error is counted.
	write(`[{"endpoint": `, false)
	waitFor(t, "the error counted", func() bool {
		return strings.Contains(c.text("/metrics"), `kvindex_discovery_up{source="file"} 0`)
	})
	if got := engineKeys(s, server.SourceFile); !slices.Equal(got, []string{"b", "c"}) {
		t.Fatalf("engines after a bad file %v", got)
	}

	// One engine the server rejects (it claims b's endpoint): the others apply.
	bad := `[{"endpoint": "` + eps["b"] + `", "worker": "b"}, {"endpoint": "` + eps["b"] + `", "worker": "x"}, {"endpoint": "` + eps["d"] + `", "worker": "d", "model": "m"}]`
	write(bad, true)
	// The watcher publishes the engines, then counts the changes, then records its
	// success: wait for all of it, in one reading of the metrics taken after the
	// engines were seen.
	wants := []string{
		`kvindex_discovery_up{source="file"} 1`,
		`kvindex_engine_changes_total{change="rejected",source="file"} 1`,
		`kvindex_engine_changes_total{change="replaced",source="file"} 1`, // b: model "m" -> ""
		`kvindex_engines{source="file"} 2`,
	}
	var m string
	waitForState(t, func() (bool, string) {
		keys := engineKeys(s, server.SourceFile)
		m = c.text("/metrics")
		missing := slices.DeleteFunc(slices.Clone(wants), func(w string) bool { return strings.Contains(m, w) })
		return slices.Equal(keys, []string{"b", "d"}) && len(missing) == 0,
			fmt.Sprintf("engines %v, metrics lack %q:\n%s", keys, missing, m)
	})
	if errs := metricValue(m, `kvindex_discovery_errors_total{source="file"}`); errs < 1 {
		t.Errorf("discovery errors %v, want >= 1", errs)
	}

	// An empty list removes every engine of the file (and only those).
	if _, _, err := s.AddEngine(server.EngineConfig{Endpoint: eps["a"], Worker: "api-a", Model: "m"}); err != nil {
		t.Fatal(err)
	}
	write(`[]`, false)
	waitFor(t, "no file engines", func() bool { return len(engineKeys(s, server.SourceFile)) == 0 })
	if got := engineKeys(s, server.SourceAPI); !slices.Equal(got, []string{"api-a"}) {
		t.Fatalf("API engines %v", got)
	}
}

// metricValue returns the value of one series line of a /metrics text, or -1.
func metricValue(text, series string) float64 {
	for _, line := range strings.Split(text, "\n") {
		if v, ok := strings.CutPrefix(line, series+" "); ok {
			var f float64
			if _, err := fmt.Sscan(v, &f); err == nil {
				return f
			}
		}
	}
	return -1
}

// TestFileDiscoveryStartup: New fails on an engines file that is missing, does not
// parse, is too large or lists an engine that does not validate.
func TestFileDiscoveryStartup(t *testing.T) {
	dir := t.TempDir()
	file := func(name, content string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	// One byte past the bound, written sparse (its bytes are never read: serve refuses
	// it by its size).
	big := file("big.json", "[")
	if err := os.Truncate(big, server.MaxEnginesFileBytes+1); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ path, want string }{
		{filepath.Join(dir, "missing.json"), "no such file"},
		{file("syntax.json", `[{"endpoint": }]`), "invalid character"},
		{file("field.json", `[{"endpoint": "tcp://h:1", "colour": 1}]`), "unknown field"},
		{file("twice.json", `[{"endpoint": "tcp://h:1", "endpoint": "tcp://h:2"}]`), "given twice"},
		{file("engine.json", `{"engines": [{"endpoint": "tcp://*:1"}]}`), "must name a host"},
		{big, "too large"},
	} {
		cfg := server.Config{Discovery: server.DiscoveryConfig{File: &server.FileDiscovery{Path: tc.path}}}
		s, err := server.New(cfg, server.Options{})
		if err == nil {
			s.Shutdown(t.Context())
		}
		if !errors.Is(err, server.ErrConfig) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want ErrConfig mentioning %q", filepath.Base(tc.path), err, tc.want)
		}
	}
	for _, fd := range []server.FileDiscovery{{}, {Path: "x", Interval: server.Duration(time.Microsecond)}} {
		if err := (server.Config{Discovery: server.DiscoveryConfig{File: &fd}}).Validate(); !errors.Is(err, server.ErrConfig) {
			t.Errorf("%+v: %v", fd, err)
		}
	}
}
