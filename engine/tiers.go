package engine

import (
	"fmt"
	"math"

	"github.com/kvindex/kvindex/engine/internal/chain"
	"github.com/kvindex/kvindex/engine/internal/worker"
	"github.com/kvindex/kvindex/shard"
)

// Tier is the storage tier of a worker's block copy: the engine's device (GPU) memory,
// host memory, or disk and remote storage. An engine that offloads (vLLM's offloading
// connector, LMCache, SGLang's hierarchical cache) publishes stored and removed events
// per medium; an ingester maps each medium to a tier (package server has the defaults).
//
// Tiers are independent copies: a worker may hold one engine hash on several tiers at
// once, a removal names one tier, and a query reports how far each worker's prefix
// reaches when the slower tiers are counted too (Match.Tiers).
type Tier uint8

// The tiers, fastest first. TierDevice is the zero value: events without a tier are
// device events, as before tiers existed.
const (
	TierDevice Tier = iota
	TierHost
	TierDisk
	// NumTiers is the number of tiers.
	NumTiers = 3
)

var tierNames = [NumTiers]string{"device", "host", "disk"}

// String returns the tier's name: "device", "host" or "disk".
func (t Tier) String() string {
	if t < NumTiers {
		return tierNames[t]
	}
	return fmt.Sprintf("tier(%d)", uint8(t))
}

// ParseTier returns the tier named name ("device", "host" or "disk"), or an error
// wrapping ErrInvalidEvent.
func ParseTier(name string) (Tier, error) {
	for t, n := range tierNames {
		if n == name {
			return Tier(t), nil
		}
	}
	return 0, fmt.Errorf("%w: unknown tier %q (want device, host or disk)", ErrInvalidEvent, name)
}

// Weights gives each tier's value per block for Match.Weighted: a block that only a
// slower tier holds saves less than one in device memory (it must be loaded first).
type Weights [NumTiers]float64

// DefaultWeights are NVIDIA Dynamo's: device 1, a host extension 0.75, a disk extension
// 0.25.
var DefaultWeights = Weights{1, 0.75, 0.25}

// Validate reports whether every weight is finite and in [0, 1] (an error wrapping
// ErrInvalidConfig otherwise).
func (w Weights) Validate() error {
	for t, x := range w {
		if math.IsNaN(x) || x < 0 || x > 1 {
			return fmt.Errorf("%w: weight of tier %s is %v (want 0..1)", ErrInvalidConfig, Tier(t), x)
		}
	}
	return nil
}

// Weighted returns the match's weighted score: each leading block counted at the weight
// of the fastest tier that holds it, i.e. w[0]*Tiers[0] + w[1]*(Tiers[1]-Tiers[0]) +
// w[2]*(Tiers[2]-Tiers[1]). Predicted blocks count as device blocks.
func (m *Match) Weighted(w Weights) float64 {
	s, prev := 0.0, 0
	for t := range NumTiers {
		s += w[t] * float64(m.Tiers[t]-prev)
		prev = m.Tiers[t]
	}
	return s
}

// The engine's tiers are the worker package's: a tier converts to worker.Tier as is.
var _ [NumTiers]struct{} = [worker.NumTiers]struct{}{}

// tierLengths computes a multi-tier worker's cumulative tier lengths for a query when
// one of its components is gappy, from the components' scores (g) and its own tables,
// under its lock (see DESIGN.md, "Tiers"). Every component holds the positions before
// its score (its first miss), so tier t's length is at least the best score of the
// components of tiers 0..t; a gap-free component holds nothing past its first miss (the
// prefix-closure lemma), so past that only the gappy components are looked up, position
// by position, while one of them holds the position. size is the worker's size at the
// same moment.
func (e *Engine) tierLengths(q *query, p *worker.Worker, content []uint64, g *tierGroup) (tiers [NumTiers]int, size int, ok bool) {
	e.lockWorker(p)
	defer e.unlockWorker(p)
	if p.Dead() {
		return tiers, 0, false
	}
	var gappy [NumTiers]*worker.Worker // the gappy components, by tier
	size = p.Len()
	if p.HasHoles() || g.gappy {
		gappy[TierDevice] = p
	}
	p.Components(func(t worker.Tier, c *worker.Worker) {
		size += c.Len()
		if c.HasHoles() || g.gappy {
			gappy[t] = c
		}
	})
	best := 0
	for t := range NumTiers {
		best = max(best, g.scores[t])
		x := best
		for x < len(content) && q.heldByAny(e, gappy[:t+1], content, x) {
			x++
		}
		best = x
		tiers[t] = best
	}
	return tiers, size, true
}

