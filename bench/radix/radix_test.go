package radix

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/kvindex/kvindex/engine"
	"github.com/kvindex/kvindex/internal/oplog"
	"github.com/kvindex/kvindex/internal/refmodel"
	"github.com/kvindex/kvindex/internal/replay"
	"github.com/kvindex/kvindex/internal/testsize"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// conformanceDir is where the shared golden logs live, relative to this package.
func conformanceDir() string {
	if d := os.Getenv("KVINDEX_CONFORMANCE"); d != "" {
		return d
	}
	return filepath.Join("..", "..", "..", "shared", "conformance")
}

// apply applies one non-query op and returns its error.
func apply(x *Index, op *oplog.Op) error {
	ev := replay.Event(op)
	return x.Apply(&ev)
}

// rejection names an error class, so that the tree's and the model's errors compare.
func rejection(err error) string {
	switch {
	case err == nil:
		return "ok"
	case errors.Is(err, ErrParentNotFound), errors.Is(err, refmodel.ErrParentNotFound):
		return "parent-not-found"
	case errors.Is(err, ErrInvalidEvent), errors.Is(err, refmodel.ErrInvalidEvent):
		return "invalid"
	}
	return "other: " + err.Error()
}

func sameAnswer(got []engine.Match, want []refmodel.Answer) bool {
	if len(got) != len(want) {
		return false
	}
	for i := range got {
		if got[i].Worker != want[i].Worker || got[i].Score != want[i].Score || got[i].Size != want[i].Size {
			return false
		}
	}
	return true
}

// check verifies the tree's structural invariants: every node but the root is held or has
// children (garbage collection is complete), parent links agree with children maps, the
// holder counts are exactly the workers' seq maps, and the counters are right.
func (x *Index) check() error {
	x.mu.Lock()
	defer x.mu.Unlock()
	counts := map[*node]map[uint32]uint32{}
	var blocks int64
	for name, w := range x.byName {
		if x.byID[w.wid] != w || w.name != name {
			return fmt.Errorf("worker %q: registry out of step", name)
		}
		for _, n := range w.seqs {
			if counts[n] == nil {
				counts[n] = map[uint32]uint32{}
			}
			counts[n][w.wid]++
		}
		blocks += int64(len(w.seqs))
	}
	if blocks != x.blocks {
		return fmt.Errorf("blocks counter %d, workers hold %d", x.blocks, blocks)
	}
	var nodes int64
	var walk func(n *node) error
	walk = func(n *node) error {
		if n.children != nil && len(n.children) == 0 {
			return fmt.Errorf("node %x keeps an empty children map", n.content)
		}
		for c, ch := range n.children {
			nodes++
			if ch.parent != n || ch.content != c {
				return fmt.Errorf("node %x: bad parent link", c)
			}
			if len(ch.holders) == 0 && len(ch.children) == 0 {
				return fmt.Errorf("node %x: neither held nor a parent, not collected", c)
			}
			want := counts[ch]
			if len(ch.holders) != len(want) {
				return fmt.Errorf("node %x: %d holders, workers say %d", c, len(ch.holders), len(want))
			}
			for _, h := range ch.holders {
				if h.n == 0 || want[h.wid] != h.n {
					return fmt.Errorf("node %x: worker %d count %d, workers say %d", c, h.wid, h.n, want[h.wid])
				}
			}
			delete(counts, ch)
			if err := walk(ch); err != nil {
				return err
			}
		}
		return nil
	}
	if len(x.root.holders) != 0 {
		return errors.New("root is held")
	}
	if err := walk(&x.root); err != nil {
		return err
	}
	if len(counts) != 0 {
		return fmt.Errorf("%d held nodes are not in the tree", len(counts))
	}
	if nodes != x.nodes {
		return fmt.Errorf("nodes counter %d, tree has %d", x.nodes, nodes)
	}
	return nil
}

// differential replays ops on the tree and the reference model side by side: every
// event's rejection class and every query's answer must agree.
func differential(t *testing.T, ops []oplog.Op, checkEvery int) {
	t.Helper()
	x := New()
	m := refmodel.New()
	var got []engine.Match
	for i := range ops {
		op := &ops[i]
		if op.Kind == oplog.Query {
			got = x.FindMatches(op.Content, got[:0])
			if want := m.Query(op.Content); !sameAnswer(got, want) {
				t.Fatalf("op %d: query %v\n got:  %+v\n want: %+v", i, op.Content, got, want)
			}
			continue
		}
		gotErr, wantErr := rejection(apply(x, op)), rejection(m.Apply(op))
		if gotErr != wantErr {
			t.Fatalf("op %d (%v %q): tree %s, model %s", i, op.Kind, op.Worker, gotErr, wantErr)
		}
		if checkEvery > 0 && i%checkEvery == 0 {
			if err := x.check(); err != nil {
				t.Fatalf("op %d: %v", i, err)
			}
		}
	}
	if err := x.check(); err != nil {
		t.Fatal(err)
	}
	if st := x.Stats(); st.Blocks != int64(m.Blocks()) || st.Workers != len(m.Workers()) {
		t.Fatalf("stats %+v, model has %d blocks and %d workers", st, m.Blocks(), len(m.Workers()))
	}
	// Forgetting every worker must free the whole tree.
	for _, w := range m.Workers() {
		if err := x.RemoveWorker(w); err != nil {
			t.Fatal(err)
		}
	}
	if st := x.Stats(); st.Nodes != 0 || st.Blocks != 0 || st.Workers != 0 {
		t.Fatalf("after removing every worker: %+v", st)
	}
}

