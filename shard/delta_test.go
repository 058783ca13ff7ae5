package shard

import (
	"testing"
	"unsafe"

	"github.com/stretchr/testify/require"
)

// TestDeltaLayout: a delta is 12 bytes, 4-byte aligned, so that a ring cell is 16, and
// its op, id and fingerprint come back as given at the ends of their ranges.
func TestDeltaLayout(t *testing.T) {
	require.Equal(t, uintptr(12), unsafe.Sizeof(Delta{}))
	require.Equal(t, uintptr(4), unsafe.Alignof(Delta{}))
	for _, op := range []uint8{OpAdd, OpRemove, OpBarrier} {
		for _, id := range []uint32{0, 1, MaxID} {
			for _, fp := range []uint64{0, 1<<64 - 1, 0x8000_0001_7fff_fffe} {
				d := NewDelta(op, fp, id)
				require.Equal(t, op, d.Op())
				require.Equal(t, id, d.ID())
				require.Equal(t, fp, d.FP())
			}
		}
	}
}
