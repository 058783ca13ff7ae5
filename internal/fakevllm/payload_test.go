package fakevllm

import (
	"slices"
	"testing"

	"github.com/kvindex/kvindex/kvevents"
)

// TestBatchDecodes: a batch the engines publish, in either encoding, decodes with
// package kvevents to the events written: a removal, then a store with its parent and
// one content hash per block, at the engine's block size and timestamp.
func TestBatchDecodes(t *testing.T) {
	const bs = 4
	for _, enc := range []string{EncodingMap, EncodingArray} {
		t.Run(enc, func(t *testing.T) {
			e := batchEncoder{enc: enc, blockSize: bs}
			tokens := func(i int, dst []byte) []byte {
				return appendTokenIDs(dst, []uint32{uint32(i), 1, 2, 3})
			}
			p := e.begin(nil, 1750000000.5, 2)
			p = e.removed(p, []uint64{7, 8})
			p = e.stored(p, []uint64{11, 12, 13}, 9, true, tokens)
			p = e.end(p)
			d, err := kvevents.New(kvevents.Config{BlockSize: bs})
			if err != nil {
				t.Fatal(err)
			}
			var b kvevents.Batch
			if err := d.Decode(p, &b); err != nil {
				t.Fatal(err)
			}
			if b.Timestamp != 1750000000.5 || len(b.Events) != 2 {
				t.Fatalf("ts %v, %d events, want 2", b.Timestamp, len(b.Events))
			}
			rm, st := b.Events[0], b.Events[1]
			if rm.Kind != kvevents.Removed || !slices.Equal(rm.Seqs, []uint64{7, 8}) {
				t.Errorf("first event %+v, want a removal of 7, 8", rm)
			}
			if st.Kind != kvevents.Stored || !slices.Equal(st.Seqs, []uint64{11, 12, 13}) || !st.HasParent || st.Parent != 9 || len(st.Contents) != 3 {
				t.Errorf("second event %+v, want a store of 11, 12, 13 after 9 with 3 content hashes", st)
			}
		})
	}
}