func TestDifferentialRandom(t *testing.T) {
	shapes := []struct {
		name string
		opt  refmodel.RandomOptions
	}{
		{"default", refmodel.RandomOptions{}},
		{"alphabet=1", refmodel.RandomOptions{Alphabet: 1, MaxChain: 40}},
		{"workers=12/alphabet=50", refmodel.RandomOptions{Workers: 12, Alphabet: 50}},
	}
	// Under the race detector (make test) two histories a shape of 2,000 ops: the tree
	// is a mutex-guarded baseline, TestConcurrent is where its goroutines meet.
	seeds, n := uint64(testsize.Pick(4, 2)), testsize.Pick(5000, 2000)
	for _, sh := range shapes {
		for seed := uint64(1); seed <= seeds; seed++ {
			t.Run(fmt.Sprintf("%s/seed=%d", sh.name, seed), func(t *testing.T) {
				t.Parallel()
				ops := refmodel.RandomOps(rand.New(rand.NewPCG(seed, 0x7261646978)), n, sh.opt)
				differential(t, ops, 97)
			})
		}
	}
}

func TestConformance(t *testing.T) {
	files, _ := filepath.Glob(filepath.Join(conformanceDir(), "*.jsonl"))
	if len(files) == 0 {
		t.Skip("SKIP: ../../../shared/conformance not found (set KVINDEX_CONFORMANCE)")
	}
	for _, file := range files {
		t.Run(filepath.Base(file), func(t *testing.T) {
			if testing.Short() && filepath.Base(file) == "trace_conversation.jsonl" {
				t.Skip("SKIP (-short): the 19 MB trace log")
			}
			if !testsize.Full() && filepath.Base(file) == "trace_conversation.jsonl" {
				// One goroutine replays it: the race detector has nothing to find.
				t.Skip("SKIP (race detector): the 19 MB trace log; make test-long replays it")
			}
			t.Parallel()
			f, err := os.Open(file)
			if err != nil {
				t.Fatal(err)
			}
			ops, err := oplog.ReadAll(f)
			f.Close()
			if err != nil {
				t.Fatal(err)
			}
			x := New()
			var got []engine.Match
			passed := 0
			for i := range ops {
				op := &ops[i]
				if op.Kind != oplog.Query {
					if err := apply(x, op); err != nil && !engine.IsRejection(err) {
						t.Fatalf("line %d: %v", op.Line, err)
					}
					continue
				}
				got = x.FindMatches(op.Content, got[:0])
				if !op.HasExpect {
					continue
				}
				ok := len(got) == len(op.Expect) && len(got) == len(op.Sizes)
				for _, m := range got {
					ok = ok && op.Expect[m.Worker] == m.Score && op.Sizes[m.Worker] == m.Size
				}
				if !ok {
					t.Fatalf("line %d: got %+v, want scores %v sizes %v", op.Line, got, op.Expect, op.Sizes)
				}
				passed++
			}
			if err := x.check(); err != nil {
				t.Fatal(err)
			}
			t.Logf("%d queries passed", passed)
		})
	}
}

func blocks(pairs ...uint64) []engine.Block {
	out := make([]engine.Block, 0, len(pairs)/2)
	for i := 0; i+1 < len(pairs); i += 2 {
		out = append(out, engine.Block{Content: pairs[i], Seq: pairs[i+1]})
	}
	return out
}

