package kvevents

import (
	"errors"
	"math"
	"runtime"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kvindex/kvindex/hash"
	"github.com/kvindex/kvindex/internal/cbor"
)

// removedWith is a positional BlockRemoved whose block_hashes array holds the raw
// encoded values given.
func removedWith(raws ...string) mp {
	m := mp{}.Arr(2).Str("BlockRemoved").Arr(len(raws))
	for _, r := range raws {
		m = m.Raw(r)
	}
	return m
}

var cleared = mp{}.Arr(1).Str("AllBlocksCleared")

func TestBlockHashWidths(t *testing.T) {
	bin32 := "c5 0020 " + strings.Repeat("ee", 24) + "0102030405060708"
	cases := []struct {
		name string
		raw  string
		want uint64
		ok   bool
	}{
		{"fixint 0", "00", 0, true},
		{"fixint 127", "7f", 127, true},
		{"uint8", "cc ff", 255, true},
		{"uint16", "cd 0100", 256, true},
		{"uint32", "ce 00010000", 65536, true},
		{"uint64 max", "cf ffffffffffffffff", math.MaxUint64, true},
		{"uint64 H0", "cf 8899aabbccddeeff", h0, true},
		{"uint8 in wide form", "cf 0000000000000005", 5, true},
		{"negative fixint -1", "ff", math.MaxUint64, true},
		{"negative fixint -32", "e0", 0xffffffffffffffe0, true},
		{"int8 -128", "d0 80", 0xffffffffffffff80, true},
		{"int8 positive", "d0 05", 5, true},
		{"int16 -32768", "d1 8000", 0xffffffffffff8000, true},
		{"int32 min", "d2 80000000", 0xffffffff80000000, true},
		{"int64 min", "d3 8000000000000000", 0x8000000000000000, true},
		{"int64 -2", "d3 fffffffffffffffe", 0xfffffffffffffffe, true},
		{"int64 positive", "d3 0102030405060708", h1, true},
		{"bin empty", "c4 00", 0, true},
		{"bin 1 byte left-padded", "c4 01 ab", 0xab, true},
		{"bin 3 bytes left-padded (bin32 header)", "c6 00000003 010203", 0x010203, true},
		{"bin 8 bytes", "c4 08 0102030405060708", h1, true},
		{"bin 9 bytes keeps last 8", "c4 09 ff0102030405060708", h1, true},
		{"bin16 32 bytes keeps last 8", bin32, h1, true},
		{"str is not a hash", "a3 414243", 0, false},
		{"nil", "c0", 0, false},
		{"float64", "cb 3ff0000000000000", 0, false},
		{"float32", "ca 3f800000", 0, false},
		{"bool", "c3", 0, false},
		{"array", "91 01", 0, false},
		{"map", "80", 0, false},
		{"ext", "d4 01 02", 0, false},
	}
	d := mustNew(t, Config{})
	var b Batch
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			// As a block hash of a removal and as the parent of an empty store.
			store := mp{}.Arr(5).Str("BlockStored").Arr(0).Raw(c.raw).Arr(0).Uint(4)
			require.NoError(t, d.Decode(batch(0, removedWith(c.raw), store, cleared), &b))
			if c.raw == "c0" { // nil: no hash, but a legal "no parent"
				require.Equal(t, 1, b.RejectedCount)
				require.Equal(t, 1, b.RejectedDrops, "the rejected event is a removal")
				require.Contains(t, b.Rejected[0].Error(), "block_hashes[0] is nil")
				require.Len(t, b.Events, 2)
				require.False(t, b.Events[0].HasParent)
				return
			}
			if !c.ok {
				require.Equal(t, 2, b.RejectedCount)
				require.Equal(t, 1, b.RejectedDrops, "one removal and one store rejected")
				require.Len(t, b.Events, 1)
				require.Equal(t, Cleared, b.Events[0].Kind)
				for _, r := range b.Rejected {
					require.Equal(t, ReasonMalformedField, r.Reason, r.Error())
				}
				require.Contains(t, b.Rejected[0].Error(), "block_hashes[0]")
				require.Contains(t, b.Rejected[1].Error(), "parent_block_hash")
				return
			}
			require.Zero(t, b.RejectedCount, "%v", b.Rejected)
			require.Len(t, b.Events, 3)
			require.Equal(t, []uint64{c.want}, b.Events[0].Seqs)
			require.True(t, b.Events[1].HasParent)
			require.Equal(t, c.want, b.Events[1].Parent)
			require.Empty(t, b.Events[1].Seqs)
		})
	}
}

func TestTokenWidths(t *testing.T) {
	toks := []uint32{0, 127, 128, 255, 256, 65535, 65536, math.MaxUint32}
	ev := mp{}.Arr(5).Str("BlockStored").Uints(1, 2, 3, 4).Nil().Tokens(toks).Uint(2)
	d := mustNew(t, Config{})
	var b Batch
	require.NoError(t, d.Decode(batch(0, ev), &b))
	require.Len(t, b.Events, 1)
	require.Equal(t, must(hash.Blocks(nil, toks, 2)), b.Events[0].Contents)
	require.False(t, b.Events[0].HasParent)

	// Signed encodings of non-negative ids are ids too; negative and > 2^32-1 are not.
	ev = mp{}.Arr(5).Str("BlockStored").Uints(1).Nil().Arr(2).Raw("d0 05").Raw("d3 00000000ffffffff").Uint(2)
	require.NoError(t, d.Decode(batch(0, ev), &b))
	require.Equal(t, []uint64{hash.Content([]uint32{5, math.MaxUint32})}, b.Events[0].Contents)
	for _, bad := range []string{"ff", "d0 80", "cf 0000000100000000", "c0", "a1 31", "cb 3ff0000000000000"} {
		ev = mp{}.Arr(5).Str("BlockStored").Uints(1).Nil().Arr(2).Uint(1).Raw(bad).Uint(2)
		require.NoError(t, d.Decode(batch(0, ev), &b))
		require.Equal(t, 1, b.RejectedCount, bad)
		require.Zero(t, b.RejectedDrops, "a rejected store drops nothing")
		require.Equal(t, ReasonMalformedField, b.Rejected[0].Reason)
		require.Contains(t, b.Rejected[0].Detail, "token_ids[1]")
	}
}

