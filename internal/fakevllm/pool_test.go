package fakevllm

import (
	"slices"
	"testing"

	"github.com/kvindex/kvindex/hash"
	"github.com/kvindex/kvindex/kvevents"
)

// refPool is the obvious LRU: a slice, most recent last.
type refPool struct {
	capacity int
	order    []uint64
}

func (r *refPool) has(h uint64) bool { return slices.Contains(r.order, h) }

func (r *refPool) touch(h uint64) {
	i := slices.Index(r.order, h)
	r.order = append(append(r.order[:i:i], r.order[i+1:]...), h)
}

// admit is blockPool.admit written the slow way.
func (r *refPool) admit(hashes []uint64) (first int, evicted []uint64) {
	for first < len(hashes) && r.has(hashes[first]) {
		first++
	}
	for i := first - 1; i >= 0; i-- {
		r.touch(hashes[i])
	}
	for len(r.order)+len(hashes)-first > r.capacity {
		evicted = append(evicted, r.order[0])
		r.order = r.order[1:]
	}
	for i := len(hashes) - 1; i >= first; i-- {
		r.order = append(r.order, hashes[i])
	}
	for i := first - 1; i >= 0; i-- {
		r.touch(hashes[i])
	}
	return first, evicted
}

// TestPoolAgainstReference runs random requests through the pool and the reference
// LRU: same hits, same evictions; and the invariants the subscriber relies on: every
// cached block's parent is cached (so an eviction is a leaf and the index's blocks form
// prefixes), and each stored block's tokens hash to its content.
func TestPoolAgainstReference(t *testing.T) {
	for _, seed := range []uint64{1, 2, 3} {
		w := Workload{Capacity: 96, MaxSessionBlocks: 40, SystemPrompts: 4, SystemsPerEngine: 2, Sessions: 5}.withDefaults()
		req := newRequester(newPrompts(w, seed), seed)
		pool := newBlockPool(w.Capacity)
		ref := &refPool{capacity: w.Capacity}
		parent := map[uint64]uint64{} // engine hash -> parent engine hash (rootParent for a root)
		var toks []uint32
		for i := range 3000 {
			c := req.next()
			first, evicted := pool.admit(c, nil)
			rf, rev := ref.admit(c.hashes)
			if first != rf || !slices.Equal(evicted, rev) {
				t.Fatalf("seed %d request %d: first %d evicted %v; reference %d %v", seed, i, first, evicted, rf, rev)
			}
			if first == len(c.hashes) {
				t.Fatalf("seed %d request %d: nothing to store", seed, i)
			}
			for p := range c.hashes {
				toks = appendTokens(toks[:0], c.seeds[p], p, w.BlockSize)
				if hash.Content(toks) != c.content[p] {
					t.Fatalf("block %d: content hash is not its tokens'", p)
				}
				par := uint64(rootParent)
				if p > 0 {
					par = c.hashes[p-1]
				}
				parent[c.hashes[p]] = par
			}
			if pool.len() > w.Capacity {
				t.Fatalf("pool holds %d > %d", pool.len(), w.Capacity)
			}
			for h := range pool.idx {
				if p := parent[h]; p != rootParent && !pool.has(p) {
					t.Fatalf("seed %d request %d: block %x cached without its parent %x", seed, i, h, p)
				}
			}
		}
	}
}

// TestPayloadDecodes: both encodings decode with package kvevents into the events the
// engine meant, token ids and all.
func TestPayloadDecodes(t *testing.T) {
	for _, enc := range []string{EncodingMap, EncodingArray} {
		t.Run(enc, func(t *testing.T) {
			w := Workload{}.withDefaults()
			req := newRequester(newPrompts(w, 7), 7)
			c := req.next()
			be := batchEncoder{enc: enc, blockSize: w.BlockSize}
			tokens := func(i int, dst []byte) []byte {
				return appendTokenIDs(dst, appendTokens(nil, c.seeds[2+i], 2+i, w.BlockSize))
			}
			p := be.begin(nil, 1750000000.5, 2)
			p = be.removed(p, []uint64{1, 1 << 40})
			p = be.stored(p, c.hashes[2:], c.hashes[1], true, tokens)
			p = be.end(p)
			dec, err := kvevents.New(kvevents.Config{BlockSize: w.BlockSize})
			if err != nil {
				t.Fatal(err)
			}
			var b kvevents.Batch
			if err := dec.Decode(p, &b); err != nil {
				t.Fatal(err)
			}
			if len(b.Events) != 2 || b.UnknownTypes != 0 || !b.HasDPRank || b.DPRank != 0 || b.Timestamp != 1750000000.5 {
				t.Fatalf("batch %+v", b)
			}
			rm, st := b.Events[0], b.Events[1]
			if rm.Kind != kvevents.Removed || !slices.Equal(rm.Seqs, []uint64{1, 1 << 40}) || rm.Medium != "GPU" {
				t.Fatalf("removed %+v", rm)
			}
			if st.Kind != kvevents.Stored || !slices.Equal(st.Seqs, c.hashes[2:]) || !st.HasParent || st.Parent != c.hashes[1] ||
				!slices.Equal(st.Contents, c.content[2:]) || st.Medium != "GPU" || st.SpecKind != "full_attention" {
				t.Fatalf("stored %+v, want seqs %v contents %v", st, c.hashes[2:], c.content[2:])
			}
			p = be.stored(be.begin(nil, 1, 1), c.hashes[:2], 0, false, func(i int, dst []byte) []byte {
				return appendTokenIDs(dst, appendTokens(nil, c.seeds[i], i, w.BlockSize))
			})
			if err := dec.Decode(be.end(p), &b); err != nil || len(b.Events) != 1 || b.Events[0].HasParent {
				t.Fatalf("root store: %v %+v", err, b)
			}
		})
	}
}

func TestWorkloadValidation(t *testing.T) {
	for _, c := range []FleetConfig{
		{Engines: 0},
		{Engines: MaxEngines + 1},
		{Engines: 1, Workload: Workload{Capacity: 10}},
		{Engines: 1, Workload: Workload{MaxSessionBlocks: 8}},
		{Engines: 1, Encoding: "json"},
		{Engines: 1, HWMBytes: 100},
	} {
		if err := c.WithDefaults().Validate(); err == nil {
			t.Errorf("%+v: validated", c)
		}
	}
	if err := (FleetConfig{Engines: 1}).WithDefaults().Validate(); err != nil {
		t.Fatal(err)
	}
}
