//go:build linux && (amd64 || arm64)

package engine_test

import (
	"context"
	"errors"
	"syscall"
	"testing"
	"unsafe"

	"github.com/stretchr/testify/require"

	"github.com/kvindex/kvindex/engine"
)

// An over-long query is refused with its own error, not as an invalid event: a query
// changes nothing, and a caller must not count it as a rejected event. The query's
// content is an 8 GiB read-only mapping that is never touched (the length is refused
// first), so the test needs address space, not memory.
func TestQueryTooLong(t *testing.T) {
	n := engine.MaxDepth
	mem, err := syscall.Mmap(-1, 0, n*8, syscall.PROT_READ, syscall.MAP_PRIVATE|syscall.MAP_ANON|syscall.MAP_NORESERVE)
	if err != nil {
		t.Skipf("cannot map %d bytes of address space: %v", n*8, err)
	}
	defer syscall.Munmap(mem)
	content := unsafe.Slice((*uint64)(unsafe.Pointer(&mem[0])), n)
	for _, cfg := range []engine.Config{{Shards: 2}, {LockedIndex: true}} {
		e := newEngine(t, cfg)
		_, err := e.FindMatches(context.Background(), content, nil)
		require.ErrorIs(t, err, engine.ErrQueryTooLong)
		require.False(t, errors.Is(err, engine.ErrInvalidEvent) || engine.IsRejection(err), "a query is not an event: %v", err)
		_, err = e.FindMatches(context.Background(), content[:n-1], nil)
		require.NoError(t, err, "MaxDepth-1 blocks is the longest query")
		require.Zero(t, e.Stats().RejectedInvalid)
	}
}
