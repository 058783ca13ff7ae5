package kvevents

import (
	"errors"
	"math"
	"runtime"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kvindex/kvindex/hash"
)

// removedWith is a positional BlockRemoved whose block_hashes array holds the raw
// encoded values given.
func removedWith(raws ...string) mp {
	m := mp{}.arr(2).str("BlockRemoved").arr(len(raws))
	for _, r := range raws {
		m = m.raw(r)
	}
	return m
}

var cleared = mp{}.arr(1).str("AllBlocksCleared")

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
			store := mp{}.arr(5).str("BlockStored").arr(0).raw(c.raw).arr(0).uint(4)
			require.NoError(t, d.Decode(batch(0, removedWith(c.raw), store, cleared), &b))
			if c.raw == "c0" { // nil: no hash, but a legal "no parent"
				require.Equal(t, 1, b.RejectedCount)
				require.Contains(t, b.Rejected[0].Error(), "block_hashes[0] is nil")
				require.Len(t, b.Events, 2)
				require.False(t, b.Events[0].HasParent)
				return
			}
			if !c.ok {
				require.Equal(t, 2, b.RejectedCount)
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
	ev := mp{}.arr(5).str("BlockStored").uints(1, 2, 3, 4).nil_().tokens(toks).uint(2)
	d := mustNew(t, Config{})
	var b Batch
	require.NoError(t, d.Decode(batch(0, ev), &b))
	require.Len(t, b.Events, 1)
	require.Equal(t, must(hash.Blocks(nil, toks, 2)), b.Events[0].Contents)
	require.False(t, b.Events[0].HasParent)

	// Signed encodings of non-negative ids are ids too; negative and > 2^32-1 are not.
	ev = mp{}.arr(5).str("BlockStored").uints(1).nil_().arr(2).raw("d0 05").raw("d3 00000000ffffffff").uint(2)
	require.NoError(t, d.Decode(batch(0, ev), &b))
	require.Equal(t, []uint64{hash.Content([]uint32{5, math.MaxUint32})}, b.Events[0].Contents)
	for _, bad := range []string{"ff", "d0 80", "cf 0000000100000000", "c0", "a1 31", "cb 3ff0000000000000"} {
		ev = mp{}.arr(5).str("BlockStored").uints(1).nil_().arr(2).uint(1).raw(bad).uint(2)
		require.NoError(t, d.Decode(batch(0, ev), &b))
		require.Equal(t, 1, b.RejectedCount, bad)
		require.Equal(t, ReasonMalformedField, b.Rejected[0].Reason)
		require.Contains(t, b.Rejected[0].Detail, "token_ids[1]")
	}
}