// heldByAny reports whether one of comps (nil entries skipped; their worker locked)
// holds the query's key at position x.
func (q *query) heldByAny(e *Engine, comps []*worker.Worker, content []uint64, x int) bool {
	var k shard.Key
	computed := false
	for _, c := range comps {
		if c == nil {
			continue
		}
		if !computed {
			k, computed = shard.Key{Prefix: q.tierPrefix(q.ch, content, x), Pos: uint32(x), NS: q.ns}, true
		}
		if c.Holds(&e.env, k) {
			return true
		}
	}
	return false
}

// tierPrefix returns the prefix hash of the query's position x, computing the chain as
// deep as it is asked for once per query (q.tpre; collectTiers empties it).
func (q *query) tierPrefix(c *chain.Chain, content []uint64, x int) uint64 {
	if len(q.tpre) == 0 {
		q.tpre = append(q.tpre, content[0])
	}
	for h := q.tpre[len(q.tpre)-1]; len(q.tpre) <= x; {
		h = c.Step(h, content[len(q.tpre)], uint32(len(q.tpre)))
		q.tpre = append(q.tpre, h)
	}
	return q.tpre[x]
}

// tierGroup is collectTiers' scratch for one multi-tier worker: its components' scores
// (0 for a component that is not a candidate) and whether any candidate was gappy when
// admitted.
type tierGroup struct {
	stamp  uint32
	gappy  bool
	scores [NumTiers]int
}

// collectTiers appends one match per multi-tier worker among the query's candidates
// (every candidate whose worker has a tier link; collect has checked that each still
// names its worker).
//
// A component that is not gappy holds an initial segment of the query's positions (the
// prefix-closure lemma, DESIGN.md), so its score is its whole contribution, and the
// union of initial segments is the longest of them: tier t's cumulative length is the
// maximum score over the components of tiers 0..t. That needs every component of the
// worker to be gap-free, candidates or not (a gappy host copy that misses position 0 may
// still extend the device prefix); otherwise the worker's lengths come from its own
// tables (tierLengths).
func (e *Engine) collectTiers(q *query, content []uint64, dst []Match) []Match {
	now := e.workers()
	if len(q.tgrp) < len(now) {
		q.tgrp = make([]tierGroup, len(now)+len(now)/4)
		q.tstamp = 0
	}
	q.tstamp++
	if q.tstamp == 0 {
		clear(q.tgrp)
		q.tstamp = 1
	}
	q.tlist, q.tpre = q.tlist[:0], q.tpre[:0]
	for i := range q.cands {
		c := &q.cands[i]
		p := c.w.Primary()
		if p == nil || int(c.wid) >= len(now) || now[c.wid].Load() != c.w {
			continue
		}
		if int(p.ID()) >= len(q.tgrp) || now[p.ID()].Load() != p {
			continue // the worker was removed meanwhile
		}
		g := &q.tgrp[p.ID()]
		if g.stamp != q.tstamp {
			*g = tierGroup{stamp: q.tstamp}
			q.tlist = append(q.tlist, p)
		}
		g.scores[c.w.Tier()] = c.score
		g.gappy = g.gappy || c.gappy
	}
	for _, p := range q.tlist {
		g := &q.tgrp[p.ID()]
		gappy := g.gappy || p.TiersGappy()
		var tiers [NumTiers]int
		var size int
		if gappy {
			var ok bool
			if tiers, size, ok = e.tierLengths(q, p, content, g); !ok {
				continue
			}
		} else {
			best := 0
			for t := range NumTiers {
				best = max(best, g.scores[t])
				tiers[t] = best
			}
			size = p.TotalSize()
		}
		if s := tiers[NumTiers-1]; s > 0 {
			dst = append(dst, Match{Worker: p.Name(), Score: s, Size: size, Tiers: tiers})
		}
	}
	clear(q.tlist) // the pooled query must not keep workers alive
	q.tlist = q.tlist[:0]
	return dst
}
