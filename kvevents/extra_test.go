package kvevents

import (
	"bytes"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kvindex/kvindex/hash"
	"github.com/kvindex/kvindex/internal/cbor"
)

// storedExtra is a positional BlockStored of two 2-token blocks with lora_name and the
// given extra_keys field (already encoded).
func storedExtra(lora string, extra mp) mp {
	m := mp{}.Arr(9).Str("BlockStored").Uints(1, 2).Nil().Tokens([]uint32{7, 7, 7, 7}).Uint(2).Nil().Str("GPU")
	if lora == "" {
		m = m.Nil()
	} else {
		m = m.Str(lora)
	}
	return m.Add(extra)
}

func decodeOne(t *testing.T, ev mp) Event {
	t.Helper()
	d := mustNew(t, Config{})
	var b Batch
	require.NoError(t, d.Decode(batch(0, ev), &b))
	require.Zero(t, b.RejectedCount, "%v", b.Rejected)
	require.Len(t, b.Events, 1)
	return b.Events[0]
}

// Two images behind the same placeholder tokens: other content hashes on the blocks they
// cover, the plain hash on the others.
func TestExtraKeysImages(t *testing.T) {
	plain := hash.Content([]uint32{7, 7})
	a := decodeOne(t, storedExtra("", mp{}.Arr(2).Arr(1).Str("img-a").Nil()))
	b := decodeOne(t, storedExtra("", mp{}.Arr(2).Arr(1).Str("img-b").Nil()))
	none := decodeOne(t, storedExtra("", mp{}.Arr(2).Nil().Nil()))
	keyA := cbor.AppendText(cbor.AppendArray(nil, 1), "img-a")
	require.Equal(t, []uint64{hash.ContentExtra([]uint32{7, 7}, keyA), plain}, a.Contents)
	require.NotEqual(t, a.Contents[0], b.Contents[0])
	require.Equal(t, []uint64{plain, plain}, none.Contents)
	require.False(t, none.ExtraKeys)
	require.Nil(t, none.BlockExtras)
	require.Equal(t, [][]byte{keyA, nil}, a.BlockExtras)
}

// The LoRA name is the namespace, not part of the content: a LoRA-only entry hashes as
// plain tokens, and a LoRA + image entry as the image alone; BlockExtras keeps the whole
// entry (what vLLM hashed).
func TestExtraKeysLoRA(t *testing.T) {
	plain := hash.Content([]uint32{7, 7})
	lora := decodeOne(t, storedExtra("sql", mp{}.Arr(2).Arr(1).Str("sql").Arr(1).Str("sql")))
	require.Equal(t, "lora=sql", lora.Namespace)
	require.Equal(t, []uint64{plain, plain}, lora.Contents)
	require.Equal(t, cbor.AppendText(cbor.AppendArray(nil, 1), "sql"), lora.BlockExtras[0])

	both := decodeOne(t, storedExtra("sql", mp{}.Arr(2).Arr(2).Str("sql").Str("img-a").Arr(1).Str("sql")))
	alone := decodeOne(t, storedExtra("", mp{}.Arr(2).Arr(1).Str("img-a").Nil()))
	require.Equal(t, alone.Contents, both.Contents)
	// A first element that is not the event's LoRA name stays in the key.
	other := decodeOne(t, storedExtra("", mp{}.Arr(2).Arr(2).Str("sql").Str("img-a").Nil()))
	require.NotEqual(t, alone.Contents[0], other.Contents[0])
}

// Floats and maps are not reproduced in CBOR: the entry is opaque, still distinct per
// value, with no BlockExtras.
func TestExtraKeysOpaque(t *testing.T) {
	x := decodeOne(t, storedExtra("", mp{}.Arr(2).Arr(1).F64(0.5).Nil()))
	y := decodeOne(t, storedExtra("", mp{}.Arr(2).Arr(1).F64(0.25).Nil()))
	require.NotEqual(t, x.Contents[0], y.Contents[0])
	require.NotEqual(t, hash.Content([]uint32{7, 7}), x.Contents[0])
	require.Len(t, x.BlockExtras, 2)
	require.True(t, x.BlockExtras[0] != nil && len(x.BlockExtras[0]) == 0, "opaque entry: empty, not nil")
	require.Nil(t, x.BlockExtras[1])
}

// An extra_keys list not aligned with the blocks cannot be attributed: rejected.
func TestExtraKeysMisaligned(t *testing.T) {
	d := mustNew(t, Config{})
	var b Batch
	for _, extra := range []mp{mp{}.Arr(1).Arr(1).Str("img"), mp{}.Str("img"), mp{}.Arr(2).Str("img").Nil()} {
		require.NoError(t, d.Decode(batch(0, storedExtra("", extra)), &b))
		require.Empty(t, b.Events)
		require.Equal(t, 1, b.RejectedCount)
		require.Equal(t, ReasonMalformedField, b.Rejected[0].Reason, "%v", b.Rejected[0])
	}
}

func TestBlockSizeMismatchRecorded(t *testing.T) {
	d := mustNew(t, Config{BlockSize: 4})
	var b Batch
	require.NoError(t, d.Decode(batch(0, storedExtra("", mp{}.Nil())), &b))
	require.Equal(t, ReasonBlockSizeMismatch, b.Rejected[0].Reason)
	require.Equal(t, 2, b.Rejected[0].BlockSize)
}

// Verbatim keeps 32-byte bin block hashes (and the parent's) whole; int hashes, or a
// list whose digests differ in length, leave Digests nil.
func TestVerbatimDigests(t *testing.T) {
	dg := func(b byte) []byte { return bytes.Repeat([]byte{b}, 32) }
	bins := mp{}.Arr(8).Str("BlockStored").Arr(2).Bin(dg(1)).Bin(dg(2)).Bin(dg(9)).
		Tokens(make([]uint32, 32)).Uint(16).Nil().Str("GPU").Nil()
	ints := mp{}.Arr(8).Str("BlockStored").Uints(1, 2).Nil().
		Tokens(make([]uint32, 32)).Uint(16).Nil().Str("GPU").Nil()
	mixed := mp{}.Arr(8).Str("BlockStored").Arr(2).Bin(dg(1)).Bin(dg(2)[:16]).Nil().
		Tokens(make([]uint32, 32)).Uint(16).Nil().Str("GPU").Nil()
	d := mustNew(t, Config{BlockSize: 16, Verbatim: true})
	var b Batch
	require.NoError(t, d.Decode(batch(0, bins, ints, mixed), &b))
	require.Len(t, b.Events, 3, "%v", b.Rejected)
	e := b.Events[0]
	require.Equal(t, 32, e.DigestSize)
	require.Equal(t, append(dg(1), dg(2)...), e.Digests)
	require.Equal(t, dg(9), e.ParentDigest)
	require.Len(t, e.Tokens, 32)
	for _, e := range b.Events[1:] {
		require.Nil(t, e.Digests)
		require.Nil(t, e.ParentDigest)
		require.Len(t, e.Tokens, 32)
	}
}
