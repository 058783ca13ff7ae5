package engine

import (
	"slices"
	"sort"

	"github.com/kvindex/kvindex/engine/internal/worker"
)

// Digests: an order-independent summary of what each worker holds, so that two replicas
// (or a replica and a snapshot) can tell which workers they disagree on without
// exchanging the blocks.
//
// What a digest covers: the worker's entries, each an engine hash (Block.Seq) held in a
// namespace, on a tier, in a KV-cache group (0 for a worker that declared none), at a
// position (its block's depth; for a declared group, its end in units). Two tables hold
// the same entries exactly when their digests are equal, up to 64-bit collisions. The
// prefix a block is held under is not in it: the engine names prefixes by a chain keyed
// per engine, which two replicas do not share, so a seq held at the same depth under
// another parent on one replica is not told apart. Engines name blocks by a hash of the
// tokens and of the parent's hash (vLLM, SGLang), so a seq under another parent is in
// practice another seq.
//
// How: each entry contributes term(seq, position), and each table keeps, per namespace,
// the wrapping sum of its entries' terms and their count (a worker.DigestCell), updated
// where an entry becomes held or stops being held (package engine/internal/worker):
// O(1) per entry, no allocation but the first entry of a namespace other than the
// default. A digest is read under the worker's
// mutex by combining its cells: each non-empty cell (tier, group, namespace name, sum,
// count) is mixed into one 64-bit value, and the worker's digest is the sum of its
// cells' values, so that it too is independent of the order the entries arrived in.
// None of it depends on the engine's seeds: replicas with different seeds and shard
// counts, the locked index, and a restored snapshot agree on equal state.
//
// Not keyed by a secret: a client that chooses seqs could make two different holdings
// of a worker sum alike. A digest is a consistency check between replicas fed the same
// events, not a proof against a hostile publisher.

// Digest summarises a set of held entries.
type Digest struct {
	// Sum is the order-independent digest: 0 when Blocks is 0.
	Sum uint64
	// Blocks is how many entries it covers ((group, tier, seq) triples: the worker's
	// size, as WorkerSize).
	Blocks int
}

// WorkerDigest is one worker's digest, over all of it and per namespace.
type WorkerDigest struct {
	// Digest covers every namespace: its Sum is the wrapping sum of the namespaces'.
	Digest
	// Namespaces has a digest per namespace the worker holds blocks in ("" is the
	// default namespace).
	Namespaces map[string]Digest
}

// nameHash is a stable 64-bit hash of a name (FNV-1a, finalised), the same in every
// process.
func nameHash(s string) uint64 {
	h := uint64(0xcbf29ce484222325)
	for i := 0; i < len(s); i++ {
		h ^= uint64(s[i])
		h *= 0x100000001b3
	}
	return worker.Fmix64(h)
}

// workerDigest is w's digest (w locked). names maps namespace ids to names (nil: look
// them up when the worker holds blocks outside the default namespace).
func (e *Engine) workerDigest(w *worker.Worker, names map[uint32]string) (WorkerDigest, map[uint32]string) {
	out := WorkerDigest{Namespaces: map[string]Digest{}}
	def := nameHash("")
	w.EachDigestCell(func(ns uint32, tier worker.Tier, group int, c worker.DigestCell) {
		name, h := "", def
		if ns != 0 {
			if names == nil {
				names = e.namespaceNames()
			}
			name = names[ns]
			h = nameHash(name)
		}
		v := c.Value(tier, group, h)
		d := out.Namespaces[name]
		d.Sum += v
		d.Blocks += int(c.N)
		out.Namespaces[name] = d
		out.Sum += v
		out.Blocks += int(c.N)
	})
	return out, names
}

// Digest returns the digest of what worker holds (see WorkerDigest), read under its
// lock: it covers every event applied before the call, whether or not the shards have
// applied it yet. The second result is false for an unknown worker.
func (e *Engine) Digest(worker string) (WorkerDigest, bool) {
	for {
		w := e.lookup(worker)
		if w == nil {
			return WorkerDigest{}, false
		}
		e.lockWorker(w)
		if w.Dead() { // removed since the lookup: look again
			e.unlockWorker(w)
			continue
		}
		d, _ := e.workerDigest(w, nil)
		e.unlockWorker(w)
		return d, true
	}
}

// Digests returns every known worker's digest, each read under its lock.
func (e *Engine) Digests() map[string]WorkerDigest {
	out := map[string]WorkerDigest{}
	var names map[uint32]string
	e.eachLiveWorker(func(wk *worker.Worker) { out[wk.Name()], names = e.workerDigest(wk, names) })
	return out
}

// NamespaceDigests combines per namespace the digests of every worker (keyed by worker
// name, so that two workers swapping their blocks differ): two engines holding the same
// blocks for the same workers in a namespace have equal digests for it.
func NamespaceDigests(ws map[string]WorkerDigest) map[string]Digest {
	out := map[string]Digest{}
	for name, wd := range ws {
		wh := nameHash(name)
		for ns, d := range wd.Namespaces {
			o := out[ns]
			o.Sum += worker.Fmix64(d.Sum ^ wh)
			o.Blocks += d.Blocks
			out[ns] = o
		}
	}
	return out
}

// DiffDigests compares two engines' digests (Digests of each) and returns the names of
// the workers whose digests differ, or that one of them does not know while the other
// holds blocks for, sorted. A worker known to one and empty or absent on the other does
// not differ.
func DiffDigests(a, b map[string]WorkerDigest) []string {
	var out []string
	for name, da := range a {
		db := b[name]
		if da.Sum != db.Sum || da.Blocks != db.Blocks {
			out = append(out, name)
		}
	}
	for name, db := range b {
		if _, ok := a[name]; !ok && db.Blocks != 0 {
			out = append(out, name)
		}
	}
	sort.Strings(out)
	return slices.Compact(out)
}
