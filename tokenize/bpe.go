package tokenize

import (
	"fmt"
	"unicode/utf8"

	"golang.org/x/text/unicode/norm"
)

// bpe is a BPE model: a vocabulary and a merge table. In a byte-level model the
// vocabulary is keyed by the raw bytes each entry stands for (not by GPT-2's printable
// stand-ins), so a piece of text is looked up and merged as it is.
type bpe struct {
	vocab map[string]int32 // used at load; Encode reads vtab
	vtab  vocabTable
	// merges maps a pair of ids (left<<32 | right) to rank<<32 | merged id. The rank is
	// the merge's line in the merges list: the lower, the earlier it applies.
	merges mergeTable
	// byteIDs: byte-level, the id of each single byte; with byte fallback, the id of
	// <0xXX>; -1 where the vocabulary has none.
	byteIDs      [256]int32
	byteLevel    bool
	byteFallback bool
	ignoreMerges bool // an entire piece found in the vocabulary is one token
	fuseUnk      bool
	unk          int32 // -1: none
	// direct[id] says BPE of the entry's own text yields exactly id, so a piece equal to
	// an entry is encoded by one look-up (computed once at load, read-only after).
	direct []bool
	// cache holds the ids of recent pieces that took the merge path (nil while direct
	// is computed).
	cache *pieceCache
}

// symbol is one node of the doubly linked list a piece is merged in. id -1 marks a
// character missing from the vocabulary (replaced by byte fallback or unk at the end),
// -2 a symbol merged into its left neighbour.
type symbol struct {
	id         int32
	prev, next int32
	start, end int32 // bytes of the piece it covers
}

// mergeItem is a candidate merge of the symbol at pos with its right neighbour. It is
// still valid when popped only if both still carry the ids it was computed from.
type mergeItem struct {
	rank        uint32
	pos         int32
	left, right int32
	merged      int32
	_           int32
}

// scratch is one encoding's working memory, reused through Tokenizer.pool, so that the
// steady state allocates nothing.
type scratch struct {
	syms  []symbol
	heap  []mergeItem
	norm  [2][]byte // normalize's
	piece []byte    // preTokenizer.prepare's
	word  []byte    // preTokenizer.piece's
	iter  norm.Iter
}

func pairKey(a, b int32) uint64 { return uint64(uint32(a))<<32 | uint64(uint32(b)) }

// word appends the ids of one piece to dst.
func (m *bpe) word(dst []uint32, w string, sc *scratch) ([]uint32, error) {
	if len(w) == 0 {
		return dst, nil
	}
	if id, ok := m.vtab.get(w); ok && (m.ignoreMerges || m.direct[id]) {
		return append(dst, uint32(id)), nil
	}
	cacheable := len(w) <= cacheMaxPiece && m.cache != nil
	if cacheable {
		var hit bool
		if dst, hit = m.cache.get(dst, w); hit {
			return dst, nil
		}
	}
	start := len(dst)
	m.merge(w, sc)
	dst, err := m.emit(dst, w, sc)
	if err == nil && cacheable {
		m.cache.put(w, dst[start:])
	}
	return dst, err
}

// merge runs BPE on w, leaving the result in sc.syms (symbol 0 is always the first).
func (m *bpe) merge(w string, sc *scratch) {
	syms := sc.syms[:0]
	if m.byteLevel {
		for i := 0; i < len(w); i++ {
			syms = append(syms, symbol{id: m.byteIDs[w[i]], start: int32(i), end: int32(i + 1)})
		}
	} else {
		for i := 0; i < len(w); {
			_, n := utf8.DecodeRuneInString(w[i:])
			id, ok := m.vtab.get(w[i : i+n])
			if !ok {
				id = -1
			}
			syms = append(syms, symbol{id: id, start: int32(i), end: int32(i + n)})
			i += n
		}
	}
	for i := range syms {
		syms[i].prev, syms[i].next = int32(i-1), int32(i+1)
	}
	syms[len(syms)-1].next = -1
	sc.syms = syms

	h := sc.heap[:0]
	for i := 0; i+1 < len(syms); i++ {
		h = m.push(h, syms, int32(i))
	}
	for len(h) > 0 {
		it := h[0]
		h = heapPop(h)
		s := &syms[it.pos]
		if s.id != it.left || s.next < 0 || syms[s.next].id != it.right {
			continue // stale: one side has merged since
		}
		r := &syms[s.next]
		s.id, s.end, s.next = it.merged, r.end, r.next
		r.id = -2
		if s.next >= 0 {
			syms[s.next].prev = it.pos
			h = m.push(h, syms, it.pos)
		}
		if s.prev >= 0 {
			h = m.push(h, syms, s.prev)
		}
	}
	sc.heap = h
}

