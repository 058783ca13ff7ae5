package kvevents

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/kvindex/kvindex/hash"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// The vectors' common values (testdata/golden.txt's header).
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
	// sha256(b"example"), the illustrative digest of the bin-hash vector; its last 8
	// bytes are the fold.
	digestExample = unhex("50d858e0985ecc7f60418aaf0cc5ab587f42c2570a884095a9e8ccacd0f6545c")
)

// goldenVector is the decoded form of one payload of testdata/golden.txt.
type goldenVector struct {
	id      string // the payload's ID in testdata/golden.txt
	name    string
	size    int // the payload's length in bytes where the source notes state it, else 0
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
		id: "A1", name: "A1 BlockStored positional (v0.14-v0.16)", size: 86,
		ts: tsGolden, hasRank: true,
		events: []Event{storedA1(nil)},
	},
	{
		id: "A2", name: "A2 BlockRemoved positional", size: 40,
		ts: tsGolden, hasRank: true,
		events: []Event{{Kind: Removed, Seqs: []uint64{h0}, Medium: "GPU", HasDPRank: true}},
	},
	{
		id: "A3", name: "A3 AllBlocksCleared positional", size: 30,
		ts: tsGolden, hasRank: true,
		events: []Event{{Kind: Cleared, HasDPRank: true}},
	},
	{
		id: "A1-v0.11", name: "A1 variant: medium, no lora_name (v0.11.2)",
		ts: tsGolden, hasRank: true,
		events: []Event{storedA1(nil)},
	},
	{
		id: "A1-v0.9", name: "A1 variant: v0.9.0 (2-element batch, no medium)",
		ts:     tsGolden,
		events: []Event{storedA1(func(e *Event) { e.Medium, e.HasDPRank = "", false })},
	},
	{
		id: "nil-rank", name: "nil data_parallel_rank, no events",
		ts: 1.0,
	},
	{
		id: "C1", name: "C1 BlockStored late positional (post-#40984)", size: 106,
		ts: tsGolden, hasRank: true,
		events: []Event{storedA1(func(e *Event) { e.GroupIdx, e.HasGroupIdx, e.SpecKind = 0, true, "full_attention" })},
	},
	{
		id: "B1", name: "B1 BlockStored map (post-#42892)", size: 227,
		ts: tsGolden, hasRank: true,
		events: []Event{storedA1(func(e *Event) { e.GroupIdx, e.HasGroupIdx, e.SpecKind = 0, true, "full_attention" })},
	},
	{
		id: "B2", name: "B2 BlockRemoved map", size: 76,
		ts: tsGolden, hasRank: true,
		events: []Event{{Kind: Removed, Seqs: []uint64{h0}, Medium: "GPU", HasGroupIdx: true, HasDPRank: true}},
	},
	{
		id: "B3", name: "B3 AllBlocksCleared map", size: 35,
		ts: tsGolden, hasRank: true,
		events: []Event{{Kind: Cleared, HasDPRank: true}},
	},
	{
		// The block_hashes fragment "91 c4 20 <digest>" of the source notes, in a
		// positional BlockRemoved [tag, block_hashes] inside the common batch.
		id: "bin-hash", name: "bin block hash folded to its last 8 bytes",
		ts: tsGolden, hasRank: true,
		events: []Event{{Kind: Removed, Seqs: []uint64{0xa9e8ccacd0f6545c}, HasDPRank: true}},
	},
}

// goldenPayloads reads testdata/golden.txt: ID -> payload.
func goldenPayloads(t testing.TB) map[string][]byte {
	t.Helper()
	text, err := os.ReadFile("testdata/golden.txt")
	require.NoError(t, err)
	out := map[string][]byte{}
	for _, line := range strings.Split(string(text), "\n") {
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		id, hexText, ok := strings.Cut(line, " ")
		require.True(t, ok, "line %q", line)
		require.NotContains(t, out, id)
		out[id] = unhex(hexText)
	}
	return out
}

