package worker

import (
	"math/rand/v2"
	"testing"

	"github.com/kvindex/kvindex/internal/table"
)

// The tables share internal/table's hashing and sizing but keep their own slot types and
// probe loops. BenchmarkSeqTableGeneric measures what a generic table would cost: the
// same linear-probing, backward-shift seq table written once over a slot type whose
// emptiness, key and hash come through a type parameter's methods (what one generic
// toolkit for the four tables would look like), against the concrete seqTable, on the
// same keys: insert, lookup and delete of 65,536 engine hashes per round (the concrete
// table also shrinks as it drains, which the generic one does not).

type genSlot[S any] interface {
	*S
	used() bool
	seqKey() uint64
	set(seq uint64, ref uint32)
}

func (s *seqSlot) used() bool     { return s.ref != 0 }
func (s *seqSlot) seqKey() uint64 { return s.mixed() } // the generic table stores seqs unmixed
func (s *seqSlot) set(seq uint64, ref uint32) {
	*s = seqSlot{lo: uint32(seq), hi: uint32(seq >> 32), ref: ref + 1}
}

type genTable[S any, P genSlot[S]] struct {
	slots []S
	n     int
}

func (t *genTable[S, P]) home(seed *table.Seed, seq uint64) uint64 {
	return table.Home(seed.Hash64(seq), len(t.slots))
}

func (t *genTable[S, P]) put(seed *table.Seed, seq uint64, ref uint32) {
	if table.Full(t.n, len(t.slots)) {
		old := t.slots
		t.slots = make([]S, table.Grown(len(old)))
		for k := range old {
			if P(&old[k]).used() {
				i := t.home(seed, P(&old[k]).seqKey())
				for P(&t.slots[i]).used() {
					i = table.Next(i, len(t.slots))
				}
				t.slots[i] = old[k]
			}
		}
	}
	for i := t.home(seed, seq); ; i = table.Next(i, len(t.slots)) {
		s := P(&t.slots[i])
		if !s.used() {
			t.n++
			s.set(seq, ref)
			return
		}
		if s.seqKey() == seq {
			s.set(seq, ref)
			return
		}
	}
}

func (t *genTable[S, P]) get(seed *table.Seed, seq uint64) bool {
	for i := t.home(seed, seq); ; i = table.Next(i, len(t.slots)) {
		s := P(&t.slots[i])
		if !s.used() {
			return false
		}
		if s.seqKey() == seq {
			return true
		}
	}
}

func (t *genTable[S, P]) del(seed *table.Seed, seq uint64) {
	n := len(t.slots)
	i := t.home(seed, seq)
	for P(&t.slots[i]).seqKey() != seq {
		i = table.Next(i, n)
	}
	var zero S
	for {
		t.slots[i] = zero
		j := i
		for {
			j = table.Next(j, n)
			s := P(&t.slots[j])
			if !s.used() {
				t.n--
				return
			}
			if !table.InRun(t.home(seed, s.seqKey()), i, j) {
				t.slots[i] = t.slots[j]
				i = j
				break
			}
		}
	}
}

func BenchmarkSeqTableGeneric(b *testing.B) {
	const n = 1 << 16
	seed := table.SeedFrom(3)
	r := rand.New(rand.NewPCG(1, 1))
	keys := make([]uint64, n)
	for i := range keys {
		keys[i] = r.Uint64()
	}
	b.Run("impl=concrete", func(b *testing.B) {
		for it := 0; it < b.N; it++ {
			var t seqTable
			for i, k := range keys {
				si, h, _ := t.locate(&seed, k)
				t.setAt(si, h, uint32(i))
			}
			for _, k := range keys {
				if _, ok := t.get(&seed, k); !ok {
					b.Fatal("lost a key")
				}
			}
			for _, k := range keys {
				t.del(&seed, k)
			}
		}
		b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/n, "ns/key")
	})
	b.Run("impl=generic", func(b *testing.B) {
		for it := 0; it < b.N; it++ {
			var t genTable[seqSlot, *seqSlot]
			for i, k := range keys {
				t.put(&seed, k, uint32(i))
			}
			for _, k := range keys {
				if !t.get(&seed, k) {
					b.Fatal("lost a key")
				}
			}
			for _, k := range keys {
				t.del(&seed, k)
			}
		}
		b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/n, "ns/key")
	})
}
