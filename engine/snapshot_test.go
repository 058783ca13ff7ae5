package engine_test

import (
	"bytes"
	"encoding/binary"
	"hash/crc32"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"

	"github.com/kvindex/kvindex/engine"
	"github.com/kvindex/kvindex/internal/oplog"
	"github.com/kvindex/kvindex/internal/refmodel"
	"github.com/kvindex/kvindex/internal/replay"
	"github.com/stretchr/testify/require"
)

// TestSnapshotRoundTrip snapshots an engine in the middle of a random history, restores
// it, and drives the rest of the history into the restored engine and the reference
// model: every later query must agree, and a snapshot of the restored engine must be the
// same bytes. Odd seeds use SPEC's prefix chain, even ones the keyed chain; the restoring
// configuration asks for the other one, and the restored engine keeps the snapshot's.
func TestSnapshotRoundTrip(t *testing.T) {
	for seed := uint64(1); seed <= 4; seed++ {
		ops := refmodel.RandomOps(rand.New(rand.NewPCG(seed, 5)), 3000, refmodel.RandomOptions{MaxChain: 120})
		cut := len(ops) / 2
		spec := seed%2 == 1
		e := newEngine(t, engine.Config{Shards: 2, JumpSize: 4, SpecChain: spec})
		m := refmodel.New()
		for i := range ops[:cut] {
			if ops[i].Kind != oplog.Query {
				_ = m.Apply(&ops[i])
				ev := replay.Event(&ops[i])
				ev.Cursor = uint64(i + 1)
				_ = e.Apply(&ev)
			}
		}
		var snap bytes.Buffer
		require.NoError(t, e.WriteSnapshot(&snap))

		r, err := engine.Restore(engine.Config{Shards: 3, JumpSize: 64, SpecChain: !spec}, bytes.NewReader(snap.Bytes()), 0)
		require.NoError(t, err)
		t.Cleanup(func() { r.Close() })
		require.Equal(t, spec, r.Config().SpecChain)
		var again bytes.Buffer
		require.NoError(t, r.WriteSnapshot(&again))
		require.Equal(t, snap.Bytes(), again.Bytes(), "a restored engine snapshots to the same bytes")
		require.Equal(t, e.Cursors(), r.Cursors())
		require.Equal(t, e.Stats().Blocks, r.Stats().Blocks)

		var got []engine.Match
		for i := cut; i < len(ops); i++ {
			op := &ops[i]
			if op.Kind != oplog.Query {
				werr := m.Apply(op)
				checkRejection(t, i, werr, applyOp(r, op))
				continue
			}
			require.NoError(t, r.Barrier(ctx))
			got, err = r.FindMatches(ctx, op.Content, got[:0])
			require.NoError(t, err)
			want := m.Query(op.Content)
			require.Equal(t, len(want), len(got), "op %d", i)
			for j := range want {
				require.Equal(t, want[j], refmodel.Answer(got[j]), "op %d", i)
			}
		}
	}
}

func TestSnapshotRefusesDamage(t *testing.T) {
	e := newEngine(t, engine.Config{Shards: 1})
	require.NoError(t, e.Store("a", []engine.Block{{Content: 1, Seq: 1}, {Content: 2, Seq: 2}}))
	require.NoError(t, e.Apply(&engine.Event{Kind: engine.EventStored, Worker: "b", Namespace: "lora=x", Blocks: []engine.Block{{Content: 1, Seq: 9}}, Cursor: 7}))
	var snap bytes.Buffer
	require.NoError(t, e.WriteSnapshot(&snap))
	good := snap.Bytes()
	for n := 0; n < len(good); n++ {
		_, err := engine.Restore(engine.Config{Shards: 1}, bytes.NewReader(good[:n]), 0)
		require.ErrorIs(t, err, engine.ErrSnapshot, "truncated to %d bytes", n)
	}
	for i := range good {
		bad := bytes.Clone(good)
		bad[i] ^= 0x40
		_, err := engine.Restore(engine.Config{Shards: 1}, bytes.NewReader(bad), 0)
		require.ErrorIs(t, err, engine.ErrSnapshot, "byte %d flipped", i)
	}
	_, err := engine.Restore(engine.Config{Shards: 1}, bytes.NewReader(good), int64(len(good)-1))
	require.ErrorIs(t, err, engine.ErrSnapshot)
	r, err := engine.Restore(engine.Config{Shards: 1}, bytes.NewReader(good), int64(len(good)))
	require.NoError(t, err)
	require.Equal(t, map[string]uint64{"a": 0, "b": 7}, r.Cursors())
	got, err := r.FindMatchesIn(ctx, "lora=x", []uint64{1}, nil)
	require.NoError(t, err)
	require.Equal(t, []engine.Match{{Worker: "b", Score: 1, Size: 1, Tiers: [3]int{1, 1, 1}}}, got)
	require.NoError(t, r.Close())
}

