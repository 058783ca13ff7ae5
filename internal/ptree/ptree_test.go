package ptree

import (
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// snapshot is a Map and the Go map it must equal.
type snapshot struct {
	m    Map[int, int]
	want map[int]int
}

// TestDifferential: random sets and deletes (through Map and through Builders), over
// key ranges small enough to hit existing keys often, each result compared with Go's
// map (entries, order, Len, Get of present and absent keys) and checked for the
// B-tree's shape; every Map made along the way (a Builder's too, the Builder going on
// with more changes) still equals its map at the end, so later changes never reach an
// earlier version.
func TestDifferential(t *testing.T) {
	for seed := range uint64(6) {
		rng := rand.New(rand.NewPCG(seed, 33))
		keys := []int{8, 64, 500, 5000}[seed%4]
		var (
			cur   Map[int, int]
			want  = map[int]int{}
			snaps []snapshot
			b     *Builder[int, int]
		)
		for step := range 6000 {
			k, v := rng.IntN(keys), rng.Int()
			if b == nil && rng.IntN(50) == 0 {
				b = cur.Edit()
			}
			del := rng.IntN(100) < 45
			switch {
			case b != nil && del:
				b.Delete(k)
			case b != nil:
				b.Set(k, v)
			case del:
				cur = cur.Delete(k)
			default:
				cur = cur.Set(k, v)
			}
			if del {
				delete(want, k)
			} else {
				want[k] = v
			}
			if b != nil && rng.IntN(20) == 0 {
				// A Map taken from a Builder that goes on changing: it must not
				// see the later changes.
				cur = b.Map()
				snaps = append(snaps, snapshot{cur, maps.Clone(want)})
				if rng.IntN(2) == 0 {
					b = nil
				}
			}
			if b != nil {
				if b.Len() != len(want) {
					t.Fatalf("seed %d step %d: builder holds %d, want %d", seed, step, b.Len(), len(want))
				}
				if got, ok := b.Get(k); ok != !del || (ok && got != v) {
					t.Fatalf("seed %d step %d: builder's Get(%d) = %d, %v", seed, step, k, got, ok)
				}
				continue
			}
			if keys < 5000 || step%10 == 0 {
				check(t, cur, want, fmt.Sprintf("seed %d step %d", seed, step))
			}
			if step%100 == 0 {
				snaps = append(snaps, snapshot{cur, maps.Clone(want)})
			}
		}
		for i, s := range snaps {
			check(t, s.m, s.want, fmt.Sprintf("seed %d snapshot %d", seed, i))
		}
	}
}

// check compares m with want and checks m's shape.
func check(t *testing.T, m Map[int, int], want map[int]int, where string) {
	t.Helper()
	if m.Len() != len(want) {
		t.Fatalf("%s: Len %d, want %d", where, m.Len(), len(want))
	}
	var got []int
	for k, v := range m.All() {
		if want[k] != v {
			t.Fatalf("%s: %d -> %d, want %d", where, k, v, want[k])
		}
		got = append(got, k)
	}
	if wk := slices.Sorted(maps.Keys(want)); !slices.Equal(got, wk) {
		t.Fatalf("%s: keys %v, want %v", where, got, wk)
	}
	if !slices.Equal(slices.Collect(m.Keys()), got) || len(slices.Collect(m.Values())) != len(got) {
		t.Fatalf("%s: Keys or Values differ from All", where)
	}
	for k, v := range want {
		if g, ok := m.Get(k); !ok || g != v {
			t.Fatalf("%s: Get(%d) = %d, %v; want %d", where, k, g, ok, v)
		}
	}
	for _, k := range []int{-1, 1 << 40} {
		if _, ok := m.Get(k); ok {
			t.Fatalf("%s: Get(%d) found an absent key", where, k)
		}
	}
	if m.root != nil {
		n, _ := shape(t, m.root, true, where)
		if n != m.Len() {
			t.Fatalf("%s: the nodes hold %d items, Len says %d", where, n, m.Len())
		}
	}
}

// shape checks the B-tree's invariants under x (item counts, every leaf at one depth,
// nothing kept in unused slots) and returns its item count and height.
func shape(t *testing.T, x *node[int, int], root bool, where string) (items, height int) {
	t.Helper()
	if x.n > maxItems || (!root && x.n < minItems) || x.n < 1 {
		t.Fatalf("%s: a node holds %d items", where, x.n)
	}
	for i := x.n; i < maxItems; i++ {
		if x.keys[i] != 0 || x.vals[i] != 0 || x.kids[i+1] != nil {
			t.Fatalf("%s: slot %d of a node of %d is not cleared", where, i, x.n)
		}
	}
	items = x.n
	if x.leaf() {
		return items, 1
	}
	for i := 0; i <= x.n; i++ {
		n, h := shape(t, x.kids[i], false, where)
		if i > 0 && h != height {
			t.Fatalf("%s: leaves at depths %d and %d", where, height, h)
		}
		items, height = items+n, h
	}
	return items, height + 1
}

// newNodes counts the nodes of m not in seen, and adds them: a node in seen is shared
// with an earlier version, and so is everything under it.
func newNodes(m Map[int, int], seen map[*node[int, int]]bool) int {
	var walk func(x *node[int, int]) int
	walk = func(x *node[int, int]) int {
		if x == nil || seen[x] {
			return 0
		}
		seen[x] = true
		n := 1
		for i := 0; i <= x.n; i++ {
			n += walk(x.kids[i])
		}
		return n
	}
	return walk(m.root)
}

// TestChangeCopiesPath: a Set or a Delete on a map of 100,000 entries copies a few
// nodes per level (the path to the key, and on a delete the siblings it borrows from
// or merges with), never a share of the map; and a Builder's changes to one key copy
// its path once.
func TestChangeCopiesPath(t *testing.T) {
	var m Map[int, int]
	b := m.Edit()
	for i := range 100_000 {
		b.Set(i*2, i)
	}
	m = b.Map()
	_, height := shape(t, m.root, true, "built")
	seen := map[*node[int, int]]bool{}
	newNodes(m, seen)
	rng := rand.New(rand.NewPCG(1, 2))
	for range 2000 {
		k := rng.IntN(200_000)
		var next Map[int, int]
		if k%2 == 0 {
			next = m.Delete(k)
		} else {
			next = m.Set(k, k)
		}
		if n := newNodes(next, seen); n > 3*height+1 {
			t.Fatalf("a change of key %d copied %d nodes of a tree %d high", k, n, height)
		}
		m = next
	}
	b = m.Edit()
	for i := range 50 {
		b.Set(1, i)
		b.Delete(1)
	}
	if n := newNodes(b.Map(), seen); n > 3*height+1 {
		t.Fatalf("50 changes of one key through a Builder copied %d nodes of a tree %d high", n, height)
	}
}

// TestIterateStops: a range over All, Keys or Values ends where its body breaks.
func TestIterateStops(t *testing.T) {
	var m Map[int, int]
	for i := range 1000 {
		m = m.Set(i, -i)
	}
	n := 0
	for k := range m.Keys() {
		if k == 500 {
			break
		}
		n++
	}
	for range m.Values() {
		n++
		break
	}
	for k, v := range m.All() {
		if k != -v {
			t.Fatal(k, v)
		}
		n++
		if k == 9 {
			break
		}
	}
	if n != 511 {
		t.Fatalf("%d items yielded, want 511", n)
	}
}

// TestReadsAllocateNothing: Get and a range over All, Keys or Values allocate nothing.
func TestReadsAllocateNothing(t *testing.T) {
	var m Map[string, *int]
	for i := range 1000 {
		m = m.Set(fmt.Sprint("worker-", i), &i)
	}
	sum := 0
	if a := testing.AllocsPerRun(20, func() {
		if _, ok := m.Get("worker-500"); !ok {
			t.Fatal("worker-500 missing")
		}
		for _, v := range m.All() {
			sum += *v
		}
		for k := range m.Keys() {
			sum += len(k)
		}
		for v := range m.Values() {
			sum += *v
		}
	}); a != 0 {
		t.Fatalf("reads allocate %.0f times", a)
	}
}

// TestReadersWhileChanging (run it with -race): readers range over and look up the
// published Map while one writer publishes new versions through a Builder and Set;
// each version a reader loads is whole (its Len entries, in order, keys 0..Len-1 with
// their values), and the race detector sees no write to a published node.
func TestReadersWhileChanging(t *testing.T) {
	var pub atomic.Pointer[Map[int, int]]
	pub.Store(&Map[int, int]{})
	var wg sync.WaitGroup
	stop := make(chan struct{})
	errs := make(chan error, 4)
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				m := *pub.Load()
				i := 0
				for k, v := range m.All() {
					if k != i || v != -k {
						errs <- fmt.Errorf("entry %d is %d -> %d", i, k, v)
						return
					}
					i++
				}
				if _, ok := m.Get(m.Len() - 1); i != m.Len() || (m.Len() > 0 && !ok) {
					errs <- fmt.Errorf("a version of %d entries yielded %d", m.Len(), i)
					return
				}
			}
		}()
	}
	b := pub.Load().Edit()
	for i := range 3000 {
		b.Set(i, -i)
		if i%7 == 0 {
			m := b.Map()
			pub.Store(&m)
		}
	}
	close(stop)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
}
