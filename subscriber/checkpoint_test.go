package subscriber

import (
	"context"
	"testing"

	"github.com/zeebo/xxh3"
)

// A checkpoint moves only at the end of a change, with an even version; a subscriber
// resumed from it verifies the batch by digest and replays what followed, or takes a
// different batch at that sequence for a restart.
func TestCheckpointAndResume(t *testing.T) {
	e := newEngine(t)
	fp := &fakePub{}
	s := newTestSub(t, e, fp, true)
	if _, ok, v := s.Checkpoint(); ok || v != 0 {
		t.Fatalf("fresh subscriber: ok %v version %d", ok, v)
	}
	e0, _ := stored(nil, [2]uint64{1, 100})
	e1, _ := stored(p64(100), [2]uint64{2, 101})
	fp.add(0, batch(e0))
	fp.add(1, batch(e1))
	sendLive(t, s, 0, batch(e0))
	cp, ok, v := s.Checkpoint()
	if !ok || v == 0 || v&1 != 0 || cp != (Checkpoint{Seq: 0, Digest: xxh3.Hash(batch(e0)), Exact: true}) {
		t.Fatalf("checkpoint %+v ok %v version %d", cp, ok, v)
	}
	for _, tc := range []struct {
		name     string
		digest   uint64
		restarts uint64
	}{{"same batch", cp.Digest, 0}, {"another batch at that seq", cp.Digest + 1, 1}} {
		t.Run(tc.name, func(t *testing.T) {
			r := newTestSub(t, e, fp, true)
			rcp := Checkpoint{Seq: 0, Digest: tc.digest, Exact: true}
			r.has, r.last, r.digest, r.exact = true, rcp.Seq, rcp.Digest, rcp.Exact // as New does with Config.Resume
			if err := r.catchUp(context.Background()); err != nil {
				t.Fatal(err)
			}
			r.setState()
			r.publish()
			st := r.Status()
			if st.LastSeq != 1 || st.Restarts != tc.restarts || st.State != StateLive {
				t.Fatalf("resumed: %+v", st)
			}
		})
	}
}
