package sim

import (
	"errors"
	"math"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/kvindex/kvindex/hash"
)

func repeat(id uint32, n int) []uint32 {
	out := make([]uint32, n)
	for i := range out {
		out[i] = id
	}
	return out
}

func TestGenerateDeterministicAndPrefixStable(t *testing.T) {
	g := GenConfig{Seed: 3, Requests: 400, Sessions: 20}
	a, err := Generate(g)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := Generate(g)
	if !reflect.DeepEqual(a.Requests, b.Requests) {
		t.Fatal("same config, different workloads")
	}
	g.Requests = 150
	c, _ := Generate(g)
	if !reflect.DeepEqual(c.Requests, a.Requests[:150]) {
		t.Fatal("the first 150 requests depend on the request count")
	}
	g.Seed = 4
	d, _ := Generate(g)
	if reflect.DeepEqual(d.Requests, c.Requests) {
		t.Fatal("the seed changes nothing")
	}
}

func TestGenerateShape(t *testing.T) {
	w, err := Generate(GenConfig{Seed: 1, Requests: 3000})
	if err != nil {
		t.Fatal(err)
	}
	if len(w.Requests) != 3000 || w.BlockSize != DefaultBlockSize {
		t.Fatalf("%d requests of block size %d", len(w.Requests), w.BlockSize)
	}
	var tokens, blocks int64
	grew := 0
	for i, r := range w.Requests {
		if len(r.Blocks) != r.Tokens/w.BlockSize {
			t.Fatalf("request %d: %d blocks for %d tokens", i, len(r.Blocks), r.Tokens)
		}
		if r.Tokens > 24576 {
			t.Fatalf("request %d: %d tokens, over MaxContext", i, r.Tokens)
		}
		tokens += int64(r.Tokens)
		blocks += int64(len(r.Blocks))
		// A later turn of the same conversation extends an earlier request.
		for _, q := range w.Requests[max(0, i-50):i] {
			if len(q.Blocks) > 40 && len(r.Blocks) > len(q.Blocks) && slices.Equal(r.Blocks[:len(q.Blocks)], q.Blocks) {
				grew++
				break
			}
		}
	}
	if tokens != w.Tokens || blocks != w.Blocks {
		t.Fatalf("totals %d/%d, counted %d/%d", w.Tokens, w.Blocks, tokens, blocks)
	}
	if grew < 100 {
		t.Fatalf("only %d requests extend a recent one: conversations do not grow", grew)
	}
	// Requests share system prompts, so the ceiling is high but not total.
	c := InfiniteCache(w)
	if r := c.BlockHitRate(); r < 0.5 || r > 0.99 {
		t.Fatalf("infinite-cache hit rate %.3f", r)
	}
}

func TestGenerateRejects(t *testing.T) {
	tests := []struct {
		g    GenConfig
		want string
	}{
		{GenConfig{Requests: -1}, "Requests"},
		{GenConfig{BlockSize: -3}, "block size"},
		{GenConfig{ZipfS: 0.5}, "ZipfS"},
		{GenConfig{Sessions: -1}, "Sessions"},
		{GenConfig{UserTokens: [2]int{10, 5}}, "UserTokens"},
		{GenConfig{MaxContext: 100}, "MaxContext"},
	}
	for _, tc := range tests {
		if _, err := Generate(tc.g); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Generate(%+v) = %v, want an error about %s", tc.g, err, tc.want)
		}
	}
}

func TestInfiniteCache(t *testing.T) {
	w := &Workload{BlockSize: 4}
	for _, r := range []Request{
		req(9, 1, 2),        // cold
		req(12, 1, 2, 3),    // hits 1, 1/2
		req(12, 1, 2, 3),    // hits all 3 but reuses 2 (the last token is recomputed)
		req(8, 2, 3),        // same contents at other positions: no hit
		req(8, 1, 5),        // hits 1
		req(2),              // no blocks
		req(16, 1, 2, 5, 6), // hits 1/2 only: 1/2/5 was never computed
	} {
		w.add(r)
	}
	c := InfiniteCache(w)
	want := Ceiling{HitBlocks: 2 + 3 + 1 + 2, Blocks: 2 + 3 + 3 + 2 + 2 + 4, ReusedTokens: 4 * (2 + 2 + 1 + 2), Tokens: 9 + 12 + 12 + 8 + 8 + 2 + 16}
	if c != want {
		t.Fatalf("got %+v, want %+v", c, want)
	}
	if w.MaxBlocks != 4 {
		t.Fatalf("MaxBlocks %d, want 4", w.MaxBlocks)
	}
}