// TestSnapshotOlderVersions: a version 4 snapshot (no marks), a version 3 one (no
// groups fields either) and a version 2 one (no chain field either: SPEC's chain) are
// restored, the engine keeps SPEC's chain, answers as before and snapshots as version 5
// with the spec chain; an unknown chain is refused.
func TestSnapshotOlderVersions(t *testing.T) {
	e := newEngine(t, engine.Config{Shards: 2, SpecChain: true})
	require.NoError(t, e.Store("a", []engine.Block{{Content: 1, Seq: 1}, {Content: 2, Seq: 2}, {Content: 3, Seq: 3}}))
	require.NoError(t, e.Store("b", []engine.Block{{Content: 1, Seq: 5}, {Content: 2, Seq: 6}}))
	require.NoError(t, e.StoreUnder("b", 6, []engine.Block{{Content: 4, Seq: 4}}))
	require.NoError(t, e.Barrier(ctx)) // the answers compared below are e's at rest
	var snap bytes.Buffer
	require.NoError(t, e.WriteSnapshot(&snap))
	v5 := snap.Bytes()
	require.Equal(t, uint32(5), binary.LittleEndian.Uint32(v5[8:]))
	require.Equal(t, uint32(0), binary.LittleEndian.Uint32(v5[12:]), "the spec chain's field")

	reseal := func(body []byte) []byte {
		return binary.LittleEndian.AppendUint32(body, crc32.Checksum(body, crc32.MakeTable(crc32.Castagnoli)))
	}
	v4 := reseal(downgrade(t, v5[:len(v5)-4], 4))
	v3 := reseal(downgrade(t, v5[:len(v5)-4], 3))
	v2 := append(bytes.Clone(v3[:8]), 2, 0, 0, 0)
	v2 = reseal(append(v2, v3[16:len(v3)-4]...))
	for name, old := range map[string][]byte{"v4": v4, "v3": v3, "v2": v2} {
		r, err := engine.RestoreBytes(engine.Config{Shards: 1}, old)
		require.NoError(t, err, name)
		t.Cleanup(func() { r.Close() })
		require.True(t, r.Config().SpecChain)
		for _, q := range [][]uint64{{1, 2, 3}, {1, 2, 4}, {1, 9}} {
			want, err := e.FindMatches(ctx, q, nil)
			require.NoError(t, err)
			got, err := r.FindMatches(ctx, q, nil)
			require.NoError(t, err)
			require.Equal(t, want, got, "%s: query %v", name, q)
		}
		var again bytes.Buffer
		require.NoError(t, r.WriteSnapshot(&again))
		require.Equal(t, v5, again.Bytes(), name)
	}

	bad := bytes.Clone(v5[:len(v5)-4])
	binary.LittleEndian.PutUint32(bad[12:], 2)
	_, err := engine.RestoreBytes(engine.Config{Shards: 1}, reseal(bad))
	require.ErrorIs(t, err, engine.ErrSnapshot)
	require.ErrorContains(t, err, "unknown prefix chain 2")
}

// downgrade turns the body (checksum stripped) of a version 5 snapshot of workers
// without groups and with marks 0, with SPEC's chain, into a version-v body: without
// the marks (version 4), and without the groups fields too (version 3).
func downgrade(t *testing.T, body []byte, v uint32) []byte {
	le := binary.LittleEndian
	out := bytes.Clone(body[:16]) // magic, version, chain
	le.PutUint32(out[8:], v)
	b := body[16:]
	take := func(n int) []byte { x := b[:n]; b = b[n:]; return x }
	str := func() []byte { n := le.Uint32(b); return take(4 + int(n)) }
	ns := take(4)
	out = append(out, ns...)
	for i := uint32(0); i < le.Uint32(ns); i++ {
		out = append(out, str()...)
	}
	nw := take(4)
	out = append(out, nw...)
	for i := uint32(0); i < le.Uint32(nw); i++ {
		out = append(out, str()...)
		out = append(out, take(8)...)                             // cursor
		require.Equal(t, uint64(0), le.Uint64(take(8)), "mark 0") // the mark
		for tier := 0; tier < 3; tier++ {
			cnt := take(8)
			out = append(out, cnt...)
			out = append(out, take(32*int(le.Uint64(cnt)))...)
		}
		groups := take(4)
		require.Equal(t, uint32(0), le.Uint32(groups), "a worker without groups")
		if v >= 4 {
			out = append(out, groups...)
		}
	}
	require.Empty(t, b)
	return out
}

