package server_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"runtime/metrics"
	"slices"
	"strings"
	"testing"

	"github.com/kvindex/kvindex/engine"
	"github.com/kvindex/kvindex/internal/freeport"
	"github.com/kvindex/kvindex/server"
	"github.com/kvindex/kvindex/subscriber"
)

func metricsText(t *testing.T, s *server.Server) string {
	t.Helper()
	rec := httptest.NewRecorder()
	s.Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	return rec.Body.String()
}

// TestWarmRestartOneFile: with Options.Snapshot the server keeps its index in one
// atomic file. New removes what a killed write left (FILE.tmp-*) and the FILE.cursors
// sidecar of older builds, and starts empty without a file; Shutdown writes the file,
// private to its owner (0600), the only file in its directory, and counts the write in
// /metrics; the next New restores it: a configured worker keeps its blocks only with a
// checkpoint to resume from (here none: it is cleared and syncs afresh), a worker no
// longer configured is removed.
func TestWarmRestartOneFile(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "index.snap")
	for _, stale := range []string{"index.snap.tmp-123", "index.snap.tmp-9", "index.snap.cursors"} {
		if err := os.WriteFile(filepath.Join(dir, stale), []byte("left by a kill"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	cfg := server.Config{Listen: "127.0.0.1:0", Engines: []server.EngineConfig{{Endpoint: freeport.Endpoint(t), Worker: "w", Model: "m", BlockSize: 4}}}
	opts := server.Options{Snapshot: server.SnapshotOptions{Path: path}}
	s, err := server.New(cfg, opts)
	if err != nil {
		t.Fatal(err)
	}
	if names := dirNames(t, dir); len(names) != 0 {
		t.Fatalf("after New: %q, want the stale files gone and no snapshot yet", names)
	}
	if st := s.Engine().Stats(); st.Blocks != 0 {
		t.Fatalf("a fresh index holds %d blocks", st.Blocks)
	}
	ns := subscriber.Namespace("m", "")
	for _, w := range []string{"w", "gone"} {
		ev := engine.Event{Kind: engine.EventStored, Worker: w, Namespace: ns, Blocks: []engine.Block{{Content: 1, Seq: 1}, {Content: 2, Seq: 2}}}
		if err := s.Engine().Apply(&ev); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	if names := dirNames(t, dir); !slices.Equal(names, []string{"index.snap"}) {
		t.Fatalf("after Shutdown: %q, want index.snap alone", names)
	}
	if fi, err := os.Stat(path); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("snapshot %v, %v: want mode 0600", fi, err)
	}
	if m := metricsText(t, s); !strings.Contains(m, `kvindex_snapshot_writes_total{result="ok"} 1`) {
		t.Fatalf("the final write not counted:\n%s", grepLines(m, "kvindex_snapshot"))
	}
	r, err := server.New(cfg, opts)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Shutdown(context.Background())
	if n, ok := r.Engine().WorkerSize("gone"); ok || n != 0 {
		t.Fatalf("a worker no longer configured was restored with %d blocks", n)
	}
	if n, _ := r.Engine().WorkerSize("w"); n != 0 {
		t.Fatalf("a worker without a checkpoint kept %d blocks: it must sync afresh", n)
	}
}

// TestWarmRestartOptions: what New refuses of Options.Snapshot and Options.Replica.
func TestWarmRestartOptions(t *testing.T) {
	cfg := server.Config{Listen: "127.0.0.1:0", Models: map[string]int{"m": 4}}
	index, err := engine.New(engine.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer index.Close()
	dir := t.TempDir()
	for _, c := range []struct {
		name string
		opts server.Options
		want string
	}{
		{"index and snapshot", server.Options{Index: index, Snapshot: server.SnapshotOptions{Path: filepath.Join(dir, "x")}}, "Options.Index"},
		{"index and replica", server.Options{Index: index, Replica: &server.ReplicaOptions{URL: "nats://127.0.0.1:1"}}, "Options.Index"},
		{"replica without URL", server.Options{Replica: &server.ReplicaOptions{}}, "NATS URL"},
		{"object store without replica", server.Options{Snapshot: server.SnapshotOptions{Path: "jetstream-object://b/n"}}, "needs Options.Replica"},
		{"missing directory", server.Options{Snapshot: server.SnapshotOptions{Path: filepath.Join(dir, "no", "x")}}, "snapshot: directory"},
		{"a directory", server.Options{Snapshot: server.SnapshotOptions{Path: dir}}, "is a directory"},
	} {
		s, err := server.New(cfg, c.opts)
		if err == nil {
			s.Shutdown(context.Background())
		}
		if !errors.Is(err, server.ErrConfig) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want ErrConfig saying %q", c.name, err, c.want)
		}
	}
}

func dirNames(t *testing.T, dir string) []string {
	t.Helper()
	es, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range es {
		out = append(out, e.Name())
	}
	return out
}

func grepLines(text, sub string) string {
	var out []string
	for _, l := range strings.Split(text, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// TestSnapshotKeptAside (issue 33, row 13): a 2 GiB file at the snapshot path was read
// whole before its magic was checked (4.5 GB RSS), and an unusable snapshot, damaged or
// of a newer version, was overwritten by the next write without a copy. Now the size
// and the magic are checked first (the 2 GiB file is not read: the heap grows by far
// less than it), and each unusable file is kept aside as FILE.unusable while the index
// starts empty.
func TestSnapshotKeptAside(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "good.snap")
	e, err := engine.New(engine.Config{Shards: 1})
	if err != nil {
		t.Fatal(err)
	}
	if err := e.WriteSnapshotFile(good); err != nil {
		t.Fatal(err)
	}
	e.Close()
	valid, err := os.ReadFile(good)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(string(valid), "KVIXSNAP") {
		t.Fatalf("an engine snapshot starts %q, not the magic serve checks", valid[:8])
	}
	damaged := slices.Clone(valid)
	damaged[len(damaged)/2] ^= 0xff
	newer := slices.Clone(valid)
	newer[8] = 99 // the version, after the magic
	for _, c := range []struct {
		name  string
		write func(path string) error
	}{
		{"2 GiB of zeros", func(path string) error {
			if err := os.WriteFile(path, nil, 0o600); err != nil {
				return err
			}
			return os.Truncate(path, 2<<30) // sparse: no disk taken
		}},
		{"damaged", func(path string) error { return os.WriteFile(path, damaged, 0o600) }},
		{"newer version", func(path string) error { return os.WriteFile(path, newer, 0o600) }},
		{"past MaxBytes", func(path string) error { return os.WriteFile(path, valid, 0o600) }},
	} {
		t.Run(c.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "index.snap")
			if err := c.write(path); err != nil {
				t.Fatal(err)
			}
			before, _ := os.Stat(path)
			maxBytes := int64(0)
			if c.name == "past MaxBytes" {
				maxBytes = int64(len(valid) - 1)
			}
			allocs := heapAllocs()
			s, err := server.New(server.Config{Listen: "127.0.0.1:0", Models: map[string]int{"m": 4}},
				server.Options{Snapshot: server.SnapshotOptions{Path: path, MaxBytes: maxBytes}})
			if err != nil {
				t.Fatal(err)
			}
			grown := heapAllocs() - allocs
			if err := s.Shutdown(context.Background()); err != nil {
				t.Fatal(err)
			}
			if grown > 256<<20 {
				t.Fatalf("New allocated %d MiB reading a %d-byte file", grown>>20, before.Size())
			}
			kept, err := os.Stat(path + ".unusable")
			if err != nil || kept.Size() != before.Size() {
				t.Fatalf("the unusable file was not kept aside: %v", err)
			}
			if _, err := os.Stat(path); err != nil {
				t.Fatalf("no new snapshot written: %v", err)
			}
		})
	}
}

// heapAllocs is the bytes allocated on the heap so far.
func heapAllocs() uint64 {
	s := []metrics.Sample{{Name: "/gc/heap/allocs:bytes"}}
	metrics.Read(s)
	return s[0].Value.Uint64()
}
