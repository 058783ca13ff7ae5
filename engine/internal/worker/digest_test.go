package worker

import "testing"

// BenchmarkDigestTerm is the digest's cost per entry on the event path: one term and
// one cell update, in the default namespace and in another.
func BenchmarkDigestTerm(b *testing.B) {
	for _, ns := range []uint32{0, 7} {
		b.Run(map[uint32]string{0: "ns=default", 7: "ns=other"}[ns], func(b *testing.B) {
			var d digests
			d.add(ns, 1, 1) // the namespace's cell exists, as in steady state
			b.ReportAllocs()
			for i := 0; b.Loop(); i++ {
				d.add(ns, digestTerm(uint64(i), uint32(i&63)), 1)
			}
		})
	}
}
