package fabric

import (
	"context"
	"log/slog"
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