// A batch mixing positional and map events of every kind, with unknown event types in
// both encodings, decodes in wire order.
func TestMixedArrayAndMapEvents(t *testing.T) {
	a1 := goldenPayload(t, "A1")[11:85]
	b1 := goldenPayload(t, "B1")[11:226]
	a2 := goldenPayload(t, "A2")[11:39]
	b2 := goldenPayload(t, "B2")[11:75]
	a3 := goldenPayload(t, "A3")[11:29]
	b3 := goldenPayload(t, "B3")[11:34]
	unknownArr := mp{}.Arr(3).Str("BlockPinned").Uints(1, 2).Map(1).Str("x").Arr(1).Arr(0)
	unknownMap := mp{}.Map(2).Str("blocks").Uints(9).Str("type").Str("SnapshotMarker")
	p := batch(7, mp(a1), mp(b2), unknownArr, mp(b1), mp(a3), unknownMap, mp(a2), mp(b3))

	d := mustNew(t, Config{BlockSize: 4})
	var b Batch
	require.NoError(t, d.Decode(p, &b))
	require.Equal(t, 2, b.UnknownTypes)
	require.Zero(t, b.RejectedCount)
	require.Equal(t, 7, b.DPRank)
	kinds := []Kind{}
	for _, e := range b.Events {
		kinds = append(kinds, e.Kind)
		require.True(t, e.HasDPRank)
		require.Equal(t, 7, e.DPRank)
	}
	require.Equal(t, []Kind{Stored, Removed, Stored, Cleared, Removed, Cleared}, kinds)
	for _, i := range []int{0, 2} {
		require.Equal(t, []uint64{h0, h1}, b.Events[i].Seqs)
		require.Equal(t, []uint64{c0, c1}, b.Events[i].Contents)
		require.Equal(t, parentP, b.Events[i].Parent)
	}
	require.Equal(t, "full_attention", b.Events[2].SpecKind)

	st := d.Stats()
	require.Equal(t, Stats{Batches: 1, Events: 6, Stored: 2, Removed: 2, Cleared: 2, UnknownTypes: 2}, st)
}

func TestUnknownFieldsIgnored(t *testing.T) {
	deep := mp{}.Arr(1).Arr(1).Arr(1).Map(1).Uint(1).Arr(2).Bin([]byte{1, 2}).Raw("d6 05 00000000")
	ev := mp{}.Map(12).
		Str("session_id").Str("s-1").
		Raw("07").Add(deep).                     // non-string key
		Bin([]byte("type")).Str("BlockRemoved"). // a bin key is not "type"
		Str("kv_cache_spec_sliding_window").Uint(128).
		Str("block_mm_infos").Arr(2).Nil().Map(1).Str("mm_hash").Str(strings.Repeat("ab", 32)).
		Str("source_kind").Nil().
		Str("block_hashes").Uints(h0, h1).
		Str("ownership").Raw("c7 03 01 aabbcc").
		Str("token_ids").Tokens(goldenTokens).
		Str("type").Str("BlockStored"). // "type" need not come first
		Str("block_size").Uint(4).
		Str("event_version").Raw("ca 3f800000")
	longPositional := mp{}.Arr(15).Str("BlockStored").Uints(h0, h1).Uint(parentP).Tokens(goldenTokens).Uint(4).
		Nil().Str("GPU").Nil().Arr(2).Nil().Nil().Uint(1).Str("sliding_window").Uint(1024).
		Str("LOCAL").Add(deep).Uint(99)
	d := mustNew(t, Config{})
	var b Batch
	require.NoError(t, d.Decode(batch(0, ev, longPositional), &b))
	require.Zero(t, b.RejectedCount, "%v", b.Rejected)
	require.Len(t, b.Events, 2)
	e := b.Events[0]
	require.Equal(t, Stored, e.Kind)
	require.Equal(t, []uint64{h0, h1}, e.Seqs)
	require.Equal(t, []uint64{c0, c1}, e.Contents)
	require.False(t, e.HasParent)
	require.Equal(t, "", e.Namespace)
	e = b.Events[1]
	require.Equal(t, []uint64{c0, c1}, e.Contents)
	require.Equal(t, 1, e.GroupIdx)
	require.Equal(t, "sliding_window", e.SpecKind)
	require.Equal(t, "", e.Locality, "position 12 is not a positional field")
}

