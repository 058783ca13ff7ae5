package subscriber

import (
	"encoding/hex"
	"encoding/json"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kvindex/kvindex/engine"
	"github.com/kvindex/kvindex/vllmhash"
)

// Each diagnostic has a test that triggers it and shows it silent on a healthy stream.
// The clock is the subscriber's (s.now), set by hand: no sleeps.

type fakeClock struct{ t time.Time }

func (c *fakeClock) now() time.Time          { return c.t }
func (c *fakeClock) advance(d time.Duration) { c.t = c.t.Add(d) }

// diagSub is a test subscriber (see newTestSub) on a fake clock, live from t0.
func diagSub(t *testing.T, mod func(*Config)) (*Subscriber, *fakeClock, *fakePub) {
	t.Helper()
	clk := &fakeClock{t: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	cfg := Config{Endpoint: "tcp://127.0.0.1:1", ReplayEndpoint: "tcp://127.0.0.1:2", Worker: "w", Model: "m",
		Index: newEngine(t), BlockSize: testBS}
	if mod != nil {
		mod(&cfg)
	}
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	fp := &fakePub{}
	s.replay = fp.replay
	s.now = clk.now
	s.up()
	s.synced = true
	s.setState()
	s.publish()
	return s, clk, fp
}

func codes(ps []Problem) []string {
	out := []string{}
	for _, p := range ps {
		out = append(out, p.Code)
	}
	return out
}

func requireProblems(t *testing.T, s *Subscriber, now time.Time, want ...string) []Problem {
	t.Helper()
	ps := s.Problems(now)
	if want == nil {
		want = []string{}
	}
	if got := codes(ps); !slices.Equal(got, want) {
		t.Fatalf("problems %v, want %v (%+v)", got, want, ps)
	}
	for _, p := range ps {
		if p.Message == "" || p.Hint == "" {
			t.Fatalf("problem without message or hint: %+v", p)
		}
	}
	return ps
}

// seqCounter feeds consecutive live batches.
type feeder struct {
	s   *Subscriber
	seq uint64
}

func (f *feeder) send(t *testing.T, payload []byte) {
	t.Helper()
	sendLive(t, f.s, f.seq, payload)
	f.seq++
}

func TestDiagNoEvents(t *testing.T) {
	s, clk, _ := diagSub(t, nil)
	requireProblems(t, s, clk.t.Add(DefaultNoEventsAfter-time.Second))
	requireProblems(t, s, clk.t.Add(DefaultNoEventsAfter), ProblemNoEvents)

	// Healthy: one event after going live silences it for good.
	s, clk, _ = diagSub(t, nil)
	clk.advance(time.Second)
	e, _ := stored(nil, [2]uint64{1, 100})
	(&feeder{s: s}).send(t, batch(e))
	requireProblems(t, s, clk.t.Add(10*DefaultNoEventsAfter))
}

func TestDiagEventsStopped(t *testing.T) {
	s, clk, _ := diagSub(t, nil)
	e, _ := stored(nil, [2]uint64{1, 100})
	(&feeder{s: s}).send(t, batch(e))
	last := clk.t
	s.NoteServed(last.Add(DefaultIdleAfter - time.Second)) // healthy: served soon after an event
	requireProblems(t, s, last.Add(time.Hour))
	s.NoteServed(last.Add(DefaultIdleAfter + time.Second))
	ps := requireProblems(t, s, last.Add(time.Hour), ProblemEventsStopped)
	if !strings.Contains(ps[0].Message, "5m1s") {
		t.Fatalf("message %q", ps[0].Message)
	}
	// A new event clears it.
	clk.t = last.Add(DefaultIdleAfter + 2*time.Second)
	e2, _ := stored(p64(100), [2]uint64{2, 101})
	(&feeder{s: s, seq: 1}).send(t, batch(e2))
	requireProblems(t, s, clk.t)
}

func TestDiagBlockSize(t *testing.T) {
	s, clk, _ := diagSub(t, nil)
	f := &feeder{s: s}
	good, _ := stored(nil, [2]uint64{1, 100})
	f.send(t, batch(good))
	requireProblems(t, s, clk.t) // healthy

	bad := ev{kind: "stored", seqs: []uint64{200}, tokens: []uint32{1, 2, 3, 4, 5, 6, 7, 8}, bs: 8}
	f.send(t, batch(bad))
	ps := requireProblems(t, s, clk.t, ProblemBlockSize)
	if !strings.Contains(ps[0].Message, "block_size 8, configured 4") {
		t.Fatalf("message %q", ps[0].Message)
	}
	if st := s.Status(); st.Diag.BlockSizeRejects != 1 || st.Diag.ForeignBlockSize != 8 {
		t.Fatalf("diag %+v", st.Diag)
	}
	// Two windows later, with no more such stores, it is over.
	requireProblems(t, s, clk.t.Add(2*DefaultDiagWindow))
}

func TestDiagParentNotFound(t *testing.T) {
	// Healthy: a chain of stores, each under the previous block.
	s, clk, _ := diagSub(t, nil)
	f := &feeder{s: s}
	e0, _ := stored(nil, [2]uint64{1, 100})
	f.send(t, batch(e0))
	for i := uint64(1); i < 20; i++ {
		e, _ := stored(p64(99+i), [2]uint64{i + 1, 100 + i})
		f.send(t, batch(e))
	}
	requireProblems(t, s, clk.t)

	// Stores under parents the worker never held: the stream was joined mid-way, or a
	// second publisher shares the endpoint.
	s, clk, _ = diagSub(t, nil)
	f = &feeder{s: s}
	for i := uint64(0); i < 10; i++ {
		clk.advance(time.Second)
		e, _ := stored(p64(5000+i), [2]uint64{i + 1, 100 + i})
		f.send(t, batch(e))
	}
	ps := requireProblems(t, s, clk.t, ProblemParentMiss)
	if !strings.Contains(ps[0].Message, "10 of 10 store(s)") {
		t.Fatalf("message %q", ps[0].Message)
	}
	// Fewer misses than MinSamples stores say nothing yet.
	s, clk, _ = diagSub(t, nil)
	f = &feeder{s: s}
	e, _ := stored(p64(5000), [2]uint64{1, 100})
	f.send(t, batch(e))
	requireProblems(t, s, clk.t)
}

// hashVectors are the golden chains of testdata/vllmhash (see package vllmhash).
func hashVectors(t *testing.T) map[string][]byte {
	t.Helper()
	b, err := os.ReadFile("../testdata/vllmhash/vectors.json")
	if err != nil {
		t.Fatal(err)
	}
	var v struct {
		Chains []struct {
			Name       string `json:"name"`
			PayloadInt string `json:"payload_int"`
			PayloadBin string `json:"payload_bin"`
		} `json:"chains"`
	}
	if err := json.Unmarshal(b, &v); err != nil {
		t.Fatal(err)
	}
	out := map[string][]byte{}
	for _, c := range v.Chains {
		for form, h := range map[string]string{"int": c.PayloadInt, "bin": c.PayloadBin} {
			p, err := hex.DecodeString(h)
			if err != nil {
				t.Fatal(err)
			}
			out[c.Name+"/"+form] = p
		}
	}
	return out
}

func TestDiagHashCheck(t *testing.T) {
	vec := hashVectors(t)
	check := func(seed string, sample int) func(*Config) {
		return func(c *Config) {
			c.BlockSize = 4
			c.HashCheck = HashCheck{Enabled: true, Seed: seed, SampleEvery: sample, Algo: vllmhash.SHA256CBOR}
		}
	}
	// Healthy: the engine's seed, every chain of the vectors (plain, LoRA, images,
	// salt, prompt embeddings), int and bin hashes.
	s, clk, _ := diagSub(t, check("0", 1))
	f := &feeder{s: s}
	n := 0
	for name, p := range vec {
		if strings.HasPrefix(name, "plain-seed42") || strings.HasPrefix(name, "large-tokens") ||
			strings.HasPrefix(name, "int-keys") || strings.HasPrefix(name, "long-block") {
			continue // another seed, another block size
		}
		f.send(t, p)
		n += 3
	}
	st := s.Status()
	if h := st.Diag.Hash; h.Matched != uint64(n) || h.Mismatched != 0 || h.Unverifiable != 0 {
		t.Fatalf("hash counts %+v, want %d matched", h, n)
	}
	requireProblems(t, s, clk.t)

	// Another seed than the engine's: every root mismatches; the blocks below are
	// unverifiable.
	s, clk, _ = diagSub(t, check("1", 1))
	(&feeder{s: s}).send(t, vec["plain/int"])
	if h := s.Status().Diag.Hash; h.Matched != 0 || h.Mismatched != 1 || h.Unverifiable != 2 {
		t.Fatalf("hash counts %+v", h)
	}
	requireProblems(t, s, clk.t, ProblemHashMismatch)

	// The check off: nothing counted, nothing reported.
	s, clk, _ = diagSub(t, nil)
	(&feeder{s: s}).send(t, vec["plain/int"])
	if h := s.Status().Diag.Hash; h != (HashCounts{}) || s.Status().Diag.HashCheck {
		t.Fatalf("hash counts %+v with the check off", h)
	}
	requireProblems(t, s, clk.t)
}

// A child stored in a later event is checked through the digest of its parent, learned
// when the parent was checked; a child of an unchecked parent is unverifiable; sampling
// skips whole chains.
func TestDiagHashChain(t *testing.T) {
	toks := []uint32{5, 6, 7, 8, 9, 10, 11, 12}
	d := vllmhash.Chain("7", nil, toks, 4, nil)
	root := ev{kind: "stored", seqs: []uint64{d[0].Low64()}, tokens: toks[:4], bs: 4}
	child := ev{kind: "stored", seqs: []uint64{d[1].Low64()}, parent: d[0].Low64(), hasParent: true, tokens: toks[4:], bs: 4}
	orphan := ev{kind: "stored", seqs: []uint64{77}, parent: 76, hasParent: true, tokens: toks[4:], bs: 4}

	s, _, _ := diagSub(t, func(c *Config) { c.HashCheck = HashCheck{Enabled: true, Seed: "7", Algo: vllmhash.SHA256CBOR} })
	f := &feeder{s: s}
	f.send(t, batch(root))
	f.send(t, batch(child))
	f.send(t, batch(orphan))
	if h := s.Status().Diag.Hash; h.Matched != 2 || h.Mismatched != 0 || h.Unverifiable != 1 {
		t.Fatalf("hash counts %+v", h)
	}
	// A removed parent is forgotten: its children can no longer be checked.
	f.send(t, batch(ev{kind: "removed", seqs: []uint64{d[0].Low64()}}))
	f.send(t, batch(child))
	if h := s.Status().Diag.Hash; h.Unverifiable != 2 {
		t.Fatalf("hash counts %+v", h)
	}

	s, _, _ = diagSub(t, func(c *Config) {
		c.HashCheck = HashCheck{Enabled: true, Seed: "7", SampleEvery: 2, Algo: vllmhash.SHA256CBOR}
	})
	f = &feeder{s: s}
	for range 4 {
		f.send(t, batch(root))
	}
	if h := s.Status().Diag.Hash; h.Matched != 2 || h.SampledOut != 2 {
		t.Fatalf("sampled hash counts %+v", h)
	}
}

func TestDiagConfig(t *testing.T) {
	for _, mod := range []func(*Config){
		func(c *Config) { c.Diagnose.Window = time.Millisecond },
		func(c *Config) { c.Diagnose.ParentMissRate = 2 },
		func(c *Config) { c.Diagnose.MinSamples = -1 },
		func(c *Config) { c.HashCheck.SampleEvery = -1 },
		func(c *Config) { c.HashCheck.MaxTracked = 1 << 30 },
		func(c *Config) { c.Groups.Groups = []int{-1} },
		func(c *Config) { c.HashCheck.Algo = "xxhash" },
	} {
		cfg := Config{Endpoint: "tcp://127.0.0.1:1", Worker: "w", Index: nopIdx{}}
		mod(&cfg)
		if _, err := New(cfg); err == nil {
			t.Fatalf("config %+v accepted", cfg)
		}
	}
}

type nopIdx struct{}

func (nopIdx) Apply(*engine.Event) error { return nil }

// With bin hashes (VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0) the parent's whole digest is
// on the wire: a child is checked even when its root was never seen, and compared whole.
func TestDiagHashBinParent(t *testing.T) {
	toks := []uint32{5, 6, 7, 8, 9, 10, 11, 12}
	d := vllmhash.Chain("7", nil, toks, 4, nil)
	child := func(digest []byte) []byte {
		m := mp{}.Arr(3).F64(1750000000.25).Arr(1).Arr(7).Str("BlockStored").Arr(1).Bin(digest).Bin(d[0][:]).
			Tokens(toks[4:]).Uint(4).Nil().Str("GPU")
		return m.Uint(0)
	}
	s, clk, _ := diagSub(t, func(c *Config) { c.HashCheck = HashCheck{Enabled: true, Seed: "7", Algo: vllmhash.SHA256CBOR} })
	f := &feeder{s: s}
	f.send(t, child(d[1][:]))
	if h := s.Status().Diag.Hash; h.Matched != 1 || h.Unverifiable != 0 {
		t.Fatalf("hash counts %+v", h)
	}
	requireProblems(t, s, clk.t)
	// Same low 64 bits, another digest: only the whole comparison tells.
	wrong := d[1]
	wrong[0] ^= 1
	f.send(t, child(wrong[:]))
	if h := s.Status().Diag.Hash; h.Mismatched != 1 {
		t.Fatalf("hash counts %+v", h)
	}
	requireProblems(t, s, clk.t, ProblemHashMismatch)
}

// The default algorithm, "sha256" (pickle), checked the same way.
func TestDiagHashPickle(t *testing.T) {
	toks := []uint32{5, 6, 7, 8, 9, 10, 11, 12}
	var h vllmhash.Hasher
	r := vllmhash.RootPickle("3")
	d0, _ := h.BlockPickle(&r, toks[:4], nil)
	d1, _ := h.BlockPickle(&d0, toks[4:], nil)
	e := ev{kind: "stored", seqs: []uint64{d0.Low64(), d1.Low64()}, tokens: toks, bs: 4}
	for _, tc := range []struct {
		seed, algo string
		matched    uint64
	}{{"3", "", 2}, {"3", vllmhash.SHA256CBOR, 0}, {"4", "", 0}} {
		s, clk, _ := diagSub(t, func(c *Config) { c.HashCheck = HashCheck{Enabled: true, Seed: tc.seed, Algo: tc.algo} })
		(&feeder{s: s}).send(t, batch(e))
		if got := s.Status().Diag.Hash; got.Matched != tc.matched || got.Mismatched != 1-tc.matched/2 {
			t.Fatalf("seed %q algo %q: %+v", tc.seed, tc.algo, got)
		}
		if tc.matched == 2 {
			requireProblems(t, s, clk.t)
		} else {
			requireProblems(t, s, clk.t, ProblemHashMismatch)
		}
	}
}
