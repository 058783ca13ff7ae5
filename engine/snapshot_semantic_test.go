package engine_test

import (
	"encoding/binary"
	"hash/crc32"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kvindex/kvindex/engine"
)

// snapEntry is one (worker, block) entry of a hand-built snapshot.
type snapEntry struct {
	seq, prefix, parent uint64
	pos, ns             uint32
}

type snapWorker struct {
	name    string
	cursor  uint64
	entries []snapEntry
}

// buildSnapshot writes snapshot version 1 (engine/snapshot.go) by hand, with a valid
// checksum, so that a test can state content WriteSnapshot would never produce.
func buildSnapshot(namespaces []string, workers []snapWorker) []byte {
	le := binary.LittleEndian
	b := []byte("KVIXSNAP")
	b = le.AppendUint32(b, 1)
	str := func(s string) { b = le.AppendUint32(b, uint32(len(s))); b = append(b, s...) }
	b = le.AppendUint32(b, uint32(len(namespaces)))
	for _, n := range namespaces {
		str(n)
	}
	b = le.AppendUint32(b, uint32(len(workers)))
	for _, w := range workers {
		str(w.name)
		b = le.AppendUint64(b, w.cursor)
		b = le.AppendUint64(b, uint64(len(w.entries)))
		for _, e := range w.entries {
			b = le.AppendUint64(b, e.seq)
			b = le.AppendUint64(b, e.prefix)
			b = le.AppendUint64(b, e.parent)
			b = le.AppendUint32(b, e.pos)
			b = le.AppendUint32(b, e.ns)
		}
	}
	return le.AppendUint32(b, crc32.Checksum(b, crc32.MakeTable(crc32.Castagnoli)))
}

// TestRestoreRejectsInconsistentSnapshot: a snapshot with a valid checksum whose
// content contradicts itself (it would not write back to the same bytes) is refused
// with a clear error.
func TestRestoreRejectsInconsistentSnapshot(t *testing.T) {
	good := []snapWorker{{name: "w", cursor: 9, entries: []snapEntry{{seq: 1, prefix: 10}, {seq: 2, prefix: 11, parent: 10, pos: 1}}}}
	e, err := engine.RestoreBytes(engine.Config{Shards: 1}, buildSnapshot(nil, good))
	require.NoError(t, err)
	e.Close()
	for _, tc := range []struct {
		name       string
		namespaces []string
		workers    []snapWorker
		want       string
	}{
		{"duplicate namespace", []string{"a", "a"}, good, `namespace "a" duplicated`},
		{"namespaces out of order", []string{"b", "a"}, good, "out of order"},
		{"duplicate worker", nil, []snapWorker{good[0], good[0]}, "worker names"},
		{"root with a parent", nil, []snapWorker{{name: "w", entries: []snapEntry{{seq: 1, prefix: 10, parent: 5}}}}, "root block (seq 1) with a parent"},
		{"two parents", nil, []snapWorker{{name: "w", entries: []snapEntry{
			{seq: 1, prefix: 10}, {seq: 2, prefix: 20},
			{seq: 3, prefix: 11, parent: 10, pos: 1}, {seq: 4, prefix: 11, parent: 20, pos: 1},
		}}}, "held with two parents"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := engine.RestoreBytes(engine.Config{Shards: 1}, buildSnapshot(tc.namespaces, tc.workers))
			require.ErrorIs(t, err, engine.ErrSnapshot)
			require.True(t, strings.Contains(err.Error(), tc.want), "error %q lacks %q", err, tc.want)
		})
	}
}
