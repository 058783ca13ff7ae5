package engine

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// referenceOrder is answer order as the contract states it: score descending, then
// worker name.
func referenceOrder(a, b Match) int {
	if a.Score != b.Score {
		return b.Score - a.Score
	}
	return strings.Compare(a.Worker, b.Worker)
}

// randomMatches returns n matches with distinct names drawn to stress the name keys:
// names sharing 14 to 30 leading bytes, names that are prefixes of others, NUL bytes
// where a key pads with zeros, and scores from a small range (many ties).
func randomMatches(r *rand.Rand, n int) []Match {
	prefixes := []string{"", "http://10.0.0.", "pod-kvindex-llama-70b-instruct-", "a"}
	seen := map[string]bool{}
	var m []Match
	for len(m) < n {
		name := prefixes[r.IntN(len(prefixes))]
		switch r.IntN(4) {
		case 0:
			name += fmt.Sprint(r.IntN(40))
		case 1:
			name += fmt.Sprintf("%d:8000", r.IntN(40))
		case 2:
			name += strings.Repeat("\x00", r.IntN(3))
		default:
			name += string(rune('a' + r.IntN(3)))
		}
		if seen[name] {
			continue
		}
		seen[name] = true
		m = append(m, Match{Worker: name, Score: 1 + r.IntN(4), Size: r.IntN(100)})
	}
	return m
}

// TestSortMatches: the query's sort (insertion sort, or keys past 12 matches) gives the
// contract's order for answers of every length up to 300, from random and from sorted,
// reversed and nearly sorted inputs.
func TestSortMatches(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	q := &query{}
	for n := 0; n <= 300; n += 1 + n/8 {
		for trial := 0; trial < 20; trial++ {
			m := randomMatches(r, n)
			switch trial % 4 {
			case 1:
				slices.SortFunc(m, referenceOrder)
			case 2:
				slices.SortFunc(m, func(a, b Match) int { return referenceOrder(b, a) })
			case 3:
				slices.SortFunc(m, referenceOrder)
				if n > 1 {
					i, j := r.IntN(n), r.IntN(n)
					m[i], m[j] = m[j], m[i]
				}
			}
			want := slices.Clone(m)
			slices.SortFunc(want, referenceOrder)
			q.sortMatches(m)
			require.Equal(t, want, m, "n=%d trial=%d", n, trial)
		}
	}
}

// BenchmarkSortMatches times the query's sort against slices.SortFunc over the
// matches, which it replaced, the copy of the input included. n=8 is the trace-driven
// log's typical answer (eight matches, in order but for one pair; the insertion sort);
// 15 and 64 are answers of the 16-worker trace log and of a larger fleet, named like its
// workers (http://10.0.0.N:8000) and in worker-id order (the sort by keys).
func BenchmarkSortMatches(b *testing.B) {
	for _, n := range []int{8, 15, 64} {
		r := rand.New(rand.NewPCG(1, uint64(n)))
		in := make([]Match, n)
		for i := range in {
			in[i] = Match{Worker: fmt.Sprintf("http://10.0.0.%d:8000", i+1), Score: []int{8, 8, 16, 40, 200}[r.IntN(5)]}
		}
		if n == 8 {
			slices.SortFunc(in, referenceOrder)
			in[2], in[5] = in[5], in[2]
		}
		m := make([]Match, n)
		q := &query{}
		b.Run(fmt.Sprintf("query/n=%d", n), func(b *testing.B) {
			for b.Loop() {
				copy(m, in)
				q.sortMatches(m)
			}
		})
		b.Run(fmt.Sprintf("SortFunc/n=%d", n), func(b *testing.B) {
			for b.Loop() {
				copy(m, in)
				slices.SortFunc(m, referenceOrder)
			}
		})
	}
}