func TestOptionalFields(t *testing.T) {
	ev := mp{}.Map(10).Str("type").Str("BlockStored").Str("block_hashes").Uints(1).
		Str("parent_block_hash").Nil().Str("token_ids").Tokens(goldenTokens[:4]).Str("block_size").Uint(4).
		Str("medium").Str("CPU").Str("group_idx").Uint(2).Str("kv_cache_spec_kind").Str("mla_attention").
		Str("locality").Str("REMOTE").Str("extra_keys").Arr(1).Arr(1).Arr(2).Str(strings.Repeat("f", 64)).Uint(7)
	rm := mp{}.Map(5).Str("type").Str("BlockRemoved").Str("block_hashes").Uints(1).Str("medium").Uint(2).
		Str("group_idx").Raw("d2 80000000").Str("locality").Str("LOCAL")
	d := mustNew(t, Config{})
	var b Batch
	require.NoError(t, d.Decode(batch(-1, ev, rm), &b))
	require.Zero(t, b.RejectedCount, "%v", b.Rejected)
	// The block's extra keys, [(mm_hash, 7)], are part of its content hash (extra.go).
	key := cbor.AppendArray(nil, 1)
	key = cbor.AppendArray(key, 2)
	key = cbor.AppendUint(cbor.AppendText(key, strings.Repeat("f", 64)), 7)
	require.Equal(t, Event{
		Kind: Stored, Seqs: []uint64{1}, Contents: []uint64{hash.ContentExtra(goldenTokens[:4], key)}, BlockSize: 4, Medium: "CPU",
		GroupIdx: 2, HasGroupIdx: true, SpecKind: "mla_attention", Locality: "REMOTE", ExtraKeys: true,
		DPRank: -1, HasDPRank: true, BlockExtras: [][]byte{key},
	}, b.Events[0])
	require.NotEqual(t, c0, b.Events[0].Contents[0])
	require.Equal(t, Event{
		Kind: Removed, Seqs: []uint64{1}, Medium: "2", GroupIdx: math.MinInt32, HasGroupIdx: true,
		Locality: "LOCAL", DPRank: -1, HasDPRank: true,
	}, b.Events[1])
}

// SGLang: 7-element positional stores (tag + 6, medium last), BlockStoredWithMetadata
// with a metadata map in slot 7, and the later map encoding with cache_salt.
func TestSGLang(t *testing.T) {
	plain := mp{}.Arr(7).Str("BlockStored").Uints(11).Uint(10).Tokens([]uint32{42}).Uint(1).Nil().Str("CPU_TIER1")
	salted := mp{}.Arr(8).Str("BlockStoredWithMetadata").Uints(12).Uint(11).Tokens([]uint32{43}).Uint(1).Nil().
		Str("GPU").Map(2).Str("other").Arr(1).Uint(1).Str("cache_salt").Str("tenant-a")
	mapped := mp{}.Map(9).Str("type").Str("BlockStored").Str("block_hashes").Uints(13).Str("parent_block_hash").Uint(12).
		Str("token_ids").Tokens([]uint32{44}).Str("block_size").Uint(1).Str("lora_id").Nil().Str("medium").Str("GPU").
		Str("cache_salt").Str("tenant-a").Str("session_id").Str("sess-9")
	removed := mp{}.Arr(3).Str("BlockRemoved").Uints(11).Str("CPU_TIER1")
	d := mustNew(t, Config{BlockSize: 1})
	var b Batch
	require.NoError(t, d.Decode(batch(3, plain, salted, mapped, removed), &b))
	require.Zero(t, b.RejectedCount, "%v", b.Rejected)
	require.Len(t, b.Events, 4)
	require.Equal(t, 3, b.DPRank)
	require.Equal(t, []string{"", "salt=tenant-a", "salt=tenant-a", ""},
		[]string{b.Events[0].Namespace, b.Events[1].Namespace, b.Events[2].Namespace, b.Events[3].Namespace})
	require.Equal(t, "CPU_TIER1", b.Events[0].Medium)
	require.Equal(t, []uint64{hash.Content([]uint32{43})}, b.Events[1].Contents)
	require.Equal(t, uint64(12), b.Events[2].Parent)
	for _, e := range b.Events {
		require.Equal(t, 3, e.DPRank)
	}
}

func TestNamespace(t *testing.T) {
	store := func(loraID, loraName, salt mp) mp {
		m := mp{}.Map(4).Str("type").Str("BlockStored").Str("block_hashes").Arr(0).Str("token_ids").Arr(0).
			Str("block_size").Uint(16)
		n := 4
		for _, kv := range []struct {
			k string
			v mp
		}{{"lora_id", loraID}, {"lora_name", loraName}, {"cache_salt", salt}} {
			if kv.v != nil {
				m = m.Str(kv.k).Add(kv.v)
				n++
			}
		}
		m[0] = 0x80 | byte(n)
		return m
	}
	s := func(v string) mp { return mp{}.Str(v) }
	nilv := mp{}.Nil()
	cases := []struct {
		name string
		ev   mp
		want string
	}{
		{"none", store(nil, nil, nil), ""},
		{"all nil", store(nilv, nilv, nilv), ""},
		{"empty strings count as absent", store(nil, s(""), s("")), ""},
		{"lora name", store(nil, s("sql-adapter"), nil), "lora=sql-adapter"},
		{"lora id without name", store(mp{}.Uint(7), nilv, nil), "lora_id=7"},
		{"lora id zero", store(mp{}.Uint(0), nil, nil), "lora_id=0"},
		{"negative lora id", store(mp{}.Int(-3), nil, nil), "lora_id=-3"},
		{"name wins over id", store(mp{}.Uint(7), s("sql"), nil), "lora=sql"},
		{"salt", store(nil, nil, s("tenant-1")), "salt=tenant-1"},
		{"name and salt", store(nil, s("sql"), s("t1")), "lora=sql;salt=t1"},
		{"id and salt", store(mp{}.Uint(9), nil, s("t1")), "lora_id=9;salt=t1"},
		{"escaping", store(nil, s("a;b%c\n=é"), s("x;salt=y")), "lora=a%3Bb%25c%0A=é;salt=x%3Bsalt=y"},
		{"long name (str8)", store(nil, s(strings.Repeat("n", 40)), nil), "lora=" + strings.Repeat("n", 40)},
		{"metadata map in lora_name slot", mp{}.Arr(8).Str("BlockStored").Arr(0).Nil().Arr(0).Uint(16).Uint(5).Nil().
			Map(1).Str("cache_salt").Str("s1"), "lora_id=5;salt=s1"},
		{"metadata map with nil salt", mp{}.Arr(8).Str("BlockStoredWithMetadata").Arr(0).Nil().Arr(0).Uint(16).Nil().Nil().
			Map(2).Raw("01").Str("x").Str("cache_salt").Nil(), ""},
	}
	d := mustNew(t, Config{})
	var b Batch
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			require.NoError(t, d.Decode(batch(0, c.ev), &b))
			require.Zero(t, b.RejectedCount, "%v", b.Rejected)
			require.Len(t, b.Events, 1)
			require.Equal(t, c.want, b.Events[0].Namespace)
		})
	}
	// Namespace, which routers use for queries, agrees with the decoder on every case
	// above that a name and a salt can express.
	for _, c := range []struct{ name, salt, want string }{
		{"", "", ""},
		{"sql-adapter", "", "lora=sql-adapter"},
		{"", "tenant-1", "salt=tenant-1"},
		{"sql", "t1", "lora=sql;salt=t1"},
		{"a;b%c\n=é", "x;salt=y", "lora=a%3Bb%25c%0A=é;salt=x%3Bsalt=y"},
	} {
		require.Equal(t, c.want, Namespace(c.name, c.salt), "%q %q", c.name, c.salt)
	}
	// Distinct inputs that a naive join would confuse stay distinct.
	require.NoError(t, d.Decode(batch(0, store(nil, s("a;salt=b"), nil), store(nil, s("a"), s("b"))), &b))
	require.NotEqual(t, b.Events[0].Namespace, b.Events[1].Namespace)
}