// A batch mixing positional and map events of every kind, with unknown event types in
// both encodings, decodes in wire order.
func TestMixedArrayAndMapEvents(t *testing.T) {
	a1 := unhex(goldenVectors[0].hex)[11:85]
	b1 := unhex(goldenVectors[7].hex)[11:226]
	a2 := unhex(goldenVectors[1].hex)[11:39]
	b2 := unhex(goldenVectors[8].hex)[11:75]
	a3 := unhex(goldenVectors[2].hex)[11:29]
	b3 := unhex(goldenVectors[9].hex)[11:34]
	unknownArr := mp{}.arr(3).str("BlockPinned").uints(1, 2).obj(1).str("x").arr(1).arr(0)
	unknownMap := mp{}.obj(2).str("blocks").uints(9).str("type").str("SnapshotMarker")
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
	deep := mp{}.arr(1).arr(1).arr(1).obj(1).uint(1).arr(2).bin([]byte{1, 2}).raw("d6 05 00000000")
	ev := mp{}.obj(12).
		str("session_id").str("s-1").
		raw("07").add(deep).                     // non-string key
		bin([]byte("type")).str("BlockRemoved"). // a bin key is not "type"
		str("kv_cache_spec_sliding_window").uint(128).
		str("block_mm_infos").arr(2).nil_().obj(1).str("mm_hash").str(strings.Repeat("ab", 32)).
		str("source_kind").nil_().
		str("block_hashes").uints(h0, h1).
		str("ownership").raw("c7 03 01 aabbcc").
		str("token_ids").tokens(goldenTokens).
		str("type").str("BlockStored"). // "type" need not come first
		str("block_size").uint(4).
		str("event_version").raw("ca 3f800000")
	longPositional := mp{}.arr(15).str("BlockStored").uints(h0, h1).uint(parentP).tokens(goldenTokens).uint(4).
		nil_().str("GPU").nil_().arr(2).nil_().nil_().uint(1).str("sliding_window").uint(1024).
		str("LOCAL").add(deep).uint(99)
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
	ev := mp{}.obj(10).str("type").str("BlockStored").str("block_hashes").uints(1).
		str("parent_block_hash").nil_().str("token_ids").tokens(goldenTokens[:4]).str("block_size").uint(4).
		str("medium").str("CPU").str("group_idx").uint(2).str("kv_cache_spec_kind").str("mla_attention").
		str("locality").str("REMOTE").str("extra_keys").arr(1).arr(1).arr(2).str(strings.Repeat("f", 64)).uint(7)
	rm := mp{}.obj(5).str("type").str("BlockRemoved").str("block_hashes").uints(1).str("medium").uint(2).
		str("group_idx").raw("d2 80000000").str("locality").str("LOCAL")
	d := mustNew(t, Config{})
	var b Batch
	require.NoError(t, d.Decode(batch(-1, ev, rm), &b))
	require.Zero(t, b.RejectedCount, "%v", b.Rejected)
	require.Equal(t, Event{
		Kind: Stored, Seqs: []uint64{1}, Contents: []uint64{c0}, BlockSize: 4, Medium: "CPU",
		GroupIdx: 2, HasGroupIdx: true, SpecKind: "mla_attention", Locality: "REMOTE", ExtraKeys: true,
		DPRank: -1, HasDPRank: true,
	}, b.Events[0])
	require.Equal(t, Event{
		Kind: Removed, Seqs: []uint64{1}, Medium: "2", GroupIdx: math.MinInt32, HasGroupIdx: true,
		Locality: "LOCAL", DPRank: -1, HasDPRank: true,
	}, b.Events[1])
}

