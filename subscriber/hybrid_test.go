package subscriber

import (
	"bufio"
	"bytes"
	"context"
	"encoding/hex"
	"flag"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/kvindex/kvindex/engine"
	"github.com/kvindex/kvindex/internal/refmodel"
)

var updateHybrid = flag.Bool("update-hybrid", false, "rewrite testdata/hybrid-stream.hex")

const hybridFile = "testdata/hybrid-stream.hex"

// hybridEvent is one event of a hybrid model's stream, encoded as vLLM v0.26 maps
// (EVENTS.md §3.2): stores carry group_idx and kv_cache_spec_kind, removals only
// group_idx.
type hybridEvent struct {
	kind   string // stored, removed
	group  int
	spec   string
	seqs   []uint64
	parent *uint64
	vals   []uint64 // content values (blockTokens) of a store
}

func (h hybridEvent) encode(m mp) mp {
	if h.kind == "removed" {
		m = m.Map(4).Str("type").Str("BlockRemoved").Str("block_hashes").Uints(h.seqs...).
			Str("medium").Str("GPU").Str("group_idx").Uint(uint64(h.group))
		return m
	}
	m = m.Map(9).Str("type").Str("BlockStored").Str("block_hashes").Uints(h.seqs...).Str("parent_block_hash")
	if h.parent != nil {
		m = m.Uint(*h.parent)
	} else {
		m = m.Nil()
	}
	var toks []uint32
	for _, v := range h.vals {
		toks = append(toks, blockTokens(v)...)
	}
	m = m.Str("token_ids").Tokens(toks).Str("block_size").Uint(testBS).Str("medium").Str("GPU").
		Str("extra_keys").Arr(len(h.seqs))
	for range h.seqs {
		m = m.Nil()
	}
	return m.Str("group_idx").Uint(uint64(h.group)).Str("kv_cache_spec_kind").Str(h.spec)
}

// hybridStream is what a vLLM engine serving a hybrid model (one full-attention group,
// one sliding-window group of 2 blocks, one Mamba group) publishes for two requests
// sharing a prefix: every group stores the same block hashes; the sliding-window group
// evicts blocks as its window moves past them, the Mamba group keeps only its last
// state block.
func hybridStream() [][]hybridEvent {
	stores := func(parent *uint64, seqs, vals []uint64) []hybridEvent {
		return []hybridEvent{
			{kind: "stored", group: 0, spec: "full_attention", seqs: seqs, parent: parent, vals: vals},
			{kind: "stored", group: 1, spec: "sliding_window", seqs: seqs, parent: parent, vals: vals},
			{kind: "stored", group: 2, spec: "mamba", seqs: seqs, parent: parent, vals: vals},
		}
	}
	var out [][]hybridEvent
	// Request 1: blocks 1..4 (hashes 101..104).
	out = append(out, stores(nil, []uint64{101, 102}, []uint64{1, 2}))
	out = append(out, append(stores(p64(102), []uint64{103, 104}, []uint64{3, 4}),
		hybridEvent{kind: "removed", group: 1, seqs: []uint64{101, 102}},
		hybridEvent{kind: "removed", group: 2, seqs: []uint64{101, 102, 103}}))
	// Request 2 shares blocks 1..2, then diverges: 5, 6.
	out = append(out, append(stores(p64(102), []uint64{105, 106}, []uint64{5, 6}),
		hybridEvent{kind: "removed", group: 1, seqs: []uint64{103, 104}},
		hybridEvent{kind: "removed", group: 2, seqs: []uint64{104, 105}}))
	return out
}