func TestFromTrace(t *testing.T) {
	recs := []TraceRecord{
		{InputLength: 600, HashIDs: []uint64{7, 9}},
		{InputLength: 100, HashIDs: []uint64{7}},
		{InputLength: 0, HashIDs: nil},
	}
	w, err := FromTrace("t", recs, 64)
	if err != nil {
		t.Fatal(err)
	}
	seven, nine := hash.Content(repeat(7, 64)), hash.Content(repeat(9, 64))
	want0 := []uint64{seven, seven, seven, seven, seven, seven, seven, seven, nine} // 512/64 + 88/64
	if got := w.Requests[0].Blocks; !slices.Equal(got, want0) {
		t.Fatalf("request 0: %x, want %x", got, want0)
	}
	if got := w.Requests[1].Blocks; !slices.Equal(got, []uint64{seven}) {
		t.Fatalf("request 1: %x", got)
	}
	if len(w.Requests[2].Blocks) != 0 || w.Tokens != 700 || w.Blocks != 10 || w.MaxBlocks != 10 {
		t.Fatalf("totals: %+v", w)
	}

	// A block size that does not divide 512: block 5 holds the last 12 sevens and 88 nines.
	w, err = FromTrace("t", recs[:1], 100)
	if err != nil {
		t.Fatal(err)
	}
	mixed := hash.Content(append(repeat(7, 12), repeat(9, 88)...))
	if b := w.Requests[0].Blocks; len(b) != 6 || b[5] != mixed || b[0] != hash.Content(repeat(7, 100)) {
		t.Fatalf("block size 100: %x", b)
	}
	if _, err := FromTrace("t", recs, 0); err == nil {
		t.Fatal("block size 0 accepted")
	}
}

func TestReadTrace(t *testing.T) {
	good := `{"timestamp": 0, "input_length": 600, "output_length": 5, "hash_ids": [0, 1]}

{"timestamp": 27, "input_length": 512, "output_length": 5, "hash_ids": [0]}
`
	recs, err := ReadTrace(strings.NewReader(good), 0)
	if err != nil || len(recs) != 2 || recs[1].Timestamp != 27 || !slices.Equal(recs[0].HashIDs, []uint64{0, 1}) {
		t.Fatalf("ReadTrace = %+v, %v", recs, err)
	}
	if recs, _ := ReadTrace(strings.NewReader(good), 1); len(recs) != 1 {
		t.Fatalf("limit 1 read %d records", len(recs))
	}
	bad := []struct{ line, want string }{
		{`{"input_length": 1`, "line 1"},
		{`{"input_length": 513, "hash_ids": [1]}`, "exceeds"},
		{`{"input_length": -1, "hash_ids": [1]}`, "negative"},
		{`{"input_length": 5, "hash_ids": [4294967296]}`, "32-bit"},
		{`{"input_length": 5, "hash_ids": [-1]}`, "line 1"},
	}
	for _, b := range bad {
		_, err := ReadTrace(strings.NewReader(b.line), 0)
		if !errors.Is(err, ErrWorkload) || !strings.Contains(err.Error(), b.want) {
			t.Errorf("ReadTrace(%s) = %v, want ErrWorkload mentioning %q", b.line, err, b.want)
		}
	}
}

// TestTraceCeilingKnownAnswer pins the conversation trace's infinite-cache prefix hit
// ratio at its own 512-token granularity (aggregate, block-weighted, prefix-only).
func TestTraceCeilingKnownAnswer(t *testing.T) {
	recs := conversationTrace(t, 0)
	hits, refs := TraceCeiling(recs)
	if hits != 105710 || refs != 288500 {
		t.Fatalf("hits %d of %d block references, want 105710 of 288500", hits, refs)
	}
	if r := float64(hits) / float64(refs); math.Round(r*1e4)/1e4 != 0.3664 {
		t.Fatalf("ratio %.6f, want 0.3664", r)
	}
	if len(recs) != 12031 {
		t.Fatalf("%d requests, want 12031", len(recs))
	}
}