// Each bad event is rejected with its reason; the valid events around it survive.
func TestRejectedEvents(t *testing.T) {
	okStore := func(hashes []uint64, tokens []uint32, bs uint64) mp {
		return mp{}.Arr(5).Str("BlockStored").Uints(hashes...).Nil().Tokens(tokens).Uint(bs)
	}
	cases := []struct {
		name   string
		cfg    Config
		ev     mp
		reason Reason
		detail string
	}{
		{"event is an int", Config{}, mp{}.Uint(5), ReasonMalformedEvent, "event is int"},
		{"event is a str", Config{}, mp{}.Str("BlockStored"), ReasonMalformedEvent, "want array or map"},
		{"empty array", Config{}, mp{}.Arr(0), ReasonMalformedEvent, "empty event array"},
		{"array tag is an int", Config{}, mp{}.Arr(2).Uint(1).Uints(1), ReasonMalformedEvent, "element 0"},
		{"map without type", Config{}, mp{}.Map(1).Str("block_hashes").Uints(1), ReasonMalformedEvent, `no "type"`},
		{"map type is nil", Config{}, mp{}.Map(1).Str("type").Nil(), ReasonMalformedEvent, `"type" is nil`},
		{"duplicate key", Config{}, mp{}.Map(3).Str("type").Str("BlockRemoved").Str("block_hashes").Uints(1).
			Str("block_hashes").Uints(2), ReasonDuplicateField, "block_hashes"},
		{"duplicate type", Config{}, mp{}.Map(2).Str("type").Str("BlockRemoved").Str("type").Str("AllBlocksCleared"),
			ReasonDuplicateField, "type"},
		{"removed without hashes (array)", Config{}, mp{}.Arr(1).Str("BlockRemoved"), ReasonMissingField, "block_hashes"},
		{"removed without hashes (map)", Config{}, mp{}.Map(1).Str("type").Str("BlockRemoved"), ReasonMissingField, "block_hashes"},
		{"stored too short", Config{}, mp{}.Arr(3).Str("BlockStored").Uints(1).Nil(), ReasonMissingField, "token_ids"},
		{"stored map without block_size", Config{}, mp{}.Map(3).Str("type").Str("BlockStored").Str("block_hashes").Uints(1).
			Str("token_ids").Tokens([]uint32{1}), ReasonMissingField, "block_size"},
		{"hashes not an array", Config{}, mp{}.Arr(2).Str("BlockRemoved").Uint(1), ReasonMalformedField, "block_hashes is int"},
		{"hashes nil", Config{}, mp{}.Arr(2).Str("BlockRemoved").Nil(), ReasonMalformedField, "block_hashes is nil"},
		{"token_ids nil", Config{}, mp{}.Arr(5).Str("BlockStored").Uints(1).Nil().Nil().Uint(1), ReasonMalformedField, "token_ids is nil"},
		{"block_size 0", Config{}, okStore(nil, nil, 0), ReasonBadBlockSize, ""},
		{"block_size too big", Config{}, okStore(nil, nil, hash.MaxBlockSize+1), ReasonBadBlockSize, ""},
		{"block_size negative", Config{}, mp{}.Arr(5).Str("BlockStored").Arr(0).Nil().Arr(0).Int(-4), ReasonBadBlockSize, ""},
		{"block_size huge", Config{}, mp{}.Arr(5).Str("BlockStored").Arr(0).Nil().Arr(0).Raw("cf ffffffffffffffff"), ReasonBadBlockSize, ""},
		{"block_size str", Config{}, mp{}.Arr(5).Str("BlockStored").Arr(0).Nil().Arr(0).Str("4"), ReasonMalformedField, "block_size is str"},
		{"block_size nil", Config{}, mp{}.Arr(5).Str("BlockStored").Arr(0).Nil().Arr(0).Nil(), ReasonMalformedField, "block_size is nil"},
		{"block size mismatch", Config{BlockSize: 16}, okStore([]uint64{1, 2}, goldenTokens, 4), ReasonBlockSizeMismatch, "want 16"},
		{"too few tokens", Config{}, okStore([]uint64{1, 2}, goldenTokens[:7], 4), ReasonTokenCountMismatch, "len(token_ids) = 7"},
		{"partial last block", Config{}, okStore([]uint64{1, 2}, append(goldenTokens[:8:8], 5), 4), ReasonTokenCountMismatch, ""},
		{"tokens without hashes", Config{}, okStore(nil, goldenTokens[:4], 4), ReasonTokenCountMismatch, ""},
		{"too many hashes", Config{Limits: Limits{MaxBlocksPerEvent: 1}}, okStore([]uint64{1, 2}, goldenTokens, 4), ReasonLimit, "block_hashes"},
		{"too many removed hashes", Config{Limits: Limits{MaxBlocksPerEvent: 1}}, removedWith("01", "02"), ReasonLimit, "block_hashes"},
		{"too many tokens", Config{Limits: Limits{MaxTokensPerEvent: 7}}, okStore([]uint64{1, 2}, goldenTokens, 4), ReasonLimit, "token_ids"},
		{"lora_name int", Config{}, mp{}.Arr(8).Str("BlockStored").Arr(0).Nil().Arr(0).Uint(4).Nil().Nil().Uint(3),
			ReasonMalformedField, "lora_name is int"},
		{"lora_id str", Config{}, mp{}.Arr(6).Str("BlockStored").Arr(0).Nil().Arr(0).Uint(4).Str("7"), ReasonMalformedField, "lora_id is str"},
		{"cache_salt int", Config{}, mp{}.Map(5).Str("type").Str("BlockStored").Str("block_hashes").Arr(0).
			Str("token_ids").Arr(0).Str("block_size").Uint(4).Str("cache_salt").Uint(1), ReasonMalformedField, "cache_salt is int"},
		{"metadata salt bin", Config{}, mp{}.Arr(8).Str("BlockStoredWithMetadata").Arr(0).Nil().Arr(0).Uint(4).Nil().Nil().
			Map(1).Str("cache_salt").Bin([]byte("x")), ReasonMalformedField, "cache_salt is bin"},
		{"medium bool", Config{}, mp{}.Arr(3).Str("BlockRemoved").Uints(1).Raw("c2"), ReasonMalformedField, "medium is bool"},
		{"group_idx str", Config{}, mp{}.Arr(4).Str("BlockRemoved").Uints(1).Nil().Str("0"), ReasonMalformedField, "group_idx"},
		{"group_idx over int32", Config{}, mp{}.Arr(4).Str("BlockRemoved").Uints(1).Nil().Uint(1 << 31), ReasonMalformedField, "group_idx"},
		{"locality int", Config{}, mp{}.Map(3).Str("type").Str("BlockRemoved").Str("block_hashes").Uints(1).
			Str("locality").Uint(1), ReasonMalformedField, "locality is int"},
		{"spec kind int", Config{}, mp{}.Arr(11).Str("BlockStored").Arr(0).Nil().Arr(0).Uint(4).Nil().Nil().Nil().Nil().Nil().Uint(1),
			ReasonMalformedField, "kv_cache_spec_kind is int"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			d := mustNew(t, c.cfg)
			var b Batch
			good := okStore([]uint64{h0, h1}, goldenTokens, 4)
			if c.cfg != (Config{}) {
				good = cleared
			}
			require.NoError(t, d.Decode(batch(0, cleared, c.ev, good), &b))
			require.Equal(t, 1, b.RejectedCount)
			require.Len(t, b.Rejected, 1)
			r := b.Rejected[0]
			require.Equal(t, 1, r.Index)
			require.Equal(t, c.reason, r.Reason, r.Error())
			require.Contains(t, r.Error(), c.detail)
			require.Contains(t, r.Error(), c.reason.String())
			require.Len(t, b.Events, 2, "the events around the rejected one survive")
			require.Empty(t, b.Events[0].Seqs)
			if c.cfg == (Config{}) {
				require.Equal(t, []uint64{h0, h1}, b.Events[1].Seqs, "arena rolled back")
				require.Equal(t, []uint64{c0, c1}, b.Events[1].Contents)
			}
			st := d.Stats()
			require.Equal(t, uint64(1), st.Rejected[c.reason])
			require.Equal(t, uint64(1), st.RejectedTotal())
		})
	}
}

