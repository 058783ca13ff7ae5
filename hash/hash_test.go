package hash

import (
	"errors"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func seq(a, b uint32) []uint32 {
	var out []uint32
	for i := a; i <= b; i++ {
		out = append(out, i)
	}
	return out
}

func TestContentVectors(t *testing.T) {
	cases := []struct {
		name   string
		tokens []uint32
		want   uint64
	}{
		{"empty", nil, 0xd1f3e77444430ab9},
		{"1..4", []uint32{1, 2, 3, 4}, 0xcb38e4d7fb2dca5c},
		{"42", []uint32{42}, 0x960ab58121585ebf},
		{"1..8", seq(1, 8), 0x3fc6d96b481ac357},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			require.Equal(t, c.want, Content(c.tokens))
			require.Equal(t, c.want, contentPortable(c.tokens))
		})
	}
}

func TestNextVector(t *testing.T) {
	require.Equal(t, uint64(0x52f3afabf18339a3), Next(10, 20))
	require.Equal(t, uint64(0x52f3afabf18339a3), nextPortable(10, 20))
}

func TestNextMatchesPortable(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	edge := []uint64{0, 1, Seed, 1<<63 - 1, 1 << 63, ^uint64(0)}
	for _, a := range edge {
		for _, b := range edge {
			require.Equal(t, nextPortable(a, b), Next(a, b), "%x %x", a, b)
		}
	}
	for i := 0; i < 100000; i++ {
		a, b := r.Uint64(), r.Uint64()
		require.Equal(t, nextPortable(a, b), Next(a, b))
	}
}

func TestContentMatchesPortable(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for i := 0; i < 500; i++ {
		toks := make([]uint32, r.IntN(300))
		for j := range toks {
			toks[j] = r.Uint32()
		}
		require.Equal(t, contentPortable(toks), Content(toks))
	}
}

func TestBlocks(t *testing.T) {
	toks := seq(1, 10)
	got, err := Blocks(nil, toks, 4)
	require.NoError(t, err)
	require.Equal(t, []uint64{Content(seq(1, 4)), Content(seq(5, 8))}, got, "trailing partial block is dropped")

	got, err = Blocks(nil, toks[:3], 4)
	require.NoError(t, err)
	require.Empty(t, got)

	for _, bs := range []int{0, -1, MaxBlockSize + 1} {
		_, err := Blocks(nil, toks, bs)
		require.True(t, errors.Is(err, ErrBlockSize), "block size %d", bs)
	}
}

func TestPrefixes(t *testing.T) {
	require.Empty(t, Prefixes(nil, nil))
	got := Prefixes(nil, []uint64{10, 20, 30})
	require.Equal(t, []uint64{10, Next(10, 20), Next(Next(10, 20), 30)}, got)
}

func TestZeroAllocs(t *testing.T) {
	toks := make([]uint32, 64*16)
	for i := range toks {
		toks[i] = uint32(i * 7)
	}
	dst := make([]uint64, 0, 64)
	pre := make([]uint64, 0, 64)
	allocs := testing.AllocsPerRun(100, func() {
		var err error
		dst, err = Blocks(dst[:0], toks, 16)
		if err != nil {
			t.Fatal(err)
		}
		pre = Prefixes(pre[:0], dst)
	})
	require.Zero(t, allocs)
}

func FuzzBlocks(f *testing.F) {
	f.Add([]byte{1, 0, 0, 0, 2, 0, 0, 0, 3, 0, 0, 0, 4, 0, 0, 0}, 1)
	f.Add([]byte{}, 16)
	f.Add([]byte{9, 9, 9}, 0)
	f.Fuzz(func(t *testing.T, raw []byte, bs int) {
		toks := make([]uint32, len(raw)/4)
		for i := range toks {
			toks[i] = uint32(raw[4*i]) | uint32(raw[4*i+1])<<8 | uint32(raw[4*i+2])<<16 | uint32(raw[4*i+3])<<24
		}
		got, err := Blocks(nil, toks, bs)
		if CheckBlockSize(bs) != nil {
			if err == nil {
				t.Fatalf("block size %d accepted", bs)
			}
			return
		}
		if err != nil {
			t.Fatal(err)
		}
		if len(got) != len(toks)/bs {
			t.Fatalf("got %d blocks, want %d", len(got), len(toks)/bs)
		}
		for i, h := range got {
			if want := contentPortable(toks[i*bs : (i+1)*bs]); h != want {
				t.Fatalf("block %d: %x != %x", i, h, want)
			}
		}
		pre := Prefixes(nil, got)
		for i := 1; i < len(pre); i++ {
			if pre[i] != nextPortable(pre[i-1], got[i]) {
				t.Fatal("prefix chain broken")
			}
		}
	})
}

func benchmarkBlocks(b *testing.B, blockSize int) {
	toks := make([]uint32, blockSize*128)
	for i := range toks {
		toks[i] = uint32(i)
	}
	dst := make([]uint64, 0, 128)
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		dst, _ = Blocks(dst[:0], toks, blockSize)
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*128), "ns/block")
}

func BenchmarkContent(b *testing.B) {
	b.Run("block=16", func(b *testing.B) { benchmarkBlocks(b, 16) })
	b.Run("block=64", func(b *testing.B) { benchmarkBlocks(b, 64) })
}

func BenchmarkNext(b *testing.B) {
	h := uint64(1)
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		h = Next(h, uint64(i))
	}
	sink = h
}

var sink uint64

func BenchmarkNextImpl(b *testing.B) {
	for _, impl := range []struct {
		name string
		f    func(a, c uint64) uint64
	}{{"inline", Next}, {"xxh3.HashSeed", nextPortable}} {
		b.Run("impl="+impl.name, func(b *testing.B) {
			h := uint64(1)
			for i := 0; i < b.N; i++ {
				h = impl.f(h, uint64(i))
			}
			sink = h
		})
	}
}
