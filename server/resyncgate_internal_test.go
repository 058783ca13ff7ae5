package server

import (
	"fmt"
	"testing"
	"time"
)

// TestResyncGate (issue 33, row 12): clients calling resync in a loop held the
// replica's lock replay after replay. The gate runs one resync at a time and one per
// worker per resyncInterval, refusing the rest with how long to wait, and forgets a
// worker once its interval ended (the map stays bounded).
func TestResyncGate(t *testing.T) {
	var g resyncGate
	t0 := time.Unix(1000, 0)
	if _, why := g.admit("a", t0); why != "" {
		t.Fatalf("the first resync: %s", why)
	}
	if wait, why := g.admit("b", t0); why != "busy" || wait <= 0 {
		t.Fatalf("while one runs: %v %s", wait, why)
	}
	g.done()
	if wait, why := g.admit("a", t0.Add(time.Second)); why != "recent" || wait != resyncInterval-time.Second {
		t.Fatalf("the same worker again: %v %s", wait, why)
	}
	if _, why := g.admit("b", t0.Add(time.Second)); why != "" {
		t.Fatalf("another worker: %s", why)
	}
	g.done()
	for i := range 100 { // 100 workers in a row, each interval ending before the next
		now := t0.Add(time.Duration(i+1) * resyncInterval)
		if _, why := g.admit(fmt.Sprint("w", i), now); why != "" {
			t.Fatalf("worker %d: %s", i, why)
		}
		g.done()
		if len(g.last) > 2 {
			t.Fatalf("%d workers remembered", len(g.last))
		}
	}
}