func TestRejectedRecordedUpToCap(t *testing.T) {
	evs := make([]mp, 100)
	for i := range evs {
		evs[i] = mp{}.Arr(0)
	}
	d := mustNew(t, Config{})
	var b Batch
	require.NoError(t, d.Decode(batch(0, evs...), &b))
	require.Equal(t, 100, b.RejectedCount)
	require.Len(t, b.Rejected, MaxRecordedRejections)
	require.Equal(t, MaxRecordedRejections-1, b.Rejected[MaxRecordedRejections-1].Index)
	require.Equal(t, uint64(100), d.Stats().Rejected[ReasonMalformedEvent])
}

func TestBatchShapes(t *testing.T) {
	ev := mp(goldenPayload(t, "A3")[11:29]) // A3's event
	cases := []struct {
		name    string
		payload []byte
		ts      float64
		rank    int
		hasRank bool
	}{
		{"3 elements", mp{}.Arr(3).F64(2.5).Arr(1).Add(ev).Uint(5), 2.5, 5, true},
		{"2 elements (old vLLM)", mp{}.Arr(2).F64(2.5).Arr(1).Add(ev), 2.5, 0, false},
		{"nil rank", mp{}.Arr(3).F64(2.5).Arr(1).Add(ev).Nil(), 2.5, 0, false},
		{"4th element ignored (unmerged publisher_id)", mp{}.Arr(4).F64(2.5).Arr(1).Add(ev).Uint(1).Bin(make([]byte, 16)), 2.5, 1, true},
		{"float32 ts", mp{}.Arr(3).Raw("ca 40200000").Arr(1).Add(ev).Uint(0), 2.5, 0, true},
		{"int ts", mp{}.Arr(3).Uint(1750000000).Arr(1).Add(ev).Uint(0), 1750000000, 0, true},
		{"negative rank", mp{}.Arr(3).F64(1).Arr(1).Add(ev).Int(-1), 1, -1, true},
		{"int32 max rank", mp{}.Arr(3).F64(1).Arr(1).Add(ev).Uint(math.MaxInt32), 1, math.MaxInt32, true},
		{"array16 headers", mp{}.Raw("dc 0003").F64(1).Raw("dc 0001").Add(ev).Uint(0), 1, 0, true},
		{"array32 headers", mp{}.Raw("dd 00000003").F64(1).Raw("dd 00000001").Add(ev).Uint(0), 1, 0, true},
	}
	d := mustNew(t, Config{})
	var b Batch
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			require.NoError(t, d.Decode(c.payload, &b))
			require.Equal(t, c.ts, b.Timestamp)
			require.Equal(t, c.rank, b.DPRank)
			require.Equal(t, c.hasRank, b.HasDPRank)
			require.Len(t, b.Events, 1)
			require.Equal(t, Event{Kind: Cleared, DPRank: c.rank, HasDPRank: c.hasRank}, b.Events[0])
		})
	}
	// map16 event header (msgspec keeps the width when a struct has >= 15 fields).
	require.NoError(t, d.Decode(batch(0, mp{}.Raw("de 0001").Str("type").Str("AllBlocksCleared")), &b))
	require.Len(t, b.Events, 1)
}

