package sim

import (
	"math/rand/v2"
	"testing"
)

// TestHashTableModel drives the table and a builtin map with the same random
// operations, over a few keys (long probe runs, many deletions inside them) and over
// keys that all share one home slot.
func TestHashTableModel(t *testing.T) {
	for _, keys := range []func(r *rand.Rand) uint64{
		func(r *rand.Rand) uint64 { return r.Uint64N(300) },
		func(r *rand.Rand) uint64 {
			// x * inv(φ) hashes to x: every key lands on one of two home slots.
			x := r.Uint64N(2)<<55 | r.Uint64N(300)
			return x * fibInverse()
		},
	} {
		tab := newHashTable(200)
		model := map[uint64]int32{}
		r := rand.New(rand.NewPCG(7, 8))
		for step := range 100000 {
			k := keys(r)
			switch r.IntN(3) {
			case 0:
				if len(model) < 200 {
					v := int32(r.IntN(1000))
					tab.set(k, v)
					model[k] = v
				}
			case 1:
				tab.del(k)
				delete(model, k)
			}
			got, ok := tab.get(k)
			want, wok := model[k]
			if ok != wok || (ok && got != want) || tab.len() != len(model) {
				t.Fatalf("step %d key %d: got %d %v, want %d %v; len %d, want %d", step, k, got, ok, want, wok, tab.len(), len(model))
			}
		}
		n := 0
		for k, v := range tab.all {
			if model[k] != v {
				t.Fatalf("all: %d -> %d, model %d", k, v, model[k])
			}
			n++
		}
		if n != len(model) {
			t.Fatalf("all yields %d keys, want %d", n, len(model))
		}
	}
}

// fibInverse is the multiplicative inverse of the table's multiplier modulo 2^64
// (Newton's iteration: each step doubles the correct low bits).
func fibInverse() uint64 {
	const m = 0x9e3779b97f4a7c15
	x := uint64(m) // correct to 3 bits for any odd m
	for range 6 {
		x *= 2 - m*x
	}
	return x
}

func TestFibInverse(t *testing.T) {
	tab := newHashTable(200)
	for _, home := range []uint64{0, 1} {
		if s := tab.slot((home<<55 | 17) * fibInverse()); s != int(home) {
			t.Fatalf("slot %d, want %d", s, home)
		}
	}
}
