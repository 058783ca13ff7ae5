package subscriber_test

import (
	"context"
	"math/rand/v2"
	"slices"
	"sort"
	"testing"

	"github.com/kvindex/kvindex/engine"
	"github.com/kvindex/kvindex/internal/refmodel"
	"github.com/kvindex/kvindex/subscriber"
	"github.com/kvindex/kvindex/subscriber/pubtest"
)

// offloadSim plays a vLLM worker with the offloading connector: GPU stores with tokens
// and parents, the connector's CPU (and storage) copies named by engine hash only
// (token_ids [], no parent), GPU evictions and CPU removals, each medium's own events.
// It applies the same history to a reference model.
type offloadSim struct {
	r      *rand.Rand
	m      *refmodel.Model
	next   uint64
	path   map[uint64][]uint64 // seq -> content values from the root
	parent map[uint64]uint64   // seq -> parent seq (absent: a root)
	held   [engine.NumTiers]map[uint64]bool
	seqs   []uint64 // every seq ever stored, for picking
}

func newOffloadSim(r *rand.Rand) *offloadSim {
	o := &offloadSim{r: r, m: refmodel.New(), next: 1000, path: map[uint64][]uint64{}, parent: map[uint64]uint64{}}
	for t := range o.held {
		o.held[t] = map[uint64]bool{}
	}
	return o
}

const worker = "engine"

var media = [engine.NumTiers]string{"GPU", "CPU", "STORAGE"}

// pick returns up to n distinct seqs, mostly from those tier t holds.
func (o *offloadSim) pick(t, n int) []uint64 {
	var from []uint64
	for _, s := range o.seqs {
		if o.held[t][s] || o.r.IntN(8) == 0 {
			from = append(from, s)
		}
	}
	o.r.Shuffle(len(from), func(i, j int) { from[i], from[j] = from[j], from[i] })
	return from[:min(n, len(from))]
}

func (o *offloadSim) heldAnywhere(s uint64) bool {
	return o.held[0][s] || o.held[1][s] || o.held[2][s]
}

// event returns one random event, applied to the model.
func (o *offloadSim) event() pubtest.Event {
	switch k := o.r.IntN(10); {
	case k < 4: // a GPU store: a new chain, or an extension of a block held somewhere
		var parent *uint64
		var path []uint64
		if o.r.IntN(3) > 0 {
			for _, s := range o.pick(0, 1) {
				if o.heldAnywhere(s) {
					p := s
					parent, path = &p, o.path[s]
				}
			}
		}
		ev := pubtest.Event{Type: "BlockStored", BlockSize: bs, Parent: parent, Medium: "GPU", BlockHashes: []uint64{}}
		var blocks [][2]uint64
		for range 1 + o.r.IntN(4) {
			c := uint64(o.r.IntN(6)) // few values: chains share prefixes
			path = append(slices.Clip(path), c)
			o.next++
			s := o.next
			ev.BlockHashes = append(ev.BlockHashes, s)
			ev.TokenIDs = append(ev.TokenIDs, tokens(c)...)
			blocks = append(blocks, [2]uint64{content(c), s})
			o.path[s] = path
			if parent != nil {
				o.parent[s] = *parent
			}
			p := s
			parent = &p
			o.seqs = append(o.seqs, s)
			o.held[0][s] = true
		}
		var p uint64
		has := ev.Parent != nil
		if has {
			p = *ev.Parent
		}
		if err := o.m.StoredOn(worker, 0, p, has, blocks); err != nil {
			panic(err) // the parent is held: the model must take it
		}
		return ev
	case k < 7: // the connector's copies to CPU (or storage): hashes only
		t := 1 + o.r.IntN(4)/3
		seqs := o.pick(0, 1+o.r.IntN(5))
		if _, err := o.m.Copied(worker, t, seqs); err != nil {
			panic(err)
		}
		for _, s := range seqs {
			if o.heldAnywhere(s) {
				o.held[t][s] = true
			}
		}
		return pubtest.Event{Type: "BlockStored", BlockHashes: seqs, TokenIDs: []uint32{}, BlockSize: bs * (1 + o.r.IntN(2)), Medium: media[t]}
	default: // an eviction on one medium
		t := []int{0, 0, 1, 2}[o.r.IntN(4)]
		seqs := o.pick(t, 1+o.r.IntN(3))
		o.m.RemovedOn(worker, t, seqs)
		for _, s := range seqs {
			delete(o.held[t], s)
		}
		return pubtest.Event{Type: "BlockRemoved", BlockHashes: seqs, Medium: media[t]}
	}
}

// TestInteropVLLMOffload follows a vLLM worker with CPU offloading through the real
// wire (publisher.py): the index answers what the reference model answers, per tier.
func TestInteropVLLMOffload(t *testing.T) {
	h := newHarness(t, pubtest.Options{Bind: true}, nil)
	h.waitSynced()
	o := newOffloadSim(rand.New(rand.NewPCG(12, 3)))
	ctx := context.Background()
	var last uint64
	var hostExtends, diskExtends int // answers where a slower tier lengthens the prefix
	for round := range 60 {
		evs := make([]pubtest.Event, 1+o.r.IntN(5))
		for i := range evs {
			evs[i] = o.event()
		}
		seq, err := h.pub.Publish(0, true, evs...)
		if err != nil {
			t.Fatal(err)
		}
		last = seq
		if round%6 != 5 {
			continue
		}
		h.waitSeq(0, last)
		for _, s := range o.seqs {
			q := make([]uint64, len(o.path[s]))
			for i, c := range o.path[s] {
				q[i] = content(c)
			}
			got, err := h.eng.FindMatchesIn(ctx, ns, q, nil)
			if err != nil {
				t.Fatal(err)
			}
			want := o.m.Query(q)
			sort.Slice(got, func(i, j int) bool { return got[i].Worker < got[j].Worker })
			ok := len(got) == len(want)
			for i := 0; ok && i < len(got); i++ {
				ok = got[i].Worker == want[i].Worker && got[i].Score == want[i].Score && got[i].Size == want[i].Size && got[i].Tiers == want[i].Tiers
			}
			if !ok {
				t.Fatalf("round %d, query %v: engine %+v, model %+v", round, o.path[s], got, want)
			}
			for _, a := range want {
				if a.Tiers[1] > a.Tiers[0] {
					hostExtends++
				}
				if a.Tiers[2] > a.Tiers[1] {
					diskExtends++
				}
			}
		}
	}
	if hostExtends == 0 || diskExtends == 0 {
		t.Fatalf("the history never exercised the slower tiers: %d host, %d disk extensions", hostExtends, diskExtends)
	}
	h.waitSeq(0, last)
	st := h.subs[0].Status()
	if st.State != subscriber.StateLive || st.Copied == 0 || st.Stored == 0 || st.Removed == 0 || st.RejectedTotal() != 0 {
		t.Fatalf("status %+v", st)
	}
	es := h.eng.Stats()
	if es.TierBlocks[1] == 0 || es.TierBlocks[2] == 0 || es.SkippedCopies == 0 {
		t.Fatalf("engine stats %+v", es)
	}
	var n [engine.NumTiers]int64
	for t := range o.held {
		n[t] = int64(len(o.held[t]))
	}
	if n != es.TierBlocks {
		t.Fatalf("tier blocks %v, model %v", es.TierBlocks, n)
	}
}