func TestBadPayloads(t *testing.T) {
	ev := mp(goldenPayload(t, "A3")[11:29])
	deep := func(n int) mp {
		m := mp{}
		for i := 0; i < n; i++ {
			m = m.Arr(1)
		}
		return m.Nil()
	}
	cases := []struct {
		name    string
		lim     Limits
		payload []byte
		want    error
		detail  string
	}{
		{"empty", Limits{}, nil, ErrTruncated, ""},
		{"invalid byte", Limits{}, []byte{0xc1}, ErrMalformed, "0xc1"},
		{"map batch", Limits{}, mp{}.Map(2).Str("ts").F64(1).Str("events").Arr(0), ErrMalformed, "batch is map"},
		{"nil batch", Limits{}, mp{}.Nil(), ErrMalformed, "batch is nil"},
		{"one element", Limits{}, mp{}.Arr(1).F64(1), ErrMalformed, "1 elements"},
		{"ts str", Limits{}, mp{}.Arr(2).Str("1").Arr(0), ErrMalformed, "ts is str"},
		{"ts nil", Limits{}, mp{}.Arr(2).Nil().Arr(0), ErrMalformed, "ts is nil"},
		{"events nil", Limits{}, mp{}.Arr(2).F64(1).Nil(), ErrMalformed, "events is nil"},
		{"events map", Limits{}, mp{}.Arr(2).F64(1).Map(0), ErrMalformed, "events is map"},
		{"rank str", Limits{}, mp{}.Arr(3).F64(1).Arr(0).Str("0"), ErrMalformed, "data_parallel_rank is str"},
		{"rank over int32", Limits{}, mp{}.Arr(3).F64(1).Arr(0).Uint(1 << 40), ErrMalformed, "out of range"},
		{"trailing byte", Limits{}, append(batch(0, ev), 0), ErrMalformed, "1 trailing bytes"},
		{"second batch appended", Limits{}, append(batch(0, ev), batch(0, ev)...), ErrMalformed, "trailing"},
		{"array32 of 2^32-1 elements", Limits{}, mp{}.Raw("dd ffffffff").F64(1), ErrTruncated, ""},
		{"events array32 of 2^32-1", Limits{}, mp{}.Arr(3).F64(1).Raw("dd ffffffff").Add(ev), ErrTruncated, "events"},
		{"hashes array32 of 2^32-1", Limits{}, batch(0, mp{}.Arr(2).Str("BlockRemoved").Raw("dd ffffffff 01")), ErrTruncated, ""},
		{"map32 of 2^32-1 pairs", Limits{}, batch(0, mp{}.Raw("df ffffffff").Str("type")), ErrTruncated, ""},
		{"str32 of 4 GiB", Limits{}, batch(0, mp{}.Arr(1).Raw("db ffffffff 41")), ErrTruncated, ""},
		{"bin32 of 4 GiB in a skipped field", Limits{}, batch(0, mp{}.Arr(3).Str("X").Raw("c6 ffffffff 41").Nil()), ErrTruncated, ""},
		{"ext32 of 4 GiB", Limits{}, batch(0, mp{}.Arr(2).Str("X").Raw("c9 ffffffff 01 41")), ErrTruncated, ""},
		{"0xc1 inside a skipped field", Limits{}, batch(0, mp{}.Arr(2).Str("X").Raw("91 c1")), ErrMalformed, "0xc1"},
		{"payload over limit", Limits{MaxPayloadBytes: 30}, batch(0, ev, ev), ErrLimit, "payload is 48 bytes, limit 30"},
		{"events over limit", Limits{MaxEvents: 2}, batch(0, ev, ev, ev), ErrLimit, "3 events"},
		{"nesting over default depth", Limits{}, batch(0, mp{}.Arr(2).Str("BlockX").Add(deep(40))), ErrLimit, "nesting too deep"},
		{"nesting over depth in a map key", Limits{MaxDepth: 4}, batch(0, mp{}.Map(1).Add(deep(2)).Nil()), ErrLimit, ""},
		{"nesting over depth in extra_keys", Limits{MaxDepth: 5}, batch(0, mp{}.Map(2).Str("type").Str("AllBlocksCleared").
			Str("extra_keys").Add(deep(3))), ErrLimit, ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			d := mustNew(t, Config{Limits: c.lim})
			b := Batch{}
			// A previous good decode must not leak into a failed one.
			require.NoError(t, d.Decode(batch(0, ev), &b))
			var before runtime.MemStats
			runtime.ReadMemStats(&before)
			err := d.Decode(c.payload, &b)
			var after runtime.MemStats
			runtime.ReadMemStats(&after)
			require.ErrorIs(t, err, c.want)
			require.Contains(t, err.Error(), c.detail)
			require.Empty(t, b.Events)
			require.Zero(t, b.Timestamp)
			require.False(t, b.HasDPRank)
			require.Less(t, after.TotalAlloc-before.TotalAlloc, uint64(64<<10), "a hostile header must not size an allocation")
			st := d.Stats()
			require.Equal(t, uint64(1), st.BadBatches)
			require.Equal(t, uint64(1), st.Batches)
		})
	}
	// The same deep value passes with a larger MaxDepth.
	d := mustNew(t, Config{Limits: Limits{MaxDepth: 64}})
	var b Batch
	require.NoError(t, d.Decode(batch(0, mp{}.Arr(2).Str("BlockX").Add(deep(40))), &b))
	require.Equal(t, 1, b.UnknownTypes)
}