// SGLang: 7-element positional stores (tag + 6, medium last), BlockStoredWithMetadata
// with a metadata map in slot 7, and the later map encoding with cache_salt.
func TestSGLang(t *testing.T) {
	plain := mp{}.arr(7).str("BlockStored").uints(11).uint(10).tokens([]uint32{42}).uint(1).nil_().str("CPU_TIER1")
	salted := mp{}.arr(8).str("BlockStoredWithMetadata").uints(12).uint(11).tokens([]uint32{43}).uint(1).nil_().
		str("GPU").obj(2).str("other").arr(1).uint(1).str("cache_salt").str("tenant-a")
	mapped := mp{}.obj(9).str("type").str("BlockStored").str("block_hashes").uints(13).str("parent_block_hash").uint(12).
		str("token_ids").tokens([]uint32{44}).str("block_size").uint(1).str("lora_id").nil_().str("medium").str("GPU").
		str("cache_salt").str("tenant-a").str("session_id").str("sess-9")
	removed := mp{}.arr(3).str("BlockRemoved").uints(11).str("CPU_TIER1")
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
		m := mp{}.obj(4).str("type").str("BlockStored").str("block_hashes").arr(0).str("token_ids").arr(0).
			str("block_size").uint(16)
		n := 4
		for _, kv := range []struct {
			k string
			v mp
		}{{"lora_id", loraID}, {"lora_name", loraName}, {"cache_salt", salt}} {
			if kv.v != nil {
				m = m.str(kv.k).add(kv.v)
				n++
			}
		}
		m[0] = 0x80 | byte(n)
		return m
	}
	s := func(v string) mp { return mp{}.str(v) }
	nilv := mp{}.nil_()
	cases := []struct {
		name string
		ev   mp
		want string
	}{
		{"none", store(nil, nil, nil), ""},
		{"all nil", store(nilv, nilv, nilv), ""},
		{"empty strings count as absent", store(nil, s(""), s("")), ""},
		{"lora name", store(nil, s("sql-adapter"), nil), "lora=sql-adapter"},
		{"lora id without name", store(mp{}.uint(7), nilv, nil), "lora_id=7"},
		{"lora id zero", store(mp{}.uint(0), nil, nil), "lora_id=0"},
		{"negative lora id", store(mp{}.int(-3), nil, nil), "lora_id=-3"},
		{"name wins over id", store(mp{}.uint(7), s("sql"), nil), "lora=sql"},
		{"salt", store(nil, nil, s("tenant-1")), "salt=tenant-1"},
		{"name and salt", store(nil, s("sql"), s("t1")), "lora=sql;salt=t1"},
		{"id and salt", store(mp{}.uint(9), nil, s("t1")), "lora_id=9;salt=t1"},
		{"escaping", store(nil, s("a;b%c\n=é"), s("x;salt=y")), "lora=a%3Bb%25c%0A=é;salt=x%3Bsalt=y"},
		{"long name (str8)", store(nil, s(strings.Repeat("n", 40)), nil), "lora=" + strings.Repeat("n", 40)},
		{"metadata map in lora_name slot", mp{}.arr(8).str("BlockStored").arr(0).nil_().arr(0).uint(16).uint(5).nil_().
			obj(1).str("cache_salt").str("s1"), "lora_id=5;salt=s1"},
		{"metadata map with nil salt", mp{}.arr(8).str("BlockStoredWithMetadata").arr(0).nil_().arr(0).uint(16).nil_().nil_().
			obj(2).raw("01").str("x").str("cache_salt").nil_(), ""},
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
	// Distinct inputs that a naive join would confuse stay distinct.
	require.NoError(t, d.Decode(batch(0, store(nil, s("a;salt=b"), nil), store(nil, s("a"), s("b"))), &b))
	require.NotEqual(t, b.Events[0].Namespace, b.Events[1].Namespace)
}