func TestSnapshotFileIsAtomic(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "index.snap")
	e := newEngine(t, engine.Config{Shards: 2})
	require.NoError(t, e.Store("a", []engine.Block{{Content: 1, Seq: 1}}))
	require.NoError(t, e.WriteSnapshotFile(path))
	require.NoError(t, e.Store("a", []engine.Block{{Content: 2, Seq: 2}}))
	require.NoError(t, e.WriteSnapshotFile(path))
	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	require.Len(t, entries, 1, "no temporary file is left behind")
	f, err := os.Open(path)
	require.NoError(t, err)
	defer f.Close()
	r, err := engine.Restore(engine.Config{}, f, 0)
	require.NoError(t, err)
	defer r.Close()
	require.Equal(t, int64(2), r.Stats().Blocks)
}

// FuzzRestore feeds Restore bodies with a valid checksum, so the fuzzer reaches the
// parser: whatever it accepts must snapshot again to bytes that restore to the same bytes.
func FuzzRestore(f *testing.F) {
	for _, spec := range []bool{false, true} { // a keyed chain's snapshot and SPEC's
		e, _ := engine.New(engine.Config{Shards: 1, SpecChain: spec})
		_ = e.Store("a", []engine.Block{{Content: 1, Seq: 1}, {Content: 2, Seq: 2}})
		_ = e.Apply(&engine.Event{Kind: engine.EventStored, Worker: "b", Namespace: "n", Blocks: []engine.Block{{Content: 1, Seq: 3}}})
		_ = e.Apply(&engine.Event{Kind: engine.EventCopied, Worker: "a", Tier: engine.TierHost, Seqs: []uint64{2}})
		_ = e.Apply(&engine.Event{Kind: engine.EventStored, Worker: "a", Tier: engine.TierDisk, Parent: 2, HasParent: true, Blocks: []engine.Block{{Content: 3, Seq: 4}}})
		// A hybrid worker: a window group and a Mamba group spanning two units.
		_ = e.Apply(&engine.Event{Kind: engine.EventGroups, Worker: "h", Unit: 16, Groups: []engine.Group{
			{Kind: engine.GroupFull, BlockSize: 16}, {Kind: engine.GroupSlidingWindow, BlockSize: 16, Window: 20}, {Kind: engine.GroupMamba, BlockSize: 32}}})
		_ = e.Apply(&engine.Event{Kind: engine.EventStored, Worker: "h", Blocks: []engine.Block{{Content: 1, Seq: 1}, {Content: 2, Seq: 2}}})
		_ = e.Apply(&engine.Event{Kind: engine.EventStored, Worker: "h", Group: 1, Namespace: "n", Blocks: []engine.Block{{Content: 1, Seq: 1}}})
		_ = e.Apply(&engine.Event{Kind: engine.EventStored, Worker: "h", Group: 2, Blocks: []engine.Block{{Seq: 7}}, Contents: []uint64{1, 2}})
		var snap bytes.Buffer
		_ = e.WriteSnapshot(&snap)
		e.Close()
		f.Add(snap.Bytes()[:snap.Len()-4])
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		b := binary.LittleEndian.AppendUint32(bytes.Clone(body), crc32.Checksum(body, crc32.MakeTable(crc32.Castagnoli)))
		r, err := engine.Restore(engine.Config{Shards: 2}, bytes.NewReader(b), 1<<20)
		if err != nil {
			require.ErrorIs(t, err, engine.ErrSnapshot)
			return
		}
		defer r.Close()
		var a, c bytes.Buffer
		require.NoError(t, r.WriteSnapshot(&a))
		r2, err := engine.Restore(engine.Config{Shards: 1}, bytes.NewReader(a.Bytes()), 0)
		require.NoError(t, err)
		defer r2.Close()
		require.NoError(t, r2.WriteSnapshot(&c))
		require.Equal(t, a.Bytes(), c.Bytes())
	})
}
