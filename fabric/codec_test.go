package fabric

import (
	"errors"
	"reflect"
	"testing"

	"github.com/kvindex/kvindex/engine"
)

func sampleMessages() []Message {
	return []Message{
		{WorkerSeq: 1, Event: engine.Event{Kind: engine.EventStored, Worker: "w 0.*>", Namespace: "model=m;lora",
			Parent: 1<<64 - 1, HasParent: true, Blocks: []engine.Block{{Content: 1, Seq: 2}, {Content: 1 << 63, Seq: 7}}}},
		{WorkerSeq: 1 << 40, Event: engine.Event{Kind: engine.EventRemoved, Worker: "x", Seqs: []uint64{3, 4, 5}}},
		{WorkerSeq: 0, Event: engine.Event{Kind: engine.EventCleared, Worker: "y"}},
		{WorkerSeq: 9, Event: engine.Event{Kind: engine.EventRemoveWorker, Worker: "z"}},
		{WorkerSeq: 10, Event: engine.Event{Kind: engine.EventStored, Worker: "t", Tier: engine.TierHost,
			Parent: 5, HasParent: true, Blocks: []engine.Block{{Content: 3, Seq: 6}}}},
		{WorkerSeq: 11, Event: engine.Event{Kind: engine.EventRemoved, Worker: "t", Tier: engine.TierDisk, Seqs: []uint64{6}}},
		{WorkerSeq: 12, Event: engine.Event{Kind: engine.EventCopied, Worker: "t", Tier: engine.TierHost, Seqs: []uint64{1, 2}}},
		{WorkerSeq: 13, Offset: 2, Total: 3, Event: engine.Event{Kind: engine.EventStored, Worker: "t", Parent: 6, HasParent: true,
			Blocks: []engine.Block{{Content: 3, Seq: 7}}}},
	}
}

func TestCodecRoundTrip(t *testing.T) {
	var got Message
	for _, m := range sampleMessages() {
		b := AppendMessage(nil, &m)
		if err := DecodeMessage(b, &got); err != nil {
			t.Fatalf("%+v: %v", m, err)
		}
		if !reflect.DeepEqual(got, m) {
			t.Fatalf("round trip:\n got  %+v\n want %+v", got, m)
		}
		for i := range b {
			if err := DecodeMessage(b[:i], &got); !errors.Is(err, ErrMalformed) {
				t.Fatalf("truncated at %d of %d: err %v", i, len(b), err)
			}
		}
		if err := DecodeMessage(append(b, 0), &got); !errors.Is(err, ErrMalformed) {
			t.Fatalf("trailing byte accepted: %v", err)
		}
	}
}

// A part outside its event, as large as it, of a kind that does not split, or of an
// event past MaxSplitTotal is refused.
func TestCodecRefusesBadParts(t *testing.T) {
	blocks := []engine.Block{{Content: 1, Seq: 1}, {Content: 2, Seq: 2}}
	for _, m := range []Message{
		{WorkerSeq: 1, Offset: 2, Total: 3, Event: engine.Event{Kind: engine.EventStored, Worker: "w", Blocks: blocks}},
		{WorkerSeq: 1, Offset: 0, Total: 2, Event: engine.Event{Kind: engine.EventStored, Worker: "w", Blocks: blocks}},
		{WorkerSeq: 1, Offset: 3, Total: 3, Event: engine.Event{Kind: engine.EventRemoved, Worker: "w", Seqs: []uint64{1}}},
		{WorkerSeq: 1, Offset: 0, Total: MaxSplitTotal + 1, Event: engine.Event{Kind: engine.EventRemoved, Worker: "w", Seqs: []uint64{1}}},
		{WorkerSeq: 1, Offset: 0, Total: 5, Event: engine.Event{Kind: engine.EventCleared, Worker: "w"}},
	} {
		var got Message
		if err := DecodeMessage(AppendMessage(nil, &m), &got); !errors.Is(err, ErrMalformed) {
			t.Fatalf("%+v accepted: %v", m, err)
		}
	}
}

// A message with tier bits 3 (no such tier) is refused.
func TestCodecRefusesUnknownTier(t *testing.T) {
	b := AppendMessage(nil, &Message{Event: engine.Event{Kind: engine.EventRemoved, Worker: "w", Seqs: []uint64{1}}})
	b[2] |= flagTierMask
	var m Message
	if err := DecodeMessage(b, &m); !errors.Is(err, ErrMalformed) {
		t.Fatalf("tier 3 accepted: %v %+v", err, m)
	}
}

func TestSubjectTokens(t *testing.T) {
	for _, name := range []string{"", "a.b", "a b", "*", ">", "ünï"} {
		tok := Token(name)
		for _, c := range tok {
			if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f' || c == '_') {
				t.Fatalf("Token(%q) = %q", name, tok)
			}
		}
	}
	if Subject("p", "m", "w") != "p.6d.77" {
		t.Fatal(Subject("p", "m", "w"))
	}
}

func FuzzDecodeMessage(f *testing.F) {
	for _, m := range sampleMessages() {
		f.Add(AppendMessage(nil, &m))
	}
	f.Add([]byte{1, 1, 0, 1, 1, 'w', 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0x0f})
	f.Fuzz(func(t *testing.T, b []byte) {
		var m Message
		if err := DecodeMessage(b, &m); err != nil {
			if !errors.Is(err, ErrMalformed) {
				t.Fatalf("error not wrapping ErrMalformed: %v", err)
			}
			return
		}
		// Whatever decodes survives a round trip (varints may arrive non-minimal).
		var again Message
		if err := DecodeMessage(AppendMessage(nil, &m), &again); err != nil || !reflect.DeepEqual(again, m) {
			t.Fatalf("round trip of %x: %v\n got  %+v\n want %+v", b, err, again, m)
		}
	})
}

// Publish refuses an event of no tier rather than let AppendMessage's two tier bits
// turn it into an event of another tier, and the stream stays empty.
func TestPublishRefusesUnknownTier(t *testing.T) {
	ctx := testCtx(t)
	ns := startNATS(t)
	nc := ns.connect(t)
	p := newPublisher(t, ctx, nc, PublisherConfig{Stream: StreamConfig{Memory: true}})
	for _, tier := range []engine.Tier{engine.NumTiers, 5} {
		ev := engine.Event{Kind: engine.EventRemoved, Worker: "w", Tier: tier, Seqs: []uint64{1}}
		if err := p.Publish(ctx, testModel, &ev, 1); !errors.Is(err, ErrMalformed) {
			t.Fatalf("tier %d: err %v, want ErrMalformed", tier, err)
		}
	}
	if last := streamLast(t, ctx, nc, DefaultStream); last != 0 {
		t.Fatalf("stream holds %d messages", last)
	}
}
