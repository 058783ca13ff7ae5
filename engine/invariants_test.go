package engine

import (
	"fmt"
	"strings"
	"testing"

	"github.com/kvindex/kvindex/internal/invariants"
)

// catchPanic runs f and returns what it panicked with, as a string ("" if nothing).
func catchPanic(f func()) (msg string) {
	defer func() {
		if r := recover(); r != nil {
			msg = fmt.Sprint(r)
		}
	}()
	f()
	return ""
}

// TestInvariantsCatchCorruption: in a -tags invariants build an owner-only method run
// by a goroutine that does not hold the worker's mutex panics naming it. Skipped
// without the tag, where the checks compile away. (A worker's corrupted hole count:
// package engine/internal/worker's TestInvariantsCatchCorruption; a shard's corrupted
// table: shard's TestInvariantsBuildCatchesCorruption.)
func TestInvariantsCatchCorruption(t *testing.T) {
	if !invariants.Enabled {
		t.Skip("needs -tags invariants")
	}
	chain := []Block{{Content: 1, Seq: 1}, {Content: 2, Seq: 2}, {Content: 3, Seq: 3}}
	t.Run("owner", func(t *testing.T) {
		e, err := New(Config{Shards: 1})
		if err != nil {
			t.Fatal(err)
		}
		defer e.Close()
		if err := e.Store("w", chain); err != nil {
			t.Fatal(err)
		}
		w := e.lookup("w")
		ev := Event{Kind: EventRemoved, Worker: "w", Seqs: []uint64{3}}
		// No goroutine holds w's mutex: its owner-only methods must refuse to run.
		msg := catchPanic(func() { _, _ = e.applyLocked(w, &ev) })
		if !strings.Contains(msg, "invariants: worker event ran on goroutine") {
			t.Fatalf("applyLocked without the worker's mutex: panic %q", msg)
		}
	})
}
