package kvevents

import (
	"crypto/sha256"
	"errors"
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/kvindex/kvindex/hash"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// Common values of EVENTS.md §6.0.
const (
	tsGolden = 1750000000.25
	h0       = uint64(0x8899aabbccddeeff) // 9843086184167632639
	h1       = uint64(0x0102030405060708) // 72623859790382856
	parentP  = uint64(0x1122334455667788) // 1234605616436508552
)

var (
	goldenTokens = []uint32{151644, 872, 198, 9064, 374, 279, 6722, 315}
	c0           = hash.Content(goldenTokens[:4])
	c1           = hash.Content(goldenTokens[4:])
	// sha256(b"example"), the illustrative digest of §6.3; its last 8 bytes are the fold.
	digestExample = unhex("50d858e0985ecc7f60418aaf0cc5ab587f42c2570a884095a9e8ccacd0f6545c")
)

type goldenVector struct {
	name    string
	section string
	hex     string // pasted from EVENTS.md
	inDoc   bool   // the hex appears verbatim in EVENTS.md
	size    int    // the byte length EVENTS.md states, 0 if none
	ts      float64
	rank    int
	hasRank bool
	events  []Event
}

func storedA1(extra func(*Event)) Event {
	e := Event{
		Kind: Stored, Seqs: []uint64{h0, h1}, Contents: []uint64{c0, c1},
		Parent: parentP, HasParent: true, BlockSize: 4, Medium: "GPU",
		DPRank: 0, HasDPRank: true,
	}
	if extra != nil {
		extra(&e)
	}
	return e
}

var goldenVectors = []goldenVector{
	{
		name: "A1 BlockStored positional (v0.14-v0.16)", section: "6.1", inDoc: true, size: 86,
		hex: "93cb41da13b8601000009198ab426c6f636b53746f72656492cf8899aabbccddeeffcf0102030405060708cf112233445566778898ce0002505ccd0368ccc6cd2368cd0176cd0117cd1a42cd013b04c0a3475055c000",
		ts:  tsGolden, hasRank: true,
		events: []Event{storedA1(nil)},
	},
	{
		name: "A2 BlockRemoved positional", section: "6.1", inDoc: true, size: 40,
		hex: "93cb41da13b8601000009193ac426c6f636b52656d6f76656491cf8899aabbccddeeffa347505500",
		ts:  tsGolden, hasRank: true,
		events: []Event{{Kind: Removed, Seqs: []uint64{h0}, Medium: "GPU", HasDPRank: true}},
	},
	{
		name: "A3 AllBlocksCleared positional", section: "6.1", inDoc: true, size: 30,
		hex: "93cb41da13b8601000009191b0416c6c426c6f636b73436c656172656400",
		ts:  tsGolden, hasRank: true,
		events: []Event{{Kind: Cleared, HasDPRank: true}},
	},
	{
		name: "A1 variant: medium, no lora_name (v0.11.2)", section: "6.1", inDoc: true,
		hex: "93cb41da13b8601000009197ab426c6f636b53746f72656492cf8899aabbccddeeffcf0102030405060708cf112233445566778898ce0002505ccd0368ccc6cd2368cd0176cd0117cd1a42cd013b04c0a347505500",
		ts:  tsGolden, hasRank: true,
		events: []Event{storedA1(nil)},
	},
	{
		name: "A1 variant: v0.9.0 (2-element batch, no medium)", section: "6.1", inDoc: true,
		hex:    "92cb41da13b8601000009196ab426c6f636b53746f72656492cf8899aabbccddeeffcf0102030405060708cf112233445566778898ce0002505ccd0368ccc6cd2368cd0176cd0117cd1a42cd013b04c0",
		ts:     tsGolden,
		events: []Event{storedA1(func(e *Event) { e.Medium, e.HasDPRank = "", false })},
	},
	{
		name: "nil data_parallel_rank, no events", section: "6.1", inDoc: false,
		hex: "93 cb 3ff0000000000000 90 c0", // written with spaces in EVENTS.md
		ts:  1.0,
	},
	{
		name: "C1 BlockStored late positional (post-#40984)", section: "6.1", inDoc: true, size: 106,
		hex: "93cb41da13b860100000919cab426c6f636b53746f72656492cf8899aabbccddeeffcf0102030405060708cf112233445566778898ce0002505ccd0368ccc6cd2368cd0176cd0117cd1a42cd013b04c0a3475055c092c0c000ae66756c6c5f617474656e74696f6ec000",
		ts:  tsGolden, hasRank: true,
		events: []Event{storedA1(func(e *Event) { e.GroupIdx, e.HasGroupIdx, e.SpecKind = 0, true, "full_attention" })},
	},
	{
		name: "B1 BlockStored map (post-#42892)", section: "6.2", inDoc: true, size: 227,
		hex: "93cb41da13b860100000918ba474797065ab426c6f636b53746f726564ac626c6f636b5f68617368657392cf8899aabbccddeeffcf0102030405060708b1706172656e745f626c6f636b5f68617368cf1122334455667788a9746f6b656e5f69647398ce0002505ccd0368ccc6cd2368cd0176cd0117cd1a42cd013baa626c6f636b5f73697a6504a76c6f72615f6964c0a66d656469756da3475055a96c6f72615f6e616d65c0aa65787472615f6b65797392c0c0a967726f75705f69647800b26b765f63616368655f737065635f6b696e64ae66756c6c5f617474656e74696f6e00",
		ts:  tsGolden, hasRank: true,
		events: []Event{storedA1(func(e *Event) { e.GroupIdx, e.HasGroupIdx, e.SpecKind = 0, true, "full_attention" })},
	},
	{
		name: "B2 BlockRemoved map", section: "6.2", inDoc: true, size: 76,
		hex: "93cb41da13b8601000009184a474797065ac426c6f636b52656d6f766564ac626c6f636b5f68617368657391cf8899aabbccddeeffa66d656469756da3475055a967726f75705f6964780000",
		ts:  tsGolden, hasRank: true,
		events: []Event{{Kind: Removed, Seqs: []uint64{h0}, Medium: "GPU", HasGroupIdx: true, HasDPRank: true}},
	},
	{
		name: "B3 AllBlocksCleared map", section: "6.2", inDoc: true, size: 35,
		hex: "93cb41da13b8601000009181a474797065b0416c6c426c6f636b73436c656172656400",
		ts:  tsGolden, hasRank: true,
		events: []Event{{Kind: Cleared, HasDPRank: true}},
	},
	{
		// §6.3 gives the block_hashes fragment "91 c4 20 <digest>"; here it sits in a
		// positional BlockRemoved [tag, block_hashes] inside the §6.0 batch.
		name: "6.3 bin block hash folded to its last 8 bytes", section: "6.3",
		hex: "93 cb41da13b860100000 91 92 ac426c6f636b52656d6f766564" +
			" 91 c4 20 50d858e0985ecc7f60418aaf0cc5ab587f42c2570a884095a9e8ccacd0f6545c 00",
		ts: tsGolden, hasRank: true,
		events: []Event{{Kind: Removed, Seqs: []uint64{0xa9e8ccacd0f6545c}, HasDPRank: true}},
	},
}

func TestGoldenVectors(t *testing.T) {
	d := mustNew(t, Config{BlockSize: 4})
	var b Batch
	for _, g := range goldenVectors {
		t.Run(g.name, func(t *testing.T) {
			payload := unhex(g.hex)
			if g.size != 0 {
				require.Len(t, payload, g.size, "length stated in EVENTS.md §%s", g.section)
			}
			require.NoError(t, d.Decode(payload, &b))
			require.Equal(t, g.ts, b.Timestamp)
			require.Equal(t, g.hasRank, b.HasDPRank)
			require.Equal(t, g.rank, b.DPRank)
			require.Zero(t, b.UnknownTypes)
			require.Zero(t, b.RejectedCount, "%v", b.Rejected)
			require.Equal(t, norm(g.events), norm(b.Events))
		})
	}
}

// The values the vectors are checked against, restated from EVENTS.md §6.0.
func TestGoldenCommonValues(t *testing.T) {
	require.Equal(t, uint64(9843086184167632639), h0)
	require.Equal(t, uint64(72623859790382856), h1)
	require.Equal(t, uint64(1234605616436508552), parentP)
	require.Equal(t, unhex("41da13b860100000"), []byte(mp{}.F64(tsGolden)[1:]))
	sum := sha256.Sum256([]byte("example"))
	require.Equal(t, digestExample, sum[:])
	require.Len(t, goldenTokens, 8)
	require.Equal(t, []uint64{c0, c1}, must(hash.Blocks(nil, goldenTokens, 4)))
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

// The pasted hex must be EVENTS.md's, byte for byte (skipped where shared/ is absent).
func TestGoldenVectorsMatchEventsMD(t *testing.T) {
	doc, err := os.ReadFile("../../shared/EVENTS.md")
	if errors.Is(err, os.ErrNotExist) {
		t.Skip("../../shared/EVENTS.md not present")
	}
	require.NoError(t, err)
	text := string(doc)
	for _, g := range goldenVectors {
		if g.inDoc {
			require.True(t, strings.Contains(text, g.hex), "%s: hex not found verbatim in EVENTS.md", g.name)
		}
	}
	require.Contains(t, text, "`93 cb 3ff0000000000000 90 c0`")
	require.Contains(t, text, "91 c4 20 50d858e0985ecc7f60418aaf0cc5ab587f42c2570a884095a9e8ccacd0f6545c")
	require.Contains(t, text, "0xa9e8ccacd0f6545c")
}

// Every strict prefix of every golden vector is a truncated payload: an error, never a
// panic, and an empty Batch.
func TestGoldenTruncatedAtEveryOffset(t *testing.T) {
	d := mustNew(t, Config{})
	var b Batch
	for _, g := range goldenVectors {
		payload := unhex(g.hex)
		for i := 0; i < len(payload); i++ {
			err := d.Decode(payload[:i:i], &b)
			require.ErrorIs(t, err, ErrTruncated, "%s cut at %d", g.name, i)
			require.Empty(t, b.Events)
		}
	}
}

// Overwriting each byte of each golden vector with bytes that mean something special
// (huge headers, the invalid 0xc1, nil) never panics; a failed decode leaves Batch empty.
func TestGoldenCorruptedAtEveryOffset(t *testing.T) {
	d := mustNew(t, Config{})
	var b Batch
	for _, g := range goldenVectors {
		orig := unhex(g.hex)
		for i := range orig {
			for _, c := range []byte{0x00, 0x7f, 0x9f, 0x8f, 0xc0, 0xc1, 0xc4, 0xc6, 0xd9, 0xdb, 0xdc, 0xdd, 0xdf, 0xff} {
				p := append([]byte(nil), orig...)
				p[i] = c
				if err := d.Decode(p, &b); err != nil {
					require.Empty(t, b.Events)
					require.True(t, errors.Is(err, ErrTruncated) || errors.Is(err, ErrMalformed) || errors.Is(err, ErrLimit), "%v", err)
				}
			}
		}
	}
}

// §6.4: the sequence frames of the replay exchange.
func TestParseSeq(t *testing.T) {
	seq, end, err := ParseSeq(unhex("0000000000000001"))
	require.NoError(t, err)
	require.Equal(t, uint64(1), seq)
	require.False(t, end)
	seq, _, err = ParseSeq(unhex("0000000000000002"))
	require.NoError(t, err)
	require.Equal(t, uint64(2), seq)
	_, end, err = ParseSeq(unhex("ffffffffffffffff"))
	require.NoError(t, err)
	require.True(t, end)
	for _, n := range []int{0, 7, 9, 24} {
		_, _, err = ParseSeq(make([]byte, n))
		require.ErrorIs(t, err, ErrSeqLength)
	}
}

func TestAllocs(t *testing.T) {
	mixed := batch(1,
		mp(unhex(goldenVectors[0].hex)[11:85]), // A1's event
		mp(unhex(goldenVectors[8].hex)[11:75]), // B2's event
		mp{}.Map(6).Str("type").Str("BlockStored").Str("block_hashes").Uints(5).
			Str("token_ids").Tokens(goldenTokens[:4]).Str("block_size").Uint(4).
			Str("lora_name").Str("sql-adapter").Str("cache_salt").Str("tenant;1"),
	)
	payloads := map[string][]byte{"A1": unhex(goldenVectors[0].hex), "B1": unhex(goldenVectors[7].hex), "mixed": mixed}
	for name, p := range payloads {
		t.Run(name, func(t *testing.T) {
			d := mustNew(t, Config{})
			var b Batch
			require.NoError(t, d.Decode(p, &b)) // warm up
			require.Zero(t, b.RejectedCount, "%v", b.Rejected)
			allocs := testing.AllocsPerRun(200, func() {
				if err := d.Decode(p, &b); err != nil {
					t.Fatal(err)
				}
			})
			require.Zero(t, allocs)
		})
	}
}

func BenchmarkDecode(b *testing.B) {
	for _, g := range []goldenVector{goldenVectors[0], goldenVectors[7]} {
		payload := unhex(g.hex)
		b.Run("vector="+g.name[:2], func(b *testing.B) {
			d := mustNew(b, Config{})
			var batch Batch
			b.ReportAllocs()
			b.SetBytes(int64(len(payload)))
			for b.Loop() {
				if err := d.Decode(payload, &batch); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
