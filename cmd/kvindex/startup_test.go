package main

import (
	"context"
	"encoding/json"
	"github.com/kvindex/kvindex/internal/freeport"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestServeStartupChecks: what serve will need later fails the start, with its reason:
// a snapshot directory that is missing, a snapshot path that is a directory, an HTTP,
// gRPC or engine bind address in use.
func TestServeStartupChecks(t *testing.T) {
	dir := t.TempDir()
	held, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	busy := held.Addr().String()
	engine := "endpoint=" + freeport.Endpoint(t)
	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"--engine", engine, "--snapshot", filepath.Join(dir, "missing", "x.snap")}, 2, "snapshot: directory"},
		{[]string{"--engine", engine, "--snapshot", dir}, 2, "is a directory"},
		{[]string{"--engine", engine, "--listen", busy}, 1, "address already in use"},
		{[]string{"--engine", engine, "--listen", "127.0.0.1:0", "--grpc", busy}, 1, "--grpc " + busy},
		{[]string{"--engine", "endpoint=tcp://" + busy + ",bind=true", "--listen", "127.0.0.1:0"}, 1, "binds tcp://" + busy},
	} {
		var out, errOut syncBuffer
		args := append([]string{"--log-level", "error"}, tc.args...)
		if !strings.Contains(strings.Join(tc.args, " "), "--listen") {
			args = append(args, "--listen", "127.0.0.1:0")
		}
		code := serveMain(context.Background(), args, &out, &errOut)
		if code != tc.code || !strings.Contains(errOut.String(), tc.want) {
			t.Errorf("%q: exit %d, stderr %q; want %d and %q", tc.args, code, errOut.String(), tc.code, tc.want)
		}
	}
}

var snapshotWrites = regexp.MustCompile(`kvindex_snapshot_writes_total\{result="(ok|error)"\} (\d+)`)

// TestServeFinalSnapshotFails: a snapshot that cannot be written is counted in
// /metrics (periodic writes), and a failed final snapshot makes serve exit 1 with the
// reason.
func TestServeFinalSnapshotFails(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "snaps")
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	var out, errOut syncBuffer
	args := []string{"--listen", "127.0.0.1:0", "--log-level", "error", "--engine", "endpoint=" + freeport.Endpoint(t),
		"--snapshot", filepath.Join(dir, "index.snap"), "--snapshot-interval", "20ms"}
	done, cancel := background(t, func(ctx context.Context) int { return serveMain(ctx, args, &out, &errOut) })
	addr := waitListening(t, &out, &errOut)
	writes := func() map[string]int {
		resp, err := http.Get("http://" + addr + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		n := map[string]int{}
		for _, m := range snapshotWrites.FindAllStringSubmatch(string(b), -1) {
			n[m[1]], _ = strconv.Atoi(m[2])
		}
		return n
	}
	wait := func(what string, cond func(map[string]int) bool) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for !cond(writes()) {
			if time.Now().After(deadline) {
				t.Fatalf("timed out waiting for %s: %v", what, writes())
			}
			time.Sleep(10 * time.Millisecond) // bounded poll of a condition
		}
	}
	wait("a snapshot written", func(n map[string]int) bool { return n["ok"] >= 1 && n["error"] == 0 })
	// The directory goes away (renamed at once: the periodic writer may be creating a
	// file in it).
	if err := os.Rename(dir, dir+".gone"); err != nil {
		t.Fatal(err)
	}
	wait("a failed snapshot counted", func(n map[string]int) bool { return n["error"] >= 1 })
	cancel()
	if code := <-done; code != 1 || !strings.Contains(errOut.String(), "final snapshot") {
		t.Fatalf("exit %d, stderr %q; want 1 and the final snapshot's error", code, errOut.String())
	}
}

// TestServeEngineDPRank: --engine dp_rank=R is one rank on its own endpoint (worker
// ID#dpR); it needs a worker and excludes dp_ranks.
func TestServeEngineDPRank(t *testing.T) {
	var out, errOut syncBuffer
	if code := serveMain(context.Background(), []string{"--engine", "endpoint=tcp://h:7,worker=p,dp_rank=3", "--check", "--listen", "127.0.0.1:0"}, &out, &errOut); code != 0 ||
		!strings.Contains(out.String(), `"dp_rank": 3`) {
		t.Fatalf("exit %d: %s %s", code, out.String(), errOut.String())
	}
	for _, tc := range []struct{ spec, want string }{
		{"endpoint=tcp://h:7,worker=p,dp_rank=x", "dp_rank"},
		{"endpoint=tcp://h:7,dp_rank=1", "dp_rank needs a worker"},
		{"endpoint=tcp://h:7,worker=p,dp_rank=1,dp_ranks=2", "excludes dp_ranks"},
	} {
		var out, errOut syncBuffer
		if code := serveMain(context.Background(), []string{"--engine", tc.spec, "--check"}, &out, &errOut); code != 2 || !strings.Contains(errOut.String(), tc.want) {
			t.Errorf("%s: exit %d, stderr %q; want 2 and %q", tc.spec, code, errOut.String(), tc.want)
		}
	}
}

// TestServeCheck: --check runs serve's own start checks without serving: a snapshot
// path that is a directory and a non-loopback address nobody authenticates are
// configuration errors (2), an HTTP address in use is 1, and a configuration that
// passes prints with its defaults filled in.
func TestServeCheck(t *testing.T) {
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	eng := "endpoint=tcp://h:7,worker=p"
	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"--snapshot", t.TempDir()}, 2, "is a directory"},
		{[]string{"--snapshot", filepath.Join(t.TempDir(), "missing", "snap")}, 2, "snapshot: directory"},
		{[]string{"--listen", "0.0.0.0:0"}, 2, "refusing to serve unauthenticated"},
		{[]string{"--listen", busy.Addr().String()}, 1, "address already in use"},
	} {
		var out, errOut syncBuffer
		args := append([]string{"--check", "--listen", "127.0.0.1:0", "--engine", eng}, tc.args...)
		if code := serveMain(context.Background(), args, &out, &errOut); code != tc.code || !strings.Contains(errOut.String(), tc.want) || out.String() != "" {
			t.Errorf("%q: exit %d, stdout %q, stderr %q; want %d and %q", tc.args, code, out.String(), errOut.String(), tc.code, tc.want)
		}
	}
	var out, errOut syncBuffer
	if code := serveMain(context.Background(), []string{"--check", "--listen", "127.0.0.1:0", "--engine", eng,
		"--snapshot", filepath.Join(t.TempDir(), "snap")}, &out, &errOut); code != 0 {
		t.Fatalf("exit %d: %s", code, errOut.String())
	}
	var eff struct {
		BlockSize int    `json:"block_size"`
		Policy    string `json:"policy"`
	}
	if err := json.Unmarshal([]byte(out.String()), &eff); err != nil || eff.BlockSize != 16 || eff.Policy == "" {
		t.Fatalf("effective configuration %q (%v): want the defaults filled in", out.String(), err)
	}
}