func TestSpecRules(t *testing.T) {
	x := New()
	q := func(content ...uint64) string { return fmt.Sprint(x.FindMatches(content, nil)) }
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	// An empty store is nothing, even under an unknown parent.
	must(x.StoreUnder("w", 99, nil))
	if _, ok := x.Size("w"); ok {
		t.Fatal("an empty store made the worker known")
	}
	must(x.Store("a", blocks(1, 10, 2, 11, 3, 12, 4, 13)))
	// No cascade: removing position 1 leaves 2 and 3 held but unreachable.
	must(x.Remove("a", 11))
	if got := q(1, 2, 3, 4); got != "[{a 1 3 0 [1 1 1]}]" {
		t.Fatalf("after a middle removal: %s", got)
	}
	// A refill with a new seq reconnects the tail.
	must(x.StoreUnder("a", 10, blocks(2, 21)))
	if got := q(1, 2, 3, 4); got != "[{a 4 4 0 [4 4 4]}]" {
		t.Fatalf("after the refill: %s", got)
	}
	// Duplicates are no-ops; last write wins for a seq stored elsewhere.
	must(x.Store("a", blocks(1, 10)))
	must(x.Store("a", blocks(7, 13)))
	if got := q(1, 2, 3, 4); got != "[{a 3 4 0 [3 3 3]}]" {
		t.Fatalf("after moving seq 13: %s", got)
	}
	// Rejections, with ErrParentNotFound first when both apply.
	if err := x.StoreUnder("a", 555, blocks(5, 30, 6, 30)); !errors.Is(err, ErrParentNotFound) {
		t.Fatalf("both faults: %v", err)
	}
	if err := x.StoreUnder("a", 10, blocks(5, 10)); !errors.Is(err, ErrInvalidEvent) {
		t.Fatalf("seq = parent: %v", err)
	}
	if err := x.Store("a", blocks(5, 30, 6, 30)); !errors.Is(err, ErrInvalidEvent) {
		t.Fatalf("duplicate seq: %v", err)
	}
	if err := x.Store("", blocks(5, 30)); !errors.Is(err, ErrInvalidEvent) {
		t.Fatalf("empty worker: %v", err)
	}
	must(x.Clear("a"))
	if n, ok := x.Size("a"); !ok || n != 0 || q(1) != "[]" {
		t.Fatalf("after clear: size %d known %v, query %s", n, ok, q(1))
	}
	if st := x.Stats(); st.Nodes != 0 {
		t.Fatalf("cleared tree keeps %d nodes", st.Nodes)
	}
	must(x.RemoveWorker("a"))
	if _, ok := x.Size("a"); ok {
		t.Fatal("removed worker still known")
	}
}

// TestConcurrent runs writers on disjoint workers and readers at once; run with -race.
func TestConcurrent(t *testing.T) {
	x := New()
	ops := refmodel.RandomOps(rand.New(rand.NewPCG(9, 9)), 4000, refmodel.RandomOptions{Workers: 4})
	var wg sync.WaitGroup
	for p := range 2 {
		wg.Go(func() {
			for i := range ops {
				op := &ops[i]
				if op.Kind != oplog.Query && int(op.Worker[len(op.Worker)-1]-'0')%2 == p {
					_ = apply(x, op)
				}
			}
		})
	}
	for range 2 {
		wg.Go(func() {
			var dst []engine.Match
			for i := range ops {
				if ops[i].Kind == oplog.Query {
					dst = x.FindMatches(ops[i].Content, dst[:0])
				}
			}
		})
	}
	wg.Wait()
	if err := x.check(); err != nil {
		t.Fatal(err)
	}
	// Per-worker order was preserved, so the end state equals a sequential replay's.
	m := refmodel.New()
	for i := range ops {
		if ops[i].Kind != oplog.Query {
			_ = m.Apply(&ops[i])
		}
	}
	for i := range ops {
		if ops[i].Kind == oplog.Query {
			if got, want := x.FindMatches(ops[i].Content, nil), m.Query(ops[i].Content); !sameAnswer(got, want) {
				t.Fatalf("query %v: got %+v want %+v", ops[i].Content, got, want)
			}
		}
	}
}

func TestFindMatchesAllocs(t *testing.T) {
	x := New()
	for w := range 8 {
		if err := x.Store(fmt.Sprintf("w%d", w), blocks(1, 1, 2, 2, 3, 3, uint64(4+w), 4)); err != nil {
			t.Fatal(err)
		}
	}
	dst := make([]engine.Match, 0, 16)
	q := []uint64{1, 2, 3, 4, 5}
	if n := testing.AllocsPerRun(100, func() { dst = x.FindMatches(q, dst[:0]) }); n != 0 {
		t.Fatalf("FindMatches allocates %.1f times per call", n)
	}
}

func BenchmarkFindMatches(b *testing.B) {
	x := New()
	chain := make([]engine.Block, 256)
	q := make([]uint64, len(chain))
	for i := range chain {
		chain[i] = engine.Block{Content: uint64(i + 1), Seq: uint64(i + 1)}
		q[i] = uint64(i + 1)
	}
	for w := range 8 {
		if err := x.Store(fmt.Sprintf("w%d", w), chain[:32*(w+1)]); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportAllocs()
	var dst []engine.Match
	for b.Loop() {
		dst = x.FindMatches(q, dst[:0])
	}
}