// Each bad event is rejected with its reason; the valid events around it survive.
func TestRejectedEvents(t *testing.T) {
	okStore := func(hashes []uint64, tokens []uint32, bs uint64) mp {
		return mp{}.arr(5).str("BlockStored").uints(hashes...).nil_().tokens(tokens).uint(bs)
	}
	cases := []struct {
		name   string
		cfg    Config
		ev     mp
		reason Reason
		detail string
	}{
		{"event is an int", Config{}, mp{}.uint(5), ReasonMalformedEvent, "event is int"},
		{"event is a str", Config{}, mp{}.str("BlockStored"), ReasonMalformedEvent, "want array or map"},
		{"empty array", Config{}, mp{}.arr(0), ReasonMalformedEvent, "empty event array"},
		{"array tag is an int", Config{}, mp{}.arr(2).uint(1).uints(1), ReasonMalformedEvent, "element 0"},
		{"map without type", Config{}, mp{}.obj(1).str("block_hashes").uints(1), ReasonMalformedEvent, `no "type"`},
		{"map type is nil", Config{}, mp{}.obj(1).str("type").nil_(), ReasonMalformedEvent, `"type" is nil`},
		{"duplicate key", Config{}, mp{}.obj(3).str("type").str("BlockRemoved").str("block_hashes").uints(1).
			str("block_hashes").uints(2), ReasonDuplicateField, "block_hashes"},
		{"duplicate type", Config{}, mp{}.obj(2).str("type").str("BlockRemoved").str("type").str("AllBlocksCleared"),
			ReasonDuplicateField, "type"},
		{"removed without hashes (array)", Config{}, mp{}.arr(1).str("BlockRemoved"), ReasonMissingField, "block_hashes"},
		{"removed without hashes (map)", Config{}, mp{}.obj(1).str("type").str("BlockRemoved"), ReasonMissingField, "block_hashes"},
		{"stored too short", Config{}, mp{}.arr(3).str("BlockStored").uints(1).nil_(), ReasonMissingField, "token_ids"},
		{"stored map without block_size", Config{}, mp{}.obj(3).str("type").str("BlockStored").str("block_hashes").uints(1).
			str("token_ids").tokens([]uint32{1}), ReasonMissingField, "block_size"},
		{"hashes not an array", Config{}, mp{}.arr(2).str("BlockRemoved").uint(1), ReasonMalformedField, "block_hashes is int"},
		{"hashes nil", Config{}, mp{}.arr(2).str("BlockRemoved").nil_(), ReasonMalformedField, "block_hashes is nil"},
		{"token_ids nil", Config{}, mp{}.arr(5).str("BlockStored").uints(1).nil_().nil_().uint(1), ReasonMalformedField, "token_ids is nil"},
		{"block_size 0", Config{}, okStore(nil, nil, 0), ReasonBadBlockSize, ""},
		{"block_size too big", Config{}, okStore(nil, nil, hash.MaxBlockSize+1), ReasonBadBlockSize, ""},
		{"block_size negative", Config{}, mp{}.arr(5).str("BlockStored").arr(0).nil_().arr(0).int(-4), ReasonBadBlockSize, ""},
		{"block_size huge", Config{}, mp{}.arr(5).str("BlockStored").arr(0).nil_().arr(0).raw("cf ffffffffffffffff"), ReasonBadBlockSize, ""},
		{"block_size str", Config{}, mp{}.arr(5).str("BlockStored").arr(0).nil_().arr(0).str("4"), ReasonMalformedField, "block_size is str"},
		{"block_size nil", Config{}, mp{}.arr(5).str("BlockStored").arr(0).nil_().arr(0).nil_(), ReasonMalformedField, "block_size is nil"},
		{"block size mismatch", Config{BlockSize: 16}, okStore([]uint64{1, 2}, goldenTokens, 4), ReasonBlockSizeMismatch, "want 16"},
		{"too few tokens", Config{}, okStore([]uint64{1, 2}, goldenTokens[:7], 4), ReasonTokenCountMismatch, "len(token_ids) = 7"},
		{"partial last block", Config{}, okStore([]uint64{1, 2}, append(goldenTokens[:8:8], 5), 4), ReasonTokenCountMismatch, ""},
		{"tokens without hashes", Config{}, okStore(nil, goldenTokens[:4], 4), ReasonTokenCountMismatch, ""},
		{"too many hashes", Config{Limits: Limits{MaxBlocksPerEvent: 1}}, okStore([]uint64{1, 2}, goldenTokens, 4), ReasonLimit, "block_hashes"},
		{"too many removed hashes", Config{Limits: Limits{MaxBlocksPerEvent: 1}}, removedWith("01", "02"), ReasonLimit, "block_hashes"},
		{"too many tokens", Config{Limits: Limits{MaxTokensPerEvent: 7}}, okStore([]uint64{1, 2}, goldenTokens, 4), ReasonLimit, "token_ids"},
		{"lora_name int", Config{}, mp{}.arr(8).str("BlockStored").arr(0).nil_().arr(0).uint(4).nil_().nil_().uint(3),
			ReasonMalformedField, "lora_name is int"},
		{"lora_id str", Config{}, mp{}.arr(6).str("BlockStored").arr(0).nil_().arr(0).uint(4).str("7"), ReasonMalformedField, "lora_id is str"},
		{"cache_salt int", Config{}, mp{}.obj(5).str("type").str("BlockStored").str("block_hashes").arr(0).
			str("token_ids").arr(0).str("block_size").uint(4).str("cache_salt").uint(1), ReasonMalformedField, "cache_salt is int"},
		{"metadata salt bin", Config{}, mp{}.arr(8).str("BlockStoredWithMetadata").arr(0).nil_().arr(0).uint(4).nil_().nil_().
			obj(1).str("cache_salt").bin([]byte("x")), ReasonMalformedField, "cache_salt is bin"},
		{"medium bool", Config{}, mp{}.arr(3).str("BlockRemoved").uints(1).raw("c2"), ReasonMalformedField, "medium is bool"},
		{"group_idx str", Config{}, mp{}.arr(4).str("BlockRemoved").uints(1).nil_().str("0"), ReasonMalformedField, "group_idx"},
		{"group_idx over int32", Config{}, mp{}.arr(4).str("BlockRemoved").uints(1).nil_().uint(1 << 31), ReasonMalformedField, "group_idx"},
		{"locality int", Config{}, mp{}.obj(3).str("type").str("BlockRemoved").str("block_hashes").uints(1).
			str("locality").uint(1), ReasonMalformedField, "locality is int"},
		{"spec kind int", Config{}, mp{}.arr(11).str("BlockStored").arr(0).nil_().arr(0).uint(4).nil_().nil_().nil_().nil_().nil_().uint(1),
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
		evs[i] = mp{}.arr(0)
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
	ev := mp(unhex(goldenVectors[2].hex)[11:29]) // A3's event
	cases := []struct {
		name    string
		payload []byte
		ts      float64
		rank    int
		hasRank bool
	}{
		{"3 elements", mp{}.arr(3).f64(2.5).arr(1).add(ev).uint(5), 2.5, 5, true},
		{"2 elements (old vLLM)", mp{}.arr(2).f64(2.5).arr(1).add(ev), 2.5, 0, false},
		{"nil rank", mp{}.arr(3).f64(2.5).arr(1).add(ev).nil_(), 2.5, 0, false},
		{"4th element ignored (unmerged publisher_id)", mp{}.arr(4).f64(2.5).arr(1).add(ev).uint(1).bin(make([]byte, 16)), 2.5, 1, true},
		{"float32 ts", mp{}.arr(3).raw("ca 40200000").arr(1).add(ev).uint(0), 2.5, 0, true},
		{"int ts", mp{}.arr(3).uint(1750000000).arr(1).add(ev).uint(0), 1750000000, 0, true},
		{"negative rank", mp{}.arr(3).f64(1).arr(1).add(ev).int(-1), 1, -1, true},
		{"int32 max rank", mp{}.arr(3).f64(1).arr(1).add(ev).uint(math.MaxInt32), 1, math.MaxInt32, true},
		{"array16 headers", mp{}.raw("dc 0003").f64(1).raw("dc 0001").add(ev).uint(0), 1, 0, true},
		{"array32 headers", mp{}.raw("dd 00000003").f64(1).raw("dd 00000001").add(ev).uint(0), 1, 0, true},
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
	require.NoError(t, d.Decode(batch(0, mp{}.raw("de 0001").str("type").str("AllBlocksCleared")), &b))
	require.Len(t, b.Events, 1)
}

func TestBadPayloads(t *testing.T) {
	ev := mp(unhex(goldenVectors[2].hex)[11:29])
	deep := func(n int) mp {
		m := mp{}
		for i := 0; i < n; i++ {
			m = m.arr(1)
		}
		return m.nil_()
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
		{"map batch", Limits{}, mp{}.obj(2).str("ts").f64(1).str("events").arr(0), ErrMalformed, "batch is map"},
		{"nil batch", Limits{}, mp{}.nil_(), ErrMalformed, "batch is nil"},
		{"one element", Limits{}, mp{}.arr(1).f64(1), ErrMalformed, "1 elements"},
		{"ts str", Limits{}, mp{}.arr(2).str("1").arr(0), ErrMalformed, "ts is str"},
		{"ts nil", Limits{}, mp{}.arr(2).nil_().arr(0), ErrMalformed, "ts is nil"},
		{"events nil", Limits{}, mp{}.arr(2).f64(1).nil_(), ErrMalformed, "events is nil"},
		{"events map", Limits{}, mp{}.arr(2).f64(1).obj(0), ErrMalformed, "events is map"},
		{"rank str", Limits{}, mp{}.arr(3).f64(1).arr(0).str("0"), ErrMalformed, "data_parallel_rank is str"},
		{"rank over int32", Limits{}, mp{}.arr(3).f64(1).arr(0).uint(1 << 40), ErrMalformed, "out of range"},
		{"trailing byte", Limits{}, append(batch(0, ev), 0), ErrMalformed, "1 trailing bytes"},
		{"second batch appended", Limits{}, append(batch(0, ev), batch(0, ev)...), ErrMalformed, "trailing"},
		{"array32 of 2^32-1 elements", Limits{}, mp{}.raw("dd ffffffff").f64(1), ErrTruncated, ""},
		{"events array32 of 2^32-1", Limits{}, mp{}.arr(3).f64(1).raw("dd ffffffff").add(ev), ErrTruncated, "events"},
		{"hashes array32 of 2^32-1", Limits{}, batch(0, mp{}.arr(2).str("BlockRemoved").raw("dd ffffffff 01")), ErrTruncated, ""},
		{"map32 of 2^32-1 pairs", Limits{}, batch(0, mp{}.raw("df ffffffff").str("type")), ErrTruncated, ""},
		{"str32 of 4 GiB", Limits{}, batch(0, mp{}.arr(1).raw("db ffffffff 41")), ErrTruncated, ""},
		{"bin32 of 4 GiB in a skipped field", Limits{}, batch(0, mp{}.arr(3).str("X").raw("c6 ffffffff 41").nil_()), ErrTruncated, ""},
		{"ext32 of 4 GiB", Limits{}, batch(0, mp{}.arr(2).str("X").raw("c9 ffffffff 01 41")), ErrTruncated, ""},
		{"0xc1 inside a skipped field", Limits{}, batch(0, mp{}.arr(2).str("X").raw("91 c1")), ErrMalformed, "0xc1"},
		{"payload over limit", Limits{MaxPayloadBytes: 30}, batch(0, ev, ev), ErrLimit, "payload is 48 bytes, limit 30"},
		{"events over limit", Limits{MaxEvents: 2}, batch(0, ev, ev, ev), ErrLimit, "3 events"},
		{"nesting over default depth", Limits{}, batch(0, mp{}.arr(2).str("BlockX").add(deep(40))), ErrLimit, "nesting too deep"},
		{"nesting over depth in a map key", Limits{MaxDepth: 4}, batch(0, mp{}.obj(1).add(deep(2)).nil_()), ErrLimit, ""},
		{"nesting over depth in extra_keys", Limits{MaxDepth: 5}, batch(0, mp{}.obj(2).str("type").str("AllBlocksCleared").
			str("extra_keys").add(deep(3))), ErrLimit, ""},
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
	require.NoError(t, d.Decode(batch(0, mp{}.arr(2).str("BlockX").add(deep(40))), &b))
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
	require.NoError(t, zero.Decode(unhex(goldenVectors[0].hex), &b))
	require.Len(t, b.Events, 1)
	require.Error(t, zero.Decode(unhex(goldenVectors[0].hex), nil))
}

// Events decoded into one Batch stay intact while another Batch is decoded; the slices
// of a Batch are capped, so appending to one never overwrites the next.
func TestBatchOwnership(t *testing.T) {
	d := mustNew(t, Config{})
	var b1, b2 Batch
	require.NoError(t, d.Decode(unhex(goldenVectors[0].hex), &b1))
	require.NoError(t, d.Decode(batch(0, removedWith("01", "02", "03")), &b2))
	require.Equal(t, []uint64{h0, h1}, b1.Events[0].Seqs)
	require.Equal(t, []uint64{1, 2, 3}, b2.Events[0].Seqs)

	two := batch(0, removedWith("01"), removedWith("02"))
	require.NoError(t, d.Decode(two, &b1))
	s := append(b1.Events[0].Seqs, 99)
	require.Equal(t, []uint64{1, 99}, s)
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