// goldenPayload returns the payload of vector id of testdata/golden.txt.
func goldenPayload(t testing.TB, id string) []byte {
	t.Helper()
	p, ok := goldenPayloads(t)[id]
	require.True(t, ok, "%s not in testdata/golden.txt", id)
	return p
}

// payload returns the payload of vector g.
func (g goldenVector) payload(t testing.TB) []byte {
	return goldenPayload(t, g.id)
}

func TestGoldenVectors(t *testing.T) {
	d := mustNew(t, Config{BlockSize: 4})
	var b Batch
	require.Len(t, goldenPayloads(t), len(goldenVectors), "every payload of testdata/golden.txt has its decoded form here")
	for _, g := range goldenVectors {
		t.Run(g.name, func(t *testing.T) {
			payload := g.payload(t)
			if g.size != 0 {
				require.Len(t, payload, g.size, "length stated by the source notes")
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

// The values the vectors are checked against, as testdata/golden.txt states them.
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

// testdata/golden.txt's payloads were taken from the wire-format notes kept beside the
// repository (../shared/EVENTS.md in the project's workspace): where those are present,
// each payload must appear in them byte for byte. Skipped, visibly, elsewhere.
func TestGoldenVectorsMatchEventsMD(t *testing.T) {
	doc, err := os.ReadFile("../../shared/EVENTS.md")
	if errors.Is(err, os.ErrNotExist) {
		t.Skip("../../shared/EVENTS.md not present: provenance of testdata/golden.txt not checked")
	}
	require.NoError(t, err)
	text := strings.Join(strings.Fields(string(doc)), "")
	for id, p := range goldenPayloads(t) {
		if id == "bin-hash" {
			continue // assembled from the fragment checked below
		}
		require.True(t, strings.Contains(text, hex.EncodeToString(p)), "%s: not found verbatim in EVENTS.md", id)
	}
	require.Contains(t, string(doc), "`93 cb 3ff0000000000000 90 c0`")
	require.Contains(t, string(doc), "91 c4 20 50d858e0985ecc7f60418aaf0cc5ab587f42c2570a884095a9e8ccacd0f6545c")
	require.Contains(t, string(doc), "0xa9e8ccacd0f6545c")
}

// Every strict prefix of every golden vector is a truncated payload: an error, never a
// panic, and an empty Batch.
func TestGoldenTruncatedAtEveryOffset(t *testing.T) {
	d := mustNew(t, Config{})
	var b Batch
	for _, g := range goldenVectors {
		payload := g.payload(t)
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
		orig := g.payload(t)
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

// The sequence frames of a replay exchange (package documentation, "Wire format").
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
	golden := goldenPayloads(t)
	mixed := batch(1,
		mp(golden["A1"][11:85]), // A1's event
		mp(golden["B2"][11:75]), // B2's event
		mp{}.Map(6).Str("type").Str("BlockStored").Str("block_hashes").Uints(5).
			Str("token_ids").Tokens(goldenTokens[:4]).Str("block_size").Uint(4).
			Str("lora_name").Str("sql-adapter").Str("cache_salt").Str("tenant;1"),
	)
	payloads := map[string][]byte{"A1": golden["A1"], "B1": golden["B1"], "mixed": mixed}
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
		payload := g.payload(b)
		b.Run("vector="+g.id, func(b *testing.B) {
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

// The byte walk of A1 in the package documentation is golden payload A1: the first 28
// columns of each line of the walk are its bytes.
func TestDocWalksGoldenA1(t *testing.T) {
	src, err := os.ReadFile("doc.go")
	require.NoError(t, err)
	text := string(src)
	start := strings.Index(text, "// Golden payload A1 of testdata/golden.txt")
	end := strings.Index(text, "// Decoded: one Stored event")
	require.True(t, start >= 0 && end > start, "walk not found in doc.go")
	var walked strings.Builder
	for _, line := range strings.Split(text[start:end], "\n") {
		line, ok := strings.CutPrefix(line, "//\t")
		if !ok {
			continue
		}
		walked.WriteString(strings.Join(strings.Fields(line[:min(28, len(line))]), ""))
	}
	require.Equal(t, hex.EncodeToString(goldenPayload(t, "A1")), walked.String())
}
