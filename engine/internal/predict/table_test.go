package predict

import (
	"slices"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// hits is AppendHits under the read lock, sorted by worker.
func hits(p *Table, root uint64, ns uint32, content []uint64, now int64) []Hit {
	p.RLock()
	defer p.RUnlock()
	h := p.AppendHits(nil, root, ns, content, false, now)
	slices.SortFunc(h, func(a, b Hit) int { return cmpString(a.Worker, b.Worker) })
	return h
}

func cmpString(a, b string) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// TestTable: the table against what the engine's prediction semantics say of it: the
// longest common prefix per worker, a refresh replacing the same prediction, expiry
// skipped by readers and freed by a sweep, the worker's and the engine's bounds ending
// the oldest first, and the event hooks ending the marked entries only. (The engine's
// TestPredict* tests hold the whole to the reference model.)
func TestTable(t *testing.T) {
	var p Table
	ins := func(w string, ns uint32, content []uint64, now, exp int64, per, max int) {
		p.Lock()
		p.Insert(w, ns, slices.Clone(content), slices.Clone(content), content[0], now, exp, per, max)
		p.Unlock()
	}
	ins("a", 0, []uint64{1, 2, 3}, 0, 100, 8, 100)
	ins("a", 0, []uint64{1, 2, 9, 9}, 0, 100, 8, 100)
	ins("b", 0, []uint64{1, 7}, 0, 50, 8, 100)
	ins("b", 1, []uint64{1, 2, 3}, 0, 100, 8, 100) // another namespace
	if got, want := hits(&p, 1, 0, []uint64{1, 2, 3, 4}, 10), []Hit{{"a", 3}, {"b", 1}}; !slices.Equal(got, want) {
		t.Fatalf("hits %v, want %v", got, want)
	}
	ins("a", 0, []uint64{1, 2, 3}, 0, 100, 8, 100) // a refresh
	if n, blocks, workers := p.Stats(); n != 4 || blocks != 12 || workers != 2 {
		t.Fatalf("after a refresh: %d predictions, %d blocks, %d workers", n, blocks, workers)
	}
	// b's prediction in ns 0 expires at 50: skipped, then freed.
	if got, want := hits(&p, 1, 0, []uint64{1, 7}, 60), []Hit{{"a", 1}}; !slices.Equal(got, want) {
		t.Fatalf("after b's expiry: hits %v, want %v", got, want)
	}
	p.Lock()
	p.Sweep(60)
	p.Unlock()
	if n, _, _ := p.Stats(); n != 3 {
		t.Fatalf("after the sweep: %d predictions, want 3", n)
	}
	// The worker's bound: a third prediction of a with 2 allowed ends its oldest,
	// {1, 2, 9, 9} ({1, 2, 3} was refreshed since).
	ins("a", 0, []uint64{1, 5}, 60, 100, 2, 100)
	if got, want := hits(&p, 1, 0, []uint64{1, 2, 9, 9}, 60), []Hit{{"a", 2}}; !slices.Equal(got, want) {
		t.Fatalf("after a's bound: hits %v, want %v", got, want)
	}
	if got := hits(&p, 1, 0, []uint64{1, 2, 3}, 60); len(got) != 1 || got[0].N != 3 {
		t.Fatalf("a's refreshed {1, 2, 3} should be kept: hits %v", got)
	}
	// The hooks: a store confirming a's {1, 5} (its last key at position 1) ends it only.
	p.Lock()
	pw := p.Worker("a")
	p.ResetMarks()
	p.MarkConfirmed(pw, 0, 1, 5)
	p.MarkConfirmed(pw, 0, 1, 5) // marked once
	p.EndMarked()
	p.Unlock()
	if got, want := hits(&p, 1, 0, []uint64{1, 5}, 60), []Hit{{"a", 1}}; !slices.Equal(got, want) {
		t.Fatalf("after the confirmation: hits %v, want %v", got, want)
	}
	// The engine's bound: 3 blocks in all end the oldest entries until the new one fits.
	ins("c", 0, []uint64{1, 2, 3}, 60, 100, 8, 3)
	if n, blocks, _ := p.Stats(); n != 1 || blocks != 3 {
		t.Fatalf("after the engine's bound: %d predictions, %d blocks", n, blocks)
	}
	p.Lock()
	p.EndWorker("c")
	p.Unlock()
	if p.Live() != 0 {
		t.Fatalf("%d predictions left", p.Live())
	}
}
