package main

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/kvindex/kvindex/server"
)

// curlLine is one of the lines kvindex demo prints: curl -s URL [-d 'BODY'] [| grep -E 'RE'].
var curlLine = regexp.MustCompile(`(?m)^  curl -s (\S+)(?: -d '([^']*)')?(?: \| grep -E '([^']*)')?$`)

// runCurls runs the three curl lines of out as curl and grep would (a POST when -d is
// given) and returns each one's output.
func runCurls(t *testing.T, out string) []string {
	t.Helper()
	lines := curlLine.FindAllStringSubmatch(out, -1)
	if len(lines) != 3 {
		t.Fatalf("demo printed %d curl lines, want 3:\n%s", len(lines), out)
	}
	tr := &http.Transport{}
	defer tr.CloseIdleConnections()
	hc := &http.Client{Transport: tr, Timeout: 10 * time.Second}
	var res []string
	for _, l := range lines {
		var resp *http.Response
		var err error
		if l[2] != "" {
			resp, err = hc.Post(l[1], "application/x-www-form-urlencoded", strings.NewReader(l[2])) // curl -d's content type
		} else {
			resp, err = hc.Get(l[1])
		}
		if err != nil {
			t.Fatalf("%s: %v", l[0], err)
		}
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil || resp.StatusCode != 200 {
			t.Fatalf("%s: status %d, %v: %s", l[0], resp.StatusCode, err, b)
		}
		body := string(b)
		if l[3] != "" {
			re := regexp.MustCompile(l[3])
			var kept []string
			for _, line := range strings.Split(body, "\n") {
				if re.MatchString(line) {
					kept = append(kept, line)
				}
			}
			body = strings.Join(kept, "\n")
		}
		res = append(res, body)
	}
	return res
}

// checkCurls checks what the demo's curl lines answered: every engine is a live worker,
// the prompt matches some of them in full, the metrics count blocks and events.
func checkCurls(t *testing.T, res []string, engines int) {
	t.Helper()
	var ws struct {
		Workers []server.WorkerInfo `json:"workers"`
	}
	if err := json.Unmarshal([]byte(res[0]), &ws); err != nil || len(ws.Workers) != engines {
		t.Fatalf("/v1/workers: %v, %d workers, want %d: %s", err, len(ws.Workers), engines, res[0])
	}
	var mr server.MatchResponse
	if err := json.Unmarshal([]byte(res[1]), &mr); err != nil || len(mr.Matches) == 0 || mr.Pick == nil {
		t.Fatalf("/v1/match: %v: %s", err, res[1])
	}
	for _, m := range mr.Matches {
		if m.Score != demoSystemBlocks {
			t.Errorf("match %+v: score %d, want the whole prompt (%d blocks)", m, m.Score, demoSystemBlocks)
		}
	}
	if !regexp.MustCompile(`(?m)^kvindex_blocks [1-9]`).MatchString(res[2]) || !strings.Contains(res[2], `kvindex_events_applied_total{kind="stored",worker="e0000"}`) {
		t.Fatalf("metrics lines:\n%s", res[2])
	}
}

// TestDemo: `kvindex demo` starts simulated engines and a serve, and the three curl
// lines it prints work: the workers, a match, the metrics.
func TestDemo(t *testing.T) {
	var out, errOut syncBuffer
	done, stop := background(t, func(ctx context.Context) int {
		return demoMain(ctx, []string{"--listen", "127.0.0.1:0", "--engines", "3", "--batch-rate", "200"}, &out, &errOut)
	})
	poll(t, "demo prints its curl lines", func() bool { return strings.Contains(out.String(), "Ctrl-C stops it.") })
	if !strings.Contains(out.String(), "kvindex serve --listen 127.0.0.1:") {
		t.Fatalf("no serve command line:\n%s", out.String())
	}
	checkCurls(t, runCurls(t, out.String()), 3)
	stop()
	if code := waitExit(t, done, "demo", &errOut); code != 0 {
		t.Fatalf("demo exit %d: %s", code, errOut.String())
	}
}

// serveArgs turns the serve command the demo prints into serve's arguments.
func serveArgs(t *testing.T, out string) []string {
	t.Helper()
	i := strings.Index(out, "kvindex serve ")
	if i < 0 {
		t.Fatalf("no serve command in:\n%s", out)
	}
	cmd := out[i+len("kvindex serve "):]
	cmd = cmd[:strings.Index(cmd, "\n\n")]
	return strings.Fields(strings.ReplaceAll(cmd, "\\\n", " "))
}

// TestDemoEnginesOnly: `kvindex demo --engines-only` prints a serve command that,
// run as printed, follows its engines; once it does, the curl lines the demo prints
// then work.
func TestDemoEnginesOnly(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close() // serve binds it below
	var out, errOut syncBuffer
	done, stop := background(t, func(ctx context.Context) int {
		return demoMain(ctx, []string{"--engines-only", "--listen", addr, "--engines", "2", "--batch-rate", "200"}, &out, &errOut)
	})
	poll(t, "demo prints the serve command", func() bool { return strings.Contains(out.String(), "waiting for serve") })
	args := append(serveArgs(t, out.String()), "--log-level", "warn")
	var sOut, sErr syncBuffer
	sDone, sStop := background(t, func(ctx context.Context) int { return serveMain(ctx, args, &sOut, &sErr) })
	if got := waitListening(t, &sOut, &sErr); got != addr {
		t.Fatalf("serve listens on %s, the demo said %s", got, addr)
	}
	poll(t, "demo prints its curl lines", func() bool { return strings.Contains(out.String(), "Ctrl-C stops it.") })
	checkCurls(t, runCurls(t, out.String()), 2)
	sStop()
	if code := waitExit(t, sDone, "serve", &sErr); code != 0 {
		t.Fatalf("serve exit %d: %s", code, sErr.String())
	}
	stop()
	if code := waitExit(t, done, "demo", &errOut); code != 0 {
		t.Fatalf("demo exit %d: %s", code, errOut.String())
	}
}

// TestTraceMissingSaysWhere: a --trace file that does not exist is a runtime failure
// whose message says where the public Mooncake traces are (it named only the path).
func TestTraceMissingSaysWhere(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "conversation_trace.jsonl")
	for _, args := range [][]string{
		{"sim", "--trace", missing},
		{"gen-ops", "--trace", missing, "--out", filepath.Join(t.TempDir(), "ops.jsonl")},
	} {
		code, _, stderr := runCLI(t, args...)
		if code != 1 || !strings.Contains(stderr, missing) || !strings.Contains(stderr, traceURL) {
			t.Errorf("%v: exit %d, stderr %q; want 1, the path and %s", args, code, stderr, traceURL)
		}
	}
}
