package subscriber

import (
	"testing"

	"github.com/kvindex/kvindex/vllmhash"
)

// BenchmarkHashCheck is the cost of the block-hash check on the ingest path: one batch
// holding one stored event of 16 blocks of 16 tokens (a root, so every block is checked
// unless sampled out), decoded and applied to an index that does nothing, with the check
// off, on, and sampling one chain in 16. Per-block cost = ns/op / 16.
//
//	go test -run '^$' -bench HashCheck -benchtime 20000x -count 5 ./subscriber/
func BenchmarkHashCheck(b *testing.B) {
	const blocks, bs = 16, 16
	toks := make([]uint32, blocks*bs)
	for i := range toks {
		toks[i] = uint32(100000 + i)
	}
	d := vllmhash.Chain("0", nil, toks, bs, nil)
	e := ev{kind: "stored", tokens: toks, bs: bs}
	for i := range d {
		e.seqs = append(e.seqs, d[i].Low64())
	}
	payload := batch(e)
	for _, mode := range []struct {
		name  string
		check HashCheck
	}{
		{"off", HashCheck{}},
		{"on", HashCheck{Enabled: true, Seed: "0", Algo: vllmhash.SHA256CBOR}},
		{"sample16", HashCheck{Enabled: true, Seed: "0", SampleEvery: 16, Algo: vllmhash.SHA256CBOR}},
	} {
		b.Run(mode.name, func(b *testing.B) {
			s, err := New(Config{Endpoint: "tcp://127.0.0.1:1", Worker: "w", Index: nopIdx{}, BlockSize: bs, HashCheck: mode.check})
			if err != nil {
				b.Fatal(err)
			}
			b.ReportAllocs()
			seq := uint64(0)
			for b.Loop() {
				if err := s.applyBatch(seq, payload); err != nil {
					b.Fatal(err)
				}
				seq++
			}
			b.StopTimer()
			if h := s.local.Diag.Hash; mode.check.Enabled && h.Mismatched != 0 {
				b.Fatalf("mismatches %+v", h)
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*blocks), "ns/block")
		})
	}
}
