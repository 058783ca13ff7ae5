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

// TestInvariantsCatchCorruption: in a -tags invariants build the engine checks after
// every event, so the first event after a worker's hole count is corrupted panics with what broke, and an owner-only method run by a goroutine that
// does not hold the worker's mutex panics naming it. Skipped without the tag, where the
// checks compile away. (A shard's corrupted table: shard's TestInvariantsBuildCatchesCorruption.)
func TestInvariantsCatchCorruption(t *testing.T) {
	if !invariants.Enabled {
		t.Skip("needs -tags invariants")
	}
	chain := []Block{{Content: 1, Seq: 1}, {Content: 2, Seq: 2}, {Content: 3, Seq: 3}}
	t.Run("holes", func(t *testing.T) {
		e, err := New(Config{Shards: 1})
		if err != nil {
			t.Fatal(err)
		}
		defer e.Close()
		if err := e.Store("w", chain); err != nil {
			t.Fatal(err)
		}
		w := e.lookup("w")
		w.lockMu()
		w.holes++
		w.unlockMu()
		msg := catchPanic(func() { _ = e.StoreUnder("w", 3, []Block{{Content: 4, Seq: 4}}) })
		if !strings.Contains(msg, "invariant broken") || !strings.Contains(msg, "holes") {
			t.Fatalf("event after a corrupted hole count: panic %q", msg)
		}
	})
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
