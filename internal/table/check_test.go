package table

import (
	"math/rand/v2"
	"strings"
	"testing"
)

// rhTable is the smallest Robin Hood table the toolkit builds: slots hold a key's hash
// (0 for empty), placed with Home, Dist and ShiftRight as the project's tables do.
type rhTable struct {
	slots []uint64
	n     int
}

func (t *rhTable) add(h uint64) {
	m := len(t.slots)
	for i, d := Home(h, m), uint64(0); ; i, d = Next(i, m), d+1 {
		s := t.slots[i]
		if s == 0 || Dist(Home(s, m), i, m) < d {
			j := i
			for t.slots[j] != 0 {
				j = Next(j, m)
			}
			ShiftRight(t.slots, i, j)
			t.slots[i] = h
			t.n++
			return
		}
	}
}

func (t *rhTable) check() error {
	m := len(t.slots)
	return CheckRobinHood(m, t.n, func(i uint64) (uint64, bool) {
		s := t.slots[i]
		return Dist(Home(s, m), i, m), s != 0
	})
}

// TestCheckRobinHood fills Robin Hood tables of several sizes to their dense load (long
// runs, wrapping past the end) and checks them, then breaks each in the three ways the
// check names: two slots of one run swapped, a slot emptied in the middle of a run
// (what a deletion without its backward shift leaves), a count off by one. Each
// corruption must be caught.
func TestCheckRobinHood(t *testing.T) {
	r := rand.New(rand.NewPCG(21, 3))
	for _, m := range []int{2, 7, 64, 1000} {
		tb := &rhTable{slots: make([]uint64, m)}
		for !FullDense(tb.n, m) {
			tb.add(r.Uint64() | 1)
		}
		if err := tb.check(); err != nil {
			t.Fatalf("%d slots, built in order: %v", m, err)
		}
		// The first run whose second slot is past its home.
		at := -1
		for i := 0; i+1 < m; i++ {
			if tb.slots[i] != 0 && tb.slots[i+1] != 0 && Dist(Home(tb.slots[i+1], m), uint64(i+1), m) > 0 &&
				Home(tb.slots[i], m) != Home(tb.slots[i+1], m) {
				at = i
				break
			}
		}
		if at < 0 && m >= 64 {
			t.Fatalf("%d slots: no run of two homes to corrupt", m)
		}
		corrupt := map[string]func(s []uint64) int{
			"count": func([]uint64) int { return tb.n + 1 },
		}
		if at >= 0 {
			corrupt["swap"] = func(s []uint64) int { s[at], s[at+1] = s[at+1], s[at]; return tb.n }
			corrupt["hole"] = func(s []uint64) int { s[at] = 0; return tb.n - 1 }
		}
		for name, f := range corrupt {
			bad := &rhTable{slots: append([]uint64(nil), tb.slots...)}
			bad.n = f(bad.slots)
			err := bad.check()
			if err == nil || !strings.HasPrefix(err.Error(), "table: ") {
				t.Fatalf("%d slots, %s corrupted: check says %v", m, name, err)
			}
		}
	}
}
