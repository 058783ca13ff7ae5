package sim

import (
	"time"

	"github.com/kvindex/kvindex/hash"
)

// References are what no routing can beat, and how far apart a workload's reuses are,
// for one workload under one TimedConfig (its arrival times and fleet size).
type References struct {
	// Infinite is the hit rate of one cache shared by the fleet that never evicts;
	// Pooled that of one LRU cache of the whole fleet's blocks (Workers x Capacity),
	// as if the fleet were one engine with all its memory. Both count the blocks the
	// requests' outputs complete (Request.Next) as cached once generated, as the timed
	// engines do.
	Infinite, Pooled Ceiling
	// PooledBlocks is the pooled cache's size.
	PooledBlocks int64
	// Reuse describes, for the requests that reuse an earlier request's prefix, how far
	// back that request is.
	Reuse ReuseStats
}

// ReuseStats are a workload's reuse distances. A request reuses the last earlier
// request that touched the deepest block of its longest cached prefix (in an infinite
// cache); the gap is the time between their arrivals, and the new tokens are the KV
// the fleet computed in between with an infinite cache (prompt misses and outputs):
// an LRU cache keeps a reuse only if it holds at least that many tokens.
type ReuseStats struct {
	// Reusing of Requests requests reuse an earlier prefix.
	Reusing, Requests int
	// Gap quantiles in seconds, NewTokens quantiles in tokens.
	GapP50, GapP90             float64
	NewTokensP50, NewTokensP90 int64
}

// refSeed starts the references' prefix chains.
const refSeed = 0x7265666572656e63 // "referenc"

type lastTouch struct {
	req int32
	cum int64 // new tokens computed before that request finished
}

// Reference computes the workload's references under cfg.
func Reference(w *Workload, cfg TimedConfig) References {
	cfg = cfg.withDefaults()
	at := arrivals(w, cfg)
	out := References{PooledBlocks: int64(cfg.Workers) * int64(cfg.Capacity)}
	out.Infinite, out.Reuse = infiniteWithReuse(w, at)
	out.Pooled = pooledLRU(w, out.PooledBlocks)
	return out
}

// chain appends to dst the prefix keys of the request's prompt blocks, then those of
// the blocks its output completes.
func chain(dst []uint64, r *Request) []uint64 {
	h := uint64(refSeed)
	for _, b := range r.Blocks {
		h = hash.Next(h, b)
		dst = append(dst, h)
	}
	for _, b := range r.Next {
		h = hash.Next(h, b)
		dst = append(dst, h)
	}
	return dst
}

func infiniteWithReuse(w *Workload, at []time.Duration) (Ceiling, ReuseStats) {
	seen := make(map[uint64]lastTouch, w.Blocks/4)
	var c Ceiling
	var rs ReuseStats
	var gaps []float64
	var news []float64
	var cum int64
	var keys []uint64
	for i := range w.Requests {
		r := &w.Requests[i]
		keys = chain(keys[:0], r)
		prompt := len(r.Blocks)
		hit := 0
		for hit < prompt {
			if _, ok := seen[keys[hit]]; !ok {
				break
			}
			hit++
		}
		if hit > 0 {
			last := seen[keys[hit-1]]
			gaps = append(gaps, (at[i] - at[last.req]).Seconds())
			news = append(news, float64(cum-last.cum))
			rs.Reusing++
		}
		reused := reusable(hit, r.Tokens, w.BlockSize)
		cum += int64(r.Tokens-reused*w.BlockSize) + int64(max(r.Output, 1))
		for _, k := range keys {
			seen[k] = lastTouch{req: int32(i), cum: cum}
		}
		c.HitBlocks += int64(hit)
		c.Blocks += int64(prompt)
		c.Tokens += int64(r.Tokens)
		c.ReusedTokens += int64(reused * w.BlockSize)
	}
	rs.Requests = len(w.Requests)
	rs.GapP50, rs.GapP90 = quantileOf(gaps, 0.5), quantileOf(gaps, 0.9)
	rs.NewTokensP50, rs.NewTokensP90 = int64(quantileOf(news, 0.5)), int64(quantileOf(news, 0.9))
	return c, rs
}

// pooledLRU is the hit rate of one LRU cache of capacity blocks: a request reuses the
// longest prefix it holds, then all its blocks become the most recently used (its
// head last, so that its tail goes first, as vLLM frees a request tail first).
func pooledLRU(w *Workload, capacity int64) Ceiling {
	n := int(min(capacity, int64(MaxFleetBlocks)))
	slot := make(map[uint64]int32, min(n, 1<<20))
	keys := make([]uint64, 0, min(n, 1<<20))
	l := newLRUList(n)
	var c Ceiling
	var chainKeys []uint64
	for i := range w.Requests {
		r := &w.Requests[i]
		chainKeys = chain(chainKeys[:0], r)
		prompt := len(r.Blocks)
		hit := 0
		for hit < prompt {
			if _, ok := slot[chainKeys[hit]]; !ok {
				break
			}
			hit++
		}
		for k := len(chainKeys) - 1; k >= 0; k-- {
			key := chainKeys[k]
			if s, ok := slot[key]; ok {
				l.unlink(s)
				l.pushTail(s)
				continue
			}
			var s int32
			if len(keys) < n {
				s = int32(len(keys))
				keys = append(keys, key)
			} else {
				s, _ = l.head()
				l.unlink(s)
				delete(slot, keys[s])
				keys[s] = key
			}
			slot[key] = s
			l.pushTail(s)
		}
		c.HitBlocks += int64(hit)
		c.Blocks += int64(prompt)
		c.Tokens += int64(r.Tokens)
		c.ReusedTokens += int64(reusable(hit, r.Tokens, w.BlockSize) * w.BlockSize)
	}
	return c
}
