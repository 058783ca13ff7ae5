package tokenize

import (
	"hash/maphash"
	"math/bits"
	"slices"
	"strings"
	"sync/atomic"
)

// The two look-ups on Encode's path, vocabulary by piece and merge by pair of ids, use
// open-addressed tables with linear probing instead of Go maps: a hit costs one cache
// line (a slot holds a short key inline) where a map of strings costs a control group,
// a slot and the key's bytes elsewhere. Both are built once at New and only read after.

// vocabTable maps a piece of text to its id. Keys of up to vocabInline bytes are stored
// in the slot; longer ones are compared with Tokenizer.idText.
type vocabTable struct {
	seed  maphash.Seed
	slots []vocabSlot
	mask  uint64
	long  []string // id -> key, for keys longer than vocabInline
}

const vocabInline = 22

type vocabSlot struct {
	tag uint32 // the hash's high bits, never 0 in a used slot
	id  int32
	n   uint8
	key [vocabInline + 1]byte
}

func newVocabTable(keys map[string]int32) vocabTable {
	size := 1 << bits.Len(uint(2*len(keys)))
	t := vocabTable{seed: maphash.MakeSeed(), slots: make([]vocabSlot, size), mask: uint64(size - 1)}
	maxID := int32(0)
	for _, id := range keys {
		maxID = max(maxID, id)
	}
	t.long = make([]string, maxID+1)
	for k, id := range keys {
		h := maphash.String(t.seed, k)
		s := vocabSlot{tag: tagOf(h), id: id, n: uint8(min(len(k), vocabInline+1))}
		copy(s.key[:], k)
		if len(k) > vocabInline {
			t.long[id] = k
		}
		for i := h & t.mask; ; i = (i + 1) & t.mask {
			if t.slots[i].tag == 0 {
				t.slots[i] = s
				break
			}
		}
	}
	return t
}

func tagOf(h uint64) uint32 { return uint32(h>>32) | 1 }

func (t *vocabTable) get(k string) (int32, bool) {
	h := maphash.String(t.seed, k)
	tag := tagOf(h)
	for i := h & t.mask; ; i = (i + 1) & t.mask {
		s := &t.slots[i]
		switch {
		case s.tag == 0:
			return 0, false
		case s.tag != tag:
			continue
		case len(k) <= vocabInline:
			if int(s.n) == len(k) && string(s.key[:len(k)]) == k {
				return s.id, true
			}
		case s.n == vocabInline+1 && t.long[s.id] == k:
			return s.id, true
		}
	}
}

// mergeTable maps a pair of ids (pairKey) to rank<<32 | merged id.
type mergeTable struct {
	slots []mergeSlot
	mask  uint64
	shift uint
}

type mergeSlot struct{ key, val uint64 }

const emptyPair = ^uint64(0) // ids are below 2^31: no pair has this key

func newMergeTable(m map[uint64]uint64) mergeTable {
	size := 1 << bits.Len(uint(2*len(m)))
	t := mergeTable{slots: make([]mergeSlot, size), mask: uint64(size - 1), shift: uint(64 - bits.Len(uint(size-1)))}
	for i := range t.slots {
		t.slots[i].key = emptyPair
	}
	for k, v := range m {
		for i := t.home(k); ; i = (i + 1) & t.mask {
			if t.slots[i].key == emptyPair {
				t.slots[i] = mergeSlot{k, v}
				break
			}
		}
	}
	return t
}

// home is a Fibonacci hash of the pair: ids are dense small integers, which the
// multiplication spreads over the table.
func (t *mergeTable) home(k uint64) uint64 {
	return (k * 0x9E3779B97F4A7C15) >> t.shift & t.mask
}

func (t *mergeTable) get(k uint64) (uint64, bool) {
	for i := t.home(k); ; i = (i + 1) & t.mask {
		s := &t.slots[i]
		if s.key == k {
			return s.val, true
		}
		if s.key == emptyPair {
			return 0, false
		}
	}
}

// pieceCache remembers the ids of pieces that took the merge path (a word missing from
// the vocabulary as one entry, a run of CJK characters): chats repeat their system
// prompt and earlier turns in every request, so most such pieces come back. Each piece
// has two candidate slots; a slot, once filled, is never replaced (a piece whose slots
// are both taken is merged every time), so the steady state allocates nothing and
// concurrent encodings need no lock (an immutable entry behind an atomic pointer, set by
// compare-and-swap). Bounded: cacheSlots entries of pieces up to cacheMaxPiece bytes,
// each fill one allocation.
type pieceCache struct {
	seed  maphash.Seed
	slots [cacheSlots]atomic.Pointer[cacheEntry]
}

const (
	cacheSlots    = 8192
	cacheMaxPiece = 64
)

type cacheEntry struct {
	piece string
	ids   []uint32
}

// candidates are piece's two slots.
func (c *pieceCache) candidates(piece string) (*atomic.Pointer[cacheEntry], *atomic.Pointer[cacheEntry]) {
	h := maphash.String(c.seed, piece)
	return &c.slots[h&(cacheSlots-1)], &c.slots[(h>>32)&(cacheSlots-1)]
}

// get appends piece's cached ids to dst, if the cache holds them.
func (c *pieceCache) get(dst []uint32, piece string) ([]uint32, bool) {
	a, b := c.candidates(piece)
	for _, s := range [2]*atomic.Pointer[cacheEntry]{a, b} {
		if e := s.Load(); e != nil && e.piece == piece {
			return append(dst, e.ids...), true
		}
	}
	return dst, false
}

// put stores piece's ids in one of its slots that is still empty, if any.
func (c *pieceCache) put(piece string, ids []uint32) {
	a, b := c.candidates(piece)
	if a.Load() != nil && b.Load() != nil {
		return
	}
	e := &cacheEntry{piece: strings.Clone(piece), ids: slices.Clone(ids)}
	if !a.CompareAndSwap(nil, e) {
		b.CompareAndSwap(nil, e)
	}
}