func TestConfigValidation(t *testing.T) {
	for _, cfg := range []Config{
		{BlockSize: -1},
		{BlockSize: hash.MaxBlockSize + 1},
		{Limits: Limits{MaxPayloadBytes: -1}},
		{Limits: Limits{MaxEvents: -1}},
		{Limits: Limits{MaxBlocksPerEvent: -1}},
		{Limits: Limits{MaxTokensPerEvent: -1}},
		{Limits: Limits{MaxDepth: 3}},
		{Limits: Limits{MaxDepth: 1025}},
	} {
		_, err := New(cfg)
		require.ErrorIs(t, err, ErrConfig, "%+v", cfg)
		require.True(t, strings.HasPrefix(err.Error(), "kvevents: "), err.Error())
	}
	d, err := New(Config{BlockSize: 16, Limits: Limits{MaxDepth: 4}})
	require.NoError(t, err)
	require.Equal(t, DefaultMaxEvents, d.cfg.Limits.MaxEvents)

	// The zero Decoder works with the zero Config.
	var zero Decoder
	var b Batch
	require.NoError(t, zero.Decode(goldenPayload(t, "A1"), &b))
	require.Len(t, b.Events, 1)
	require.Error(t, zero.Decode(goldenPayload(t, "A1"), nil))
}

// Events decoded into one Batch stay intact while another Batch is decoded; the slices
// of a Batch are capped, so appending to one never overwrites the next.
func TestBatchOwnership(t *testing.T) {
	d := mustNew(t, Config{})
	var b1, b2 Batch
	require.NoError(t, d.Decode(goldenPayload(t, "A1"), &b1))
	require.NoError(t, d.Decode(batch(0, removedWith("01", "02", "03")), &b2))
	require.Equal(t, []uint64{h0, h1}, b1.Events[0].Seqs)
	require.Equal(t, []uint64{1, 2, 3}, b2.Events[0].Seqs)

	two := batch(0, removedWith("01"), removedWith("02"))
	require.NoError(t, d.Decode(two, &b1))
	require.Equal(t, []uint64{1}, b1.Events[0].Seqs)
	// Appending to one event's seqs must not write into the next event's: the decoder
	// clips each slice's capacity.
	_ = append(b1.Events[0].Seqs, 99)
	require.Equal(t, []uint64{2}, b1.Events[1].Seqs)
}

func TestKindAndReasonStrings(t *testing.T) {
	require.Equal(t, "stored", Stored.String())
	require.Equal(t, "removed", Removed.String())
	require.Equal(t, "cleared", Cleared.String())
	require.Equal(t, "Kind(0)", Kind(0).String())
	require.Equal(t, "token count mismatch", ReasonTokenCountMismatch.String())
	require.Equal(t, "Reason(200)", Reason(200).String())
	for r := Reason(0); r < NumReasons; r++ {
		require.NotEmpty(t, reasonNames[r])
	}
	e := EventError{Index: 3, Type: "BlockStored", Reason: ReasonLimit, Detail: "x"}
	require.Equal(t, `kvevents: event 3 ("BlockStored"): limit exceeded: x`, e.Error())
	var err error = e
	require.True(t, errors.As(err, &EventError{}))
}

// TestRejectedDropsPastTheRecordedRejections: more rejected stores than Rejected records
// are still known to be stores, and a rejected removal among them still counts.
func TestRejectedDropsPastTheRecordedRejections(t *testing.T) {
	d := mustNew(t, Config{})
	var b Batch
	bad := mp{}.Arr(5).Str("BlockStored").Uints(1).Nil().Arr(1).Raw("ff").Uint(2) // token -1
	evs := make([]mp, 0, 2*MaxRecordedRejections+1)
	for range 2 * MaxRecordedRejections {
		evs = append(evs, bad)
	}
	require.NoError(t, d.Decode(batch(0, evs...), &b))
	require.Equal(t, 2*MaxRecordedRejections, b.RejectedCount)
	require.Len(t, b.Rejected, MaxRecordedRejections)
	require.Zero(t, b.RejectedDrops)
	require.NoError(t, d.Decode(batch(0, append(evs, removedWith("c0"))...), &b))
	require.Equal(t, 1, b.RejectedDrops)
}

