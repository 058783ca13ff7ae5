package fabric

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/kvindex/kvindex/internal/warnlimit"
)

// countingHandler counts the warnings logged through it.
type countingHandler struct{ warns *atomic.Int64 }

func (h countingHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h countingHandler) Handle(_ context.Context, r slog.Record) error {
	if r.Level == slog.LevelWarn {
		h.warns.Add(1)
	}
	return nil
}
func (h countingHandler) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h countingHandler) WithGroup(string) slog.Handler      { return h }

// TestReplicaWarningsRateLimited: a publisher that makes every stream message a warning
// (here 300 undecodable ones) cannot flood the replica's log: every message is skipped
// and counted (Malformed), and at most warnlimit.Burst warnings pass at once, then one
// per warnlimit.Every of the time the replica took (one warning a message before).
func TestReplicaWarningsRateLimited(t *testing.T) {
	const bad = 300
	ctx, _, nc, _, sc, _ := memoryStream(t, 23, 10)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	for i := range bad {
		if _, err := js.Publish(ctx, Subject(DefaultSubjectPrefix, testModel, "w"), []byte{0xc1, byte(i)}); err != nil {
			t.Fatal(err)
		}
	}
	var warns atomic.Int64
	start := time.Now()
	r := newReplica(t, ctx, nc, ReplicaConfig{Stream: sc, Logger: slog.New(countingHandler{&warns})}, "")
	waitApplied(t, ctx, r, streamLast(t, ctx, nc, DefaultStream))
	elapsed := time.Since(start)
	if st := r.Stats(); st.Malformed != bad || st.Applied != 0 {
		t.Fatalf("stats %+v, want %d malformed and none applied", st, bad)
	}
	limit := int64(warnlimit.Burst) + int64(elapsed/warnlimit.Every) + 1
	if n := warns.Load(); n < 1 || n > limit {
		t.Fatalf("%d warnings for %d bad messages in %v, want 1 to %d", n, bad, elapsed, limit)
	}
}

// TestReplicaRemovesStaleTemp: Start removes the temporary files a killed Snapshot
// write left beside the snapshot (FILE.tmp-*), and its next Snapshot leaves one file.
func TestReplicaRemovesStaleTemp(t *testing.T) {
	ctx, _, nc, _, sc, _ := memoryStream(t, 24, 10)
	dir := t.TempDir()
	snap := filepath.Join(dir, "r.snap")
	for _, stale := range []string{"r.snap.tmp-1", "r.snap.tmp-77"} {
		if err := os.WriteFile(filepath.Join(dir, stale), []byte("half a snapshot"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	r := newReplica(t, ctx, nc, ReplicaConfig{Stream: sc}, snap)
	if es, err := os.ReadDir(dir); err != nil || len(es) != 0 {
		t.Fatalf("after Start: %v %v, want the temporary files gone", es, err)
	}
	if err := r.Snapshot(snap); err != nil {
		t.Fatal(err)
	}
	if es, err := os.ReadDir(dir); err != nil || len(es) != 1 || es[0].Name() != "r.snap" {
		t.Fatalf("after Snapshot: %v %v, want r.snap alone", es, err)
	}
}
