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

// TestCollectOrder: answers come in the contract's order from collect's keys, for names
// that share long prefixes, pad with NULs or are prefixes of each other (randomMatches),
// on every query path (the locked index's gallop, a one-shard engine, jump search on two
// shards), asked twice (the second time from the cached name keys), and again after
// every worker is removed and new ones, named otherwise, take their ids.
func TestCollectOrder(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 8))
	content := make([]uint64, 40)
	for i := range content {
		content[i] = uint64(i)*0x9e3779b97f4a7c15 + 3
	}
	store := func(e *Engine, name string, depth int) {
		ev := Event{Kind: EventStored, Worker: name}
		for i := range depth {
			ev.Blocks = append(ev.Blocks, Block{Content: content[i], Seq: uint64(i + 1)})
		}
		require.NoError(t, e.Apply(&ev))
	}
	for _, cfg := range []Config{{LockedIndex: true}, {Shards: 1}, {Shards: 2}} {
		e, err := New(cfg)
		require.NoError(t, err)
		for round := range 3 {
			m := randomMatches(r, 20+10*round)
			for i := range m {
				if m[i].Worker == "" {
					m[i].Worker = "\x01" // (a worker needs a name; randomMatches makes no other)
				}
				m[i].Score = 8 + 4*r.IntN(3) // ties at the depths a system prompt gives
				m[i].Size = m[i].Score
				m[i].Tiers = [NumTiers]int{m[i].Score, m[i].Score, m[i].Score}
				store(e, m[i].Worker, m[i].Score)
			}
			require.NoError(t, e.Barrier(t.Context()))
			want := slices.Clone(m)
			slices.SortFunc(want, referenceOrder)
			for range 2 {
				got, err := e.FindMatches(t.Context(), content, nil)
				require.NoError(t, err)
				require.Equal(t, want, got, "%+v round %d", cfg, round)
			}
			for i := range m {
				require.NoError(t, e.Apply(&Event{Kind: EventRemoveWorker, Worker: m[i].Worker}))
			}
		}
		e.Close()
	}
}
