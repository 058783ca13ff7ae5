package vllmhash_test

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"os"
	"strconv"
	"testing"

	"go.uber.org/goleak"

	"github.com/kvindex/kvindex/kvevents"
	"github.com/kvindex/kvindex/vllmhash"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// Vectors is testdata/vllmhash/vectors.json, written by testdata/vllmhash/gen.py from
// vLLM's definition with Python's cbor2, hashlib, xxhash and msgpack: nothing in it comes
// from this repository's Go code.
type Vectors struct {
	Roots []struct {
		Seed         string `json:"seed"`
		Digest       string `json:"digest"`
		DigestSHA256 string `json:"digest_sha256"`
	} `json:"roots"`
	Chains []struct {
		Name       string   `json:"name"`
		Seed       string   `json:"seed"`
		BlockSize  int      `json:"block_size"`
		Tokens     []uint32 `json:"tokens"`
		LoraName   *string  `json:"lora_name"`
		ExtraKeys  []any    `json:"extra_keys"`
		Digests    []string `json:"digests"`
		DigestsPkl []string `json:"digests_sha256"`
		Low64      []string `json:"low64"`
		Contents   []string `json:"contents"`
		PayloadInt string   `json:"payload_int"`
		PayloadBin string   `json:"payload_bin"`
	} `json:"chains"`
}

func load(t *testing.T) Vectors {
	t.Helper()
	b, err := os.ReadFile("../testdata/vllmhash/vectors.json")
	if err != nil {
		t.Fatal(err)
	}
	var v Vectors
	if err := json.Unmarshal(b, &v); err != nil {
		t.Fatal(err)
	}
	if len(v.Roots) == 0 || len(v.Chains) == 0 {
		t.Fatal("empty vectors")
	}
	return v
}