// TestHybridStreamFile keeps the recorded stream in step with its generator; run with
// -update-hybrid to rewrite it.
func TestHybridStreamFile(t *testing.T) {
	var buf bytes.Buffer
	buf.WriteString("# A hybrid model's KV event stream (full attention, sliding window, Mamba), one\n")
	buf.WriteString("# msgpack EventBatch per line in hex, sequence numbers from 0. Written by\n")
	buf.WriteString("# go test ./subscriber -run TestHybridStreamFile -update-hybrid (hybrid_test.go).\n")
	for _, b := range hybridStream() {
		m := mp{}.Arr(3).F64(1750000000.25).Arr(len(b))
		for _, e := range b {
			m = e.encode(m)
		}
		fmt.Fprintln(&buf, hex.EncodeToString(m.Uint(0)))
	}
	if *updateHybrid {
		if err := os.WriteFile(hybridFile, buf.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	got, err := os.ReadFile(hybridFile)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, buf.Bytes()) {
		t.Fatalf("%s is stale: run go test ./subscriber -run TestHybridStreamFile -update-hybrid", hybridFile)
	}
}

func readHybrid(t *testing.T) [][]byte {
	t.Helper()
	f, err := os.Open(hybridFile)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out [][]byte
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		p, err := hex.DecodeString(line)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, p)
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// The recorded stream through a subscriber with the default filter: the index holds
// exactly the full-attention group's blocks, other groups are counted by kind, and a
// removal of the sliding-window group (same hashes, no kind on the wire) deletes nothing.
func TestHybridStream(t *testing.T) {
	payloads := readHybrid(t)
	s, clk, _ := diagSub(t, nil)
	f := &feeder{s: s}
	for _, p := range payloads {
		f.send(t, p)
	}
	m := refmodel.New()
	for _, b := range hybridStream() {
		for _, e := range b {
			if e.group != 0 {
				continue
			}
			ref := make([][2]uint64, len(e.seqs))
			for i := range e.seqs {
				ref[i] = [2]uint64{contents(e.vals[i])[0], e.seqs[i]}
			}
			var parent uint64
			if e.parent != nil {
				parent = *e.parent
			}
			m.Stored("w", parent, e.parent != nil, ref)
		}
	}
	queries := [][]uint64{contents(1, 2, 3, 4), contents(1, 2, 5, 6), contents(1, 2, 3, 6), contents(2)}
	sameAnswers(t, s.cfg.Index.(*engine.Engine), Namespace("m", ""), m, queries)
	st := s.Status()
	if st.Rejected[ReasonKVGroup] != 10 || st.Stored != 3 || st.Removed != 0 {
		t.Fatalf("kv_group %d, stored %d, removed %d", st.Rejected[ReasonKVGroup], st.Stored, st.Removed)
	}
	want := []GroupCount{{"sliding_window", 5}, {"mamba", 5}}
	if !slices.Equal(st.Diag.SkippedGroups, want) {
		t.Fatalf("skipped groups %v, want %v", st.Diag.SkippedGroups, want)
	}
	requireProblems(t, s, clk.t)

	// Without the filter (every group indexed) the other groups' removals delete the
	// full-attention blocks they share hashes with: the shared prefix is gone.
	s, _, _ = diagSub(t, func(c *Config) { c.Groups = GroupFilter{Groups: []int{0, 1, 2}} })
	f = &feeder{s: s}
	for _, p := range payloads {
		f.send(t, p)
	}
	e := s.cfg.Index.(*engine.Engine)
	if err := e.Barrier(context.Background()); err != nil {
		t.Fatal(err)
	}
	got, err := e.FindMatchesIn(context.Background(), Namespace("m", ""), contents(1, 2, 5, 6), nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 0 {
		t.Fatalf("unfiltered stream kept %v; the poisoning this filter prevents did not happen", got)
	}
}

// An explicit group list indexes by group_idx whatever the kind.
func TestGroupFilterByIndex(t *testing.T) {
	s, _, _ := diagSub(t, func(c *Config) { c.Groups = GroupFilter{Groups: []int{1}} })
	f := &feeder{s: s}
	for _, p := range readHybrid(t) {
		f.send(t, p)
	}
	st := s.Status()
	// Group 1's third store names block 102, which its window already evicted.
	if st.Stored != 2 || st.Removed != 2 || st.Rejected[ReasonParentNotFound] != 1 || st.Rejected[ReasonKVGroup] != 8 {
		t.Fatalf("stored %d removed %d rejected %v, want group 1's 2 and 2, one parent miss", st.Stored, st.Removed, st.Rejected)
	}
}
