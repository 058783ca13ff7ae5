package kvevents

import (
	"testing"

	"github.com/kvindex/kvindex/internal/fakevllm"
)

// mp builds msgpack the way msgspec writes it; the package itself never encodes.
type mp = fakevllm.Enc

var unhex = fakevllm.Unhex

// batch wraps already-encoded events into [ts, events, rank].
func batch(rank int64, events ...mp) []byte {
	m := mp{}.Arr(3).F64(tsGolden).Arr(len(events))
	for _, e := range events {
		m = m.Add(e)
	}
	return m.Int(rank)
}

// norm returns the events with empty slices made nil, for comparisons.
func norm(evs []Event) []Event {
	out := make([]Event, len(evs))
	for i, e := range evs {
		if len(e.Seqs) == 0 {
			e.Seqs = nil
		}
		if len(e.Contents) == 0 {
			e.Contents = nil
		}
		out[i] = e
	}
	return out
}

func mustNew(t testing.TB, cfg Config) *Decoder {
	t.Helper()
	d, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return d
}