// vLLM's offloading connector names the blocks it copied to CPU or storage by engine hash
// only: BlockStored(block_hashes, parent_block_hash=None, token_ids=[], block_size, medium).
// With HashOnly they decode as hash-only stores, whatever their block size; without it
// they stay rejected as before.
func TestHashOnlyStores(t *testing.T) {
	offload := mp{}.Arr(8).Str("BlockStored").Uints(7, 8).Nil().Arr(0).Uint(64).Nil().Str("CPU").Nil()
	withParent := mp{}.Arr(8).Str("BlockStored").Uints(9).Uint(8).Arr(0).Uint(16).Nil().Str("CPU").Nil()
	empty := mp{}.Arr(8).Str("BlockStored").Arr(0).Nil().Arr(0).Uint(32).Nil().Str("CPU").Nil()
	full := mp{}.Arr(8).Str("BlockStored").Uints(1).Nil().Tokens(make([]uint32, 16)).Uint(16).Nil().Str("GPU").Nil()

	var b Batch
	old := mustNew(t, Config{BlockSize: 16})
	require.NoError(t, old.Decode(batch(0, offload, withParent, full), &b))
	require.Len(t, b.Events, 1)
	require.Equal(t, 2, b.RejectedCount)
	require.Equal(t, ReasonBlockSizeMismatch, b.Rejected[0].Reason)
	require.Equal(t, ReasonTokenCountMismatch, b.Rejected[1].Reason)

	d := mustNew(t, Config{BlockSize: 16, HashOnly: true, Verbatim: true})
	require.NoError(t, d.Decode(batch(0, offload, withParent, empty, full), &b))
	// The empty store of block size 32 is still a block-size mismatch: it names no block.
	require.Equal(t, 1, b.RejectedCount, "%v", b.Rejected)
	require.Equal(t, ReasonBlockSizeMismatch, b.Rejected[0].Reason)
	require.Len(t, b.Events, 3)
	e := b.Events[0]
	require.True(t, e.HashOnly)
	require.Equal(t, []uint64{7, 8}, e.Seqs)
	require.Empty(t, e.Contents)
	require.Empty(t, e.Tokens)
	require.False(t, e.HasParent)
	require.Equal(t, 64, e.BlockSize)
	require.Equal(t, "CPU", e.Medium)
	require.True(t, b.Events[1].HashOnly)
	require.True(t, b.Events[1].HasParent) // the decoder reports it; the consumer decides
	require.False(t, b.Events[2].HashOnly)
	require.Len(t, b.Events[2].Contents, 1)
}

// TestUnits: with Config.Units a store of a group whose blocks span several units (a
// hybrid model's Mamba group of 16 tokens beside full attention of 4) is accepted and
// each block carries its units' content hashes; a size that is not a multiple of the
// unit, and extra keys on a block of several units, are rejected. The sliding window
// of a store decodes from its array slot [11] and its map key.
func TestUnits(t *testing.T) {
	tok := make([]uint32, 32)
	for i := range tok {
		tok[i] = uint32(1000 + i)
	}
	arr := func(bs int, n int) mp { // a 12-slot store of n blocks of bs tokens, group 1
		return mp{}.Arr(12).Str("BlockStored").Uints(seqs(n)...).Nil().Tokens(tok[:n*bs]).Uint(uint64(bs)).Nil().Str("GPU").Nil().Nil().
			Uint(1).Str("sliding_window").Uint(48)
	}
	d := mustNew(t, Config{BlockSize: 4, Units: true})
	var b Batch
	require.NoError(t, d.Decode(batch(-1, arr(16, 2), arr(4, 3), arr(6, 1)), &b))
	require.Equal(t, 1, b.RejectedCount, "block size 6 is no multiple of 4")
	require.Equal(t, ReasonBlockSizeMismatch, b.Rejected[0].Reason)
	require.Len(t, b.Events, 2)
	var want []uint64
	for i := 0; i < 32; i += 4 {
		want = append(want, hash.Content(tok[i:i+4]))
	}
	got := b.Events[0]
	require.Equal(t, want, got.Contents, "8 units of the two 16-token blocks")
	require.Equal(t, 16, got.BlockSize)
	require.True(t, got.HasSlidingWindow)
	require.Equal(t, 48, got.SlidingWindow)
	require.Equal(t, "sliding_window", got.SpecKind)
	require.Equal(t, want[:3], b.Events[1].Contents, "blocks of the unit: one content each")

	// Without Units the larger block is a mismatch, as before; Units needs a unit.
	plain := mustNew(t, Config{BlockSize: 4})
	require.NoError(t, plain.Decode(batch(-1, arr(16, 2)), &b))
	require.Equal(t, 1, b.RejectedCount)
	_, err := New(Config{Units: true})
	require.ErrorIs(t, err, ErrConfig)

	// Extra keys name a block, not its units.
	keyed := mp{}.Map(7).Str("type").Str("BlockStored").Str("block_hashes").Uints(1).Str("parent_block_hash").Nil().
		Str("token_ids").Tokens(tok[:8]).Str("block_size").Uint(8).Str("extra_keys").Arr(1).Arr(1).Str("salt").
		Str("kv_cache_spec_sliding_window").Nil()
	require.NoError(t, d.Decode(batch(-1, keyed), &b))
	require.Equal(t, 1, b.RejectedCount)
	require.Contains(t, b.Rejected[0].Detail, "extra keys on blocks of 2 units")
}

func seqs(n int) []uint64 {
	out := make([]uint64, n)
	for i := range out {
		out[i] = uint64(i + 1)
	}
	return out
}
