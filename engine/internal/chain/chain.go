// Package chain is the engine's prefix chain: it names each position of a sequence of
// content hashes by one word, the key the index is probed with (the keyed chain, or
// SPEC's XXH3 chain). A Chain is immutable after New but for its table of position
// multipliers, which grows by copy-on-write behind an atomic pointer: every method is
// safe for concurrent use by any goroutine (event appliers and queriers share one), and
// there is no owner to name. The design and its figures follow.
package chain

import (
	"math/bits"
	"sync/atomic"

	"github.com/kvindex/kvindex/hash"
	"github.com/kvindex/kvindex/internal/table"
)

// The prefix chain names each position of a sequence of content hashes by one word, the
// key the index is probed with: P(0) = c(0), and P(j) is a function of P(j-1), c(j) and j.
// It is internal (answers, events and the op log speak content hashes and engine
// hashes; nothing outside the engine sees a prefix word), so the engine picks it.
//
// The keyed chain (the default) is an incremental hash: P(j) = P(j-1) + mum(c(j) ^ k,
// T(j)) mod 2^64, where mum folds the 128-bit product (wyhash's step), k is a secret word
// and T(j) a secret odd multiplier per position (chainTable of them precomputed, the rest
// derived on the fly). The terms of a query are independent of each other, so the CPU
// computes them in parallel and the serial part of the chain is one add per block: 0.89
// ns a block against 4.13 for SPEC's XXH3 chain on a 1,500-block query (engine's BenchmarkChain),
// the hashing that a query held that deep spent most of its time on. Two distinct
// sequences of one length collide only if their terms' differences sum to zero, and
// every term is a product with an independent secret multiplier: a client that does not
// know the key cannot aim at that sum, unlike with an unkeyed step (SPEC's chain is
// public: a 2^32 birthday search finds a collision offline). engine's TestChainCollisions checks structured
// families (one or two positions changed, swaps, top-bit flips, which cancel in pairs in
// any linear chain mod 2^64).
//
// The spec chain is SPEC's XXH3 chain (hash.Next). An engine uses it when
// Config.SpecChain says so or when it is restored from a snapshot written with it
// (versions 1 and 2 were). Snapshots carry the chain's key (engine's snapshot.go), so a
// restored engine probes with the prefixes it saved.
type Chain struct {
	spec bool
	// given marks Given: the "content" a query hands it are already the positions'
	// prefix hashes (a client's rolling hashes, which are SPEC's chain), so P(j) is
	// the j-th word itself. Only Given sets it, and it implies spec.
	given bool
	key   table.Seed // the keyed chain's secret; its Hash64 gives k and T(j)
	k     uint64
	// tab holds the precomputed position multipliers T(0..n), shared by copies of the
	// chain: it grows, doubling, to cover the deepest position the engine has hashed, up
	// to chainTable, so that an engine whose keys and queries stay shallow keeps a small
	// table (a few KiB instead of 32). Readers load the current table once per fill or
	// step; a growth publishes a new one, and a table replaced while a reader holds it
	// stays valid (T(j) never changes).
	tab *atomic.Pointer[[]uint64]
}

// chainTable is how many position multipliers are precomputed at most: 32 KiB, deeper
// than every query of the trace-driven logs (1,905 blocks at most); a deeper position
// derives its multiplier (two more multiplies). chainTableMin is the first table's size.
const (
	chainTable    = 4096
	chainTableMin = 256
)

// TableMax is chainTable, for tests that must cross it.
const TableMax = chainTable

// New returns the keyed chain with secret s, or the spec chain.
func New(spec bool, s table.Seed) Chain {
	c := Chain{spec: spec, key: s}
	if spec {
		return c
	}
	c.k = s.Hash64(^uint64(0))
	c.tab = new(atomic.Pointer[[]uint64])
	t := c.grow(nil, chainTableMin)
	c.tab.Store(&t)
	return c
}

