package subscriber

import (
	"context"
	"encoding/binary"
	"errors"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/kvindex/kvindex/engine"
	"github.com/kvindex/kvindex/hash"
	"github.com/kvindex/kvindex/internal/fakevllm"
	"github.com/kvindex/kvindex/internal/refmodel"
)

// mp builds EventBatch payloads the way msgspec does (smallest int widths, float64 ts,
// positional or map events).
type mp = fakevllm.Enc

// ev is a test event.
type ev struct {
	kind      string // stored, removed, cleared
	seqs      []uint64
	parent    uint64
	hasParent bool
	tokens    []uint32
	bs        int
	medium    string
	asMap     bool
}

func (e ev) encode(m mp) mp {
	switch e.kind {
	case "stored":
		if e.asMap {
			m = m.Map(8).Str("type").Str("BlockStored")
		} else {
			m = m.Arr(8).Str("BlockStored")
		}
		if e.asMap {
			m = m.Str("block_hashes")
		}
		m = m.Arr(len(e.seqs))
		for _, s := range e.seqs {
			m = m.Uint(s)
		}
		if e.asMap {
			m = m.Str("parent_block_hash")
		}
		if e.hasParent {
			m = m.Uint(e.parent)
		} else {
			m = m.Nil()
		}
		if e.asMap {
			m = m.Str("token_ids")
		}
		m = m.Arr(len(e.tokens))
		for _, t := range e.tokens {
			m = m.Uint(uint64(t))
		}
		if e.asMap {
			m = m.Str("block_size")
		}
		m = m.Uint(uint64(e.bs))
		if e.asMap {
			m = m.Str("lora_id")
		}
		m = m.Nil()
		if e.asMap {
			m = m.Str("medium")
		}
		if e.medium == "" {
			m = m.Str("GPU")
		} else {
			m = m.Str(e.medium)
		}
		if e.asMap {
			m = m.Str("lora_name")
		}
		return m.Nil()
	case "removed":
		m = m.Arr(3).Str("BlockRemoved").Arr(len(e.seqs))
		for _, s := range e.seqs {
			m = m.Uint(s)
		}
		if e.medium != "" {
			return m.Str(e.medium)
		}
		return m.Str("GPU")
	case "cleared":
		return m.Arr(1).Str("AllBlocksCleared")
	}
	panic("unknown kind " + e.kind)
}

// batch encodes [ts, events, rank 0].
func batch(events ...ev) []byte {
	m := mp{}.Arr(3).F64(1750000000.25).Arr(len(events))
	for _, e := range events {
		m = e.encode(m)
	}
	return m.Uint(0)
}

const testBS = 4

// blockTokens is the token block standing for content value c.
func blockTokens(c uint64) []uint32 {
	return []uint32{uint32(c), uint32(c >> 32), 7, 11}
}

// stored builds a stored event of blocks (content value, seq) and the matching
// refmodel blocks.
func stored(parent *uint64, blocks ...[2]uint64) (ev, [][2]uint64) {
	e := ev{kind: "stored", bs: testBS}
	if parent != nil {
		e.parent, e.hasParent = *parent, true
	}
	ref := make([][2]uint64, len(blocks))
	for i, b := range blocks {
		e.seqs = append(e.seqs, b[1])
		tok := blockTokens(b[0])
		e.tokens = append(e.tokens, tok...)
		ref[i] = [2]uint64{hash.Content(tok), b[1]}
	}
	return e, ref
}

func contents(vals ...uint64) []uint64 {
	out := make([]uint64, len(vals))
	for i, v := range vals {
		out[i] = hash.Content(blockTokens(v))
	}
	return out
}

// fakePub is an in-memory publisher: a replay buffer the substituted replay reads.
type fakePub struct {
	mu     sync.Mutex // a test may add batches while the subscriber runs
	buf    []fakeBatch
	fail   bool
	failN  int // the next failN replays fail
	asked  []uint64
	maxLen int
}

type fakeBatch struct {
	seq     uint64
	payload []byte
}

func (f *fakePub) add(seq uint64, payload []byte) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.buf = append(f.buf, fakeBatch{seq, payload})
	if f.maxLen > 0 && len(f.buf) > f.maxLen {
		f.buf = f.buf[len(f.buf)-f.maxLen:]
	}
}

func (f *fakePub) replay(_ context.Context, from uint64, fn func(uint64, []byte) bool) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.asked = append(f.asked, from)
	if f.fail || f.failN > 0 {
		f.failN--
		return errors.New("subscriber: replay from 1: no reply within 5s")
	}
	for _, b := range f.buf {
		if b.seq >= from && !fn(b.seq, b.payload) {
			return nil
		}
	}
	return nil
}

func newEngine(t *testing.T) *engine.Engine {
	t.Helper()
	e, err := engine.New(engine.Config{Shards: 2, JumpSize: 4})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	return e
}

// newTestSub returns a subscriber on e with a fake publisher, in the state right after
// a dial-mode connection.
func newTestSub(t *testing.T, e *engine.Engine, fp *fakePub, replay bool) *Subscriber {
	t.Helper()
	cfg := Config{Endpoint: "tcp://127.0.0.1:1", Worker: "w", Model: "m", Index: e, BlockSize: testBS}
	if replay {
		cfg.ReplayEndpoint = "tcp://127.0.0.1:2"
	}
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	s.replay = fp.replay
	s.up()
	s.synced = true // as after the first catch-up
	return s
}

// sendLive delivers a live message as the session loop would.
func sendLive(t *testing.T, s *Subscriber, seq uint64, payload []byte) {
	t.Helper()
	var sb [8]byte
	binary.BigEndian.PutUint64(sb[:], seq)
	if err := s.handle(context.Background(), [][]byte{nil, sb[:], payload}); err != nil {
		t.Fatal(err)
	}
	s.setState()
	s.publish()
}

// sameAnswers checks the engine's answers against the model's for every query.
func sameAnswers(t *testing.T, e *engine.Engine, ns string, m *refmodel.Model, queries [][]uint64) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := e.Barrier(ctx); err != nil {
		t.Fatal(err)
	}
	for _, q := range queries {
		got, err := e.FindMatchesIn(ctx, ns, q, nil)
		if err != nil {
			t.Fatal(err)
		}
		want := m.Query(q)
		sort.Slice(got, func(i, j int) bool {
			if got[i].Score != got[j].Score {
				return got[i].Score > got[j].Score
			}
			return got[i].Worker < got[j].Worker
		})
		if len(got) != len(want) {
			t.Fatalf("query %x: got %v, want %v", q, got, want)
		}
		for i := range got {
			if got[i].Worker != want[i].Worker || got[i].Score != want[i].Score || got[i].Size != want[i].Size {
				t.Fatalf("query %x: got %v, want %v", q, got, want)
			}
		}
	}
}