// push adds the merge of syms[pos] with its right neighbour, if the table has one.
func (m *bpe) push(h []mergeItem, syms []symbol, pos int32) []mergeItem {
	l, r := syms[pos].id, syms[syms[pos].next].id
	if l < 0 || r < 0 {
		return h
	}
	v, ok := m.merges.get(pairKey(l, r))
	if !ok {
		return h
	}
	return heapPush(h, mergeItem{rank: uint32(v >> 32), pos: pos, left: l, right: r, merged: int32(uint32(v))})
}

// emit appends the merged symbols' ids, resolving characters missing from the vocabulary
// by byte fallback (each of their bytes as <0xXX>) or the unknown token.
func (m *bpe) emit(dst []uint32, w string, sc *scratch) ([]uint32, error) {
	syms := sc.syms
	lastUnk := false
	for i := int32(0); i >= 0; i = syms[i].next {
		s := syms[i]
		if s.id >= 0 {
			dst = append(dst, uint32(s.id))
			lastUnk = false
			continue
		}
		if m.byteFallback && m.fallbackOK(w[s.start:s.end]) {
			for j := s.start; j < s.end; j++ {
				dst = append(dst, uint32(m.byteIDs[w[j]]))
			}
			lastUnk = false
			continue
		}
		if m.unk < 0 {
			return dst, fmt.Errorf("tokenize: %q is not in the vocabulary and the model has no unknown token", w[s.start:s.end])
		}
		if !(m.fuseUnk && lastUnk) {
			dst = append(dst, uint32(m.unk))
		}
		lastUnk = true
	}
	return dst, nil
}

func (m *bpe) fallbackOK(b string) bool {
	for i := 0; i < len(b); i++ {
		if m.byteIDs[b[i]] < 0 {
			return false
		}
	}
	return true
}

// less orders merges by rank, then leftmost first (as Hugging Face's tokenizers break ties).
func (a mergeItem) less(b mergeItem) bool {
	return a.rank < b.rank || (a.rank == b.rank && a.pos < b.pos)
}

func heapPush(h []mergeItem, it mergeItem) []mergeItem {
	h = append(h, it)
	i := len(h) - 1
	for i > 0 {
		p := (i - 1) / 2
		if !h[i].less(h[p]) {
			break
		}
		h[i], h[p] = h[p], h[i]
		i = p
	}
	return h
}

func heapPop(h []mergeItem) []mergeItem {
	n := len(h) - 1
	h[0] = h[n]
	h = h[:n]
	i := 0
	for {
		l := 2*i + 1
		if l >= n {
			break
		}
		c := l
		if r := l + 1; r < n && h[r].less(h[l]) {
			c = r
		}
		if !h[c].less(h[i]) {
			break
		}
		h[i], h[c] = h[c], h[i]
		i = c
	}
	return h
}

// computeDirect fills m.direct: which entries BPE reproduces from their own text.
func (m *bpe) computeDirect(size int) {
	m.direct = make([]bool, size)
	sc := &scratch{}
	var out []uint32
	for text, id := range m.vocab {
		m.merge(text, sc)
		var err error
		out, err = m.emit(out[:0], text, sc)
		m.direct[id] = err == nil && len(out) == 1 && out[0] == uint32(id)
	}
}