// grow returns t extended to n multipliers.
func (c *Chain) grow(t []uint64, n int) []uint64 {
	nt := make([]uint64, n)
	copy(nt, t)
	for j := len(t); j < n; j++ {
		nt[j] = c.key.Hash64(uint64(j)) | 1
	}
	return nt
}

// table returns the multipliers, covering position n-1 if n <= chainTable, growing the
// table to the next power of two that does.
func (c *Chain) table(n int) []uint64 {
	for {
		p := c.tab.Load()
		t := *p
		if n <= len(t) || len(t) == chainTable {
			return t
		}
		nt := c.grow(t, min(chainTable, max(2*len(t), 1<<bits.Len(uint(n-1)))))
		if c.tab.CompareAndSwap(p, &nt) {
			return nt
		}
		// another goroutine grew it meanwhile: take its table (or grow that one)
	}
}

// mult returns T(j).
func (c *Chain) mult(j uint32) uint64 {
	if t := *c.tab.Load(); int(j) < len(t) {
		return t[j]
	}
	return c.multPast(j)
}

// multPast is mult past the table: it grows the table to cover j, or derives T(j)
// beyond chainTable.
func (c *Chain) multPast(j uint32) uint64 {
	if t := c.table(int(j) + 1); int(j) < len(t) {
		return t[j]
	}
	return c.key.Hash64(uint64(j)) | 1
}

// Given is the chain of a query by prefix hashes (an engine on the spec chain only):
// it hands each position's word back as its prefix, so the query's phases, which
// extend prefixes through a Chain, probe exactly the keys the client named.
var Given = Chain{spec: true, given: true}

// Step returns P(pos) from prev = P(pos-1) and the content hash at pos (pos >= 1).
func (c *Chain) Step(prev, content uint64, pos uint32) uint64 {
	if c.spec {
		if c.given {
			return content
		}
		return hash.Next(prev, content)
	}
	hi, lo := bits.Mul64(content^c.k, c.mult(pos))
	return prev + (hi ^ lo)
}

// Mults returns, for the keyed chain, its key and the multipliers of positions pos to
// pos+n-1 where its table holds them all, so that a caller stepping a run of n blocks
// does Step's arithmetic inline (hi, lo := bits.Mul64(content^k, m[j]); prefix +=
// hi ^ lo): a call per block in a loop makes Go spill the loop's registers around it
// (every register is the caller's to save). ok is false for SPEC's chain and the given
// one, and past the table; the caller then steps with Step.
func (c *Chain) Mults(pos uint32, n int) (k uint64, m []uint64, ok bool) {
	if c.spec {
		return 0, nil, false
	}
	t := *c.tab.Load()
	if end := int(pos) + n; end <= len(t) {
		return c.k, t[pos:end:end], true
	}
	return 0, nil, false
}

// Fill sets pre[i] = P(i) for from <= i < len(pre), given pre[from-1] (from >= 1) and
// content covering len(pre) positions.
func (c *Chain) Fill(pre, content []uint64, from int) {
	if from >= len(pre) {
		return
	}
	h := pre[from-1]
	if c.given {
		copy(pre[from:], content[from:len(pre)])
		return
	}
	if c.spec {
		for i := from; i < len(pre); i++ {
			h = hash.Next(h, content[i])
			pre[i] = h
		}
		return
	}
	tab := c.table(len(pre))
	n := min(len(pre), len(tab))
	k := c.k
	if from < n {
		t, cs, ps := tab[:n], content[:n], pre[:n]
		for i := from; i < n; i++ {
			hi, lo := bits.Mul64(cs[i]^k, t[i])
			h += hi ^ lo
			ps[i] = h
		}
		from = n
	}
	for i := from; i < len(pre); i++ {
		h = c.Step(h, content[i], uint32(i))
		pre[i] = h
	}
}

// Spec reports whether c is SPEC's chain.
func (c *Chain) Spec() bool { return c.spec }

// Key is the keyed chain's secret (a snapshot carries it; New(false, Key()) is c again).
func (c *Chain) Key() table.Seed { return c.key }
