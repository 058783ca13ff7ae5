package kvevents

import (
	"errors"
	"fmt"
	"testing"
)

// FuzzDecode: any payload decodes or fails with one of the three payload errors, never
// panics, produces output bounded by the payload and the limits, and decodes the same way
// twice (including into a reused Batch).
func FuzzDecode(f *testing.F) {
	for _, p := range goldenPayloads(f) {
		f.Add(p)
	}
	f.Add(batch(0, removedWith("ff", "d3 8000000000000000", "c4 01 ab")))
	f.Add(batch(3, mp{}.Arr(8).Str("BlockStoredWithMetadata").Uints(12).Uint(11).Tokens([]uint32{43}).Uint(1).Nil().
		Str("GPU").Map(1).Str("cache_salt").Str("tenant;a")))
	f.Add(batch(0, mp{}.Map(3).Str("type").Str("BlockStored").Str("lora_name").Str("x").Str("extra_keys").Arr(1).Arr(1).Arr(0)))
	f.Add(batch(0, storedExtra("sql", mp{}.Arr(2).Arr(2).Str("sql").Str("img").Arr(1).F64(0.5))))
	f.Add(batch(0, storedExtra("", mp{}.Arr(2).Arr(1).Arr(2).Str("img").Uint(3).Arr(1).Bin([]byte{1, 2}))))
	f.Add(batch(0, mp{}.Arr(8).Str("BlockStored").Uints(7, 8).Nil().Arr(0).Uint(64).Nil().Str("CPU").Nil()))

	small := Limits{MaxPayloadBytes: 4096, MaxEvents: 16, MaxBlocksPerEvent: 8, MaxTokensPerEvent: 32, MaxDepth: 6}
	f.Fuzz(func(t *testing.T, payload []byte) {
		for i, lim := range []Limits{{}, small, {}} {
			l := lim.withDefaults()
			// The small limits also take hash-only stores (vLLM's offloading connector);
			// the third decoder cuts blocks into units of 1 token (Config.Units).
			cfg := Config{Limits: lim, Verbatim: i == 0, HashOnly: i == 1}
			if i == 2 {
				cfg.BlockSize, cfg.Units = 1, true
			}
			d := mustNew(t, cfg)
			var b Batch
			err := d.Decode(payload, &b)
			if err != nil {
				if !errors.Is(err, ErrTruncated) && !errors.Is(err, ErrMalformed) && !errors.Is(err, ErrLimit) {
					t.Fatalf("unexpected error type: %v", err)
				}
				if len(b.Events) != 0 || b.RejectedCount != 0 || b.UnknownTypes != 0 {
					t.Fatalf("failed decode left output: %+v", b)
				}
				if st := d.Stats(); st.BadBatches != 1 || st.Events != 0 {
					t.Fatalf("stats after failure: %+v", st)
				}
				continue
			}
			checkBounds(t, payload, l, &b, cfg.BlockSize)
			first := snapshot(&b)
			if err := d.Decode(payload, &b); err != nil {
				t.Fatalf("second decode failed: %v", err)
			}
			if second := snapshot(&b); second != first {
				t.Fatalf("decode not deterministic:\n%s\n%s", first, second)
			}
			st := d.Stats()
			if st.Batches != 2 || st.Events != 2*uint64(len(b.Events)) || st.Stored+st.Removed+st.Cleared != st.Events ||
				st.RejectedTotal() != 2*uint64(b.RejectedCount) || st.UnknownTypes != 2*uint64(b.UnknownTypes) {
				t.Fatalf("stats inconsistent: %+v for %d events", st, len(b.Events))
			}
		}
	})
}

func checkBounds(t *testing.T, payload []byte, l Limits, b *Batch, unit int) {
	t.Helper()
	if len(payload) > l.MaxPayloadBytes {
		t.Fatalf("payload of %d bytes accepted, limit %d", len(payload), l.MaxPayloadBytes)
	}
	n := len(b.Events) + b.RejectedCount + b.UnknownTypes
	if n > l.MaxEvents || n > len(payload) {
		t.Fatalf("%d events from %d bytes", n, len(payload))
	}
	if len(b.Rejected) > MaxRecordedRejections || len(b.Rejected) > b.RejectedCount {
		t.Fatalf("%d rejections recorded of %d", len(b.Rejected), b.RejectedCount)
	}
	blocks := 0
	for _, e := range b.Events {
		blocks += len(e.Seqs)
		if len(e.Seqs) > l.MaxBlocksPerEvent {
			t.Fatalf("%d blocks in one event", len(e.Seqs))
		}
		switch e.Kind {
		case Stored:
			if e.HashOnly {
				if len(e.Contents) != 0 || len(e.Seqs) == 0 || e.Tokens != nil || e.BlockExtras != nil || e.BlockSize < 1 {
					t.Fatalf("hash-only store with %d contents, %d seqs, block size %d", len(e.Contents), len(e.Seqs), e.BlockSize)
				}
				break
			}
			if unit != 0 {
				if per := e.BlockSize / unit; len(e.Contents) != len(e.Seqs)*per {
					t.Fatalf("%d contents for %d seqs of %d units", len(e.Contents), len(e.Seqs), per)
				}
			} else if len(e.Contents) != len(e.Seqs) {
				t.Fatalf("%d contents for %d seqs", len(e.Contents), len(e.Seqs))
			}
			if e.BlockSize < 1 || len(e.Seqs)*e.BlockSize > l.MaxTokensPerEvent {
				t.Fatalf("block size %d, %d blocks", e.BlockSize, len(e.Seqs))
			}
		case Removed, Cleared:
			if len(e.Contents) != 0 || e.Namespace != "" || (e.Kind == Cleared && len(e.Seqs) != 0) {
				t.Fatalf("unexpected fields on %v: %+v", e.Kind, e)
			}
		default:
			t.Fatalf("bad kind %v", e.Kind)
		}
		if e.HasDPRank != b.HasDPRank || e.DPRank != b.DPRank {
			t.Fatalf("event rank %d/%v, batch %d/%v", e.DPRank, e.HasDPRank, b.DPRank, b.HasDPRank)
		}
	}
	if blocks > len(payload) {
		t.Fatalf("%d block hashes from %d bytes", blocks, len(payload))
	}
	if cap(b.seqs) > 2*len(payload)+16 || cap(b.contents) > 2*len(payload)+16 {
		t.Fatalf("arenas of %d/%d for %d bytes", cap(b.seqs), cap(b.contents), len(payload))
	}
}

func snapshot(b *Batch) string {
	type view struct {
		Batch    Batch
		Events   []Event
		Rejected []EventError
	}
	c := *b
	c.seqs, c.contents, c.Events, c.Rejected = nil, nil, nil, nil
	return fmt.Sprintf("%+v", view{c, norm(b.Events), b.Rejected})
}