func unhex(t *testing.T, s string) []byte {
	t.Helper()
	b, err := hex.DecodeString(s)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func u64(t *testing.T, s string) uint64 {
	t.Helper()
	v, err := strconv.ParseUint(s, 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func TestRoot(t *testing.T) {
	for _, r := range load(t).Roots {
		got := vllmhash.Root(r.Seed)
		if hex.EncodeToString(got[:]) != r.Digest {
			t.Errorf("Root(%q) = %x, want %s", r.Seed, got, r.Digest)
		}
		if p := vllmhash.RootPickle(r.Seed); hex.EncodeToString(p[:]) != r.DigestSHA256 {
			t.Errorf("RootPickle(%q) = %x, want %s", r.Seed, p, r.DigestSHA256)
		}
	}
}

// TestChains decodes each chain's event as published (int and bin hashes), recomputes
// its digests from the decoded tokens and extra keys, and checks the published hashes and
// kvindex's content hashes against the vectors.
func TestChains(t *testing.T) {
	for _, c := range load(t).Chains {
		t.Run(c.Name, func(t *testing.T) {
			for _, form := range []string{"int", "bin"} {
				payload := c.PayloadInt
				if form == "bin" {
					payload = c.PayloadBin
				}
				d, err := kvevents.New(kvevents.Config{Verbatim: true})
				if err != nil {
					t.Fatal(err)
				}
				var b kvevents.Batch
				if err := d.Decode(unhex(t, payload), &b); err != nil {
					t.Fatal(err)
				}
				if len(b.Events) != 1 || b.RejectedCount != 0 {
					t.Fatalf("%s: %d events, rejected %v", form, len(b.Events), b.Rejected)
				}
				ev := &b.Events[0]
				n := len(c.Digests)
				if len(ev.Seqs) != n || len(ev.Contents) != n {
					t.Fatalf("%s: %d seqs, %d contents, want %d", form, len(ev.Seqs), len(ev.Contents), n)
				}
				got := vllmhash.Chain(c.Seed, nil, ev.Tokens, c.BlockSize, ev.BlockExtras)
				for i := range n {
					if hex.EncodeToString(got[i][:]) != c.Digests[i] {
						t.Errorf("%s: block %d digest %x, want %s", form, i, got[i], c.Digests[i])
					}
					if low := u64(t, c.Low64[i]); got[i].Low64() != low || ev.Seqs[i] != low {
						t.Errorf("%s: block %d Low64 %d, seq %d, want %d", form, i, got[i].Low64(), ev.Seqs[i], low)
					}
					if want := u64(t, c.Contents[i]); ev.Contents[i] != want {
						t.Errorf("%s: block %d content %d, want %d", form, i, ev.Contents[i], want)
					}
				}
				// The default algorithm, "sha256" (pickle), on the same decoded inputs.
				var h vllmhash.Hasher
				p := vllmhash.RootPickle(c.Seed)
				for i := range n {
					var x []byte
					if ev.BlockExtras != nil {
						x = ev.BlockExtras[i]
					}
					d, err := h.BlockPickle(&p, ev.Tokens[i*c.BlockSize:(i+1)*c.BlockSize], x)
					if err != nil {
						t.Fatalf("%s: block %d: %v", form, i, err)
					}
					if hex.EncodeToString(d[:]) != c.DigestsPkl[i] {
						t.Errorf("%s: block %d sha256 (pickle) digest %x, want %s", form, i, d, c.DigestsPkl[i])
					}
					p = d
				}
				if form == "bin" {
					if ev.DigestSize != vllmhash.Size || !bytes.Equal(ev.Digests, unhex(t, joined(c.Digests))) {
						t.Errorf("bin: Digests %x (size %d)", ev.Digests, ev.DigestSize)
					}
				} else if ev.Digests != nil {
					t.Errorf("int: Digests %x, want nil", ev.Digests)
				}
			}
		})
	}
}

func joined(ss []string) string {
	var b bytes.Buffer
	for _, s := range ss {
		b.WriteString(s)
	}
	return b.String()
}

// TestSeedMatters: another PYTHONHASHSEED gives other digests all along the chain.
func TestSeedMatters(t *testing.T) {
	toks := []uint32{1, 2, 3, 4, 5, 6, 7, 8}
	a := vllmhash.Chain("0", nil, toks, 4, nil)
	b := vllmhash.Chain("1", nil, toks, 4, nil)
	for i := range a {
		if a[i] == b[i] {
			t.Fatalf("block %d equal under seeds 0 and 1", i)
		}
	}
}

func TestBlockZeroAllocs(t *testing.T) {
	var h vllmhash.Hasher
	p := vllmhash.Root("0")
	toks := make([]uint32, 16)
	h.Block(&p, toks, nil)
	if n := testing.AllocsPerRun(100, func() { p = h.Block(&p, toks, nil) }); n != 0 {
		t.Fatalf("%v allocs per Block", n)
	}
	_, _ = h.BlockPickle(&p, toks, nil)
	if n := testing.AllocsPerRun(100, func() { p, _ = h.BlockPickle(&p, toks, nil) }); n != 0 {
		t.Fatalf("%v allocs per BlockPickle", n)
	}
}

// Inputs the pickle reproduction does not cover are reported, not guessed.
func TestPickleNotReproducible(t *testing.T) {
	var h vllmhash.Hasher
	p := vllmhash.RootPickle("0")
	for _, extra := range [][]byte{{0xf9, 0x3c, 0x00}, {0xa1, 0x01, 0x02}, {0x81}, {0x3b, 0x80, 0, 0, 0, 0, 0, 0, 0}, {0x82, 0x01}} {
		if _, err := h.BlockPickle(&p, []uint32{1}, extra); err == nil {
			t.Errorf("extra %x accepted", extra)
		}
	}
	if _, err := h.BlockPickle(&p, make([]uint32, 40000), nil); err == nil {
		t.Error("a pickle past one 64 KiB frame accepted")
	}
}

// BenchmarkBlockPickle is BenchmarkBlock for the "sha256" (pickle) algorithm.
func BenchmarkBlockPickle(b *testing.B) {
	var h vllmhash.Hasher
	p := vllmhash.RootPickle("0")
	toks := make([]uint32, 16)
	for i := range toks {
		toks[i] = uint32(100000 + i)
	}
	b.ReportAllocs()
	for b.Loop() {
		p, _ = h.BlockPickle(&p, toks, nil)
	}
}

// BenchmarkBlock is the cost of recomputing one block's hash (16 tokens, vLLM's default
// block size): the cost per block of the hash check in package subscriber.
func BenchmarkBlock(b *testing.B) {
	for _, bs := range []int{16, 64} {
		b.Run(strconv.Itoa(bs), func(b *testing.B) {
			var h vllmhash.Hasher
			p := vllmhash.Root("0")
			toks := make([]uint32, bs)
			for i := range toks {
				toks[i] = uint32(100000 + i)
			}
			b.ReportAllocs()
			for b.Loop() {
				p = h.Block(&p, toks, nil)
			}
		})
	}
}
