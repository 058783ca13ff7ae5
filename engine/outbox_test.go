package engine

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestHugeEventBufferNotKept: after an event of more than keepPending deltas for one
// shard, the outbox that applied it keeps no buffer past keepPending, on the locked
// index (a clear of 5,000 root blocks) as on shards (one 10,000-block store): a pooled
// outbox must not hold a huge event's deltas for the rest of its life.
func TestHugeEventBufferNotKept(t *testing.T) {
	for _, cfg := range []Config{{LockedIndex: true}, {Shards: 2}} {
		t.Run(fmt.Sprintf("locked=%v", cfg.LockedIndex), func(t *testing.T) {
			e, err := New(cfg)
			require.NoError(t, err)
			defer e.Close()
			out := e.getOutbox()
			var evs []Event
			for i := range 5000 {
				evs = append(evs, Event{Kind: EventStored, Worker: "w", Blocks: []Block{{Content: uint64(i + 1), Seq: uint64(i + 1)}}})
			}
			chain := make([]Block, 10000)
			for i := range chain {
				chain[i] = Block{Content: uint64(i + 1), Seq: uint64(100000 + i)}
			}
			evs = append(evs, Event{Kind: EventStored, Worker: "v", Blocks: chain}, Event{Kind: EventCleared, Worker: "w"})
			for _, err := range e.applyBatchWith(out, evs, nil) {
				require.NoError(t, err)
			}
			for s := range out.Pend {
				require.LessOrEqual(t, cap(out.Pend[s]), keepPending, "shard %d", s)
			}
		})
	}
}
