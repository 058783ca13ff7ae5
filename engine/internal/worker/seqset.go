package worker

import "github.com/kvindex/kvindex/internal/table"

// ValidStore checks the parts of a stored event that do not depend on state: no seq
// twice, no seq equal to the parent. Holder of o (the events' applier).
//
// Up to 16 blocks it compares every pair. Past that (a store averages 92 blocks on the
// conversation trace) it marks each seq's bit in a 4,096-bit filter by twelve of its
// bits and compares a seq with the ones before it only where its bit was set already
// (about one such seq in an event of 92); engine hashes are uniform, so that is the
// whole check. A peer that picks seqs whose bits collide gets no more than 4n
// comparisons of this before the check starts over with the seeded scratch set
// (validSet), so its work stays linear. For 92 blocks, 228-235 ns against the set's
// 259-274 (go test -run '^$' -bench ValidStore ./engine/internal/worker/). A store runs
// it only where it finds a seq held, or on a tier or under a parent that its table
// cannot tell by (Worker.Store): on the trace logs, never.
func (o *Outbox) ValidStore(env *Env, parent uint64, hasParent bool, blocks []Block) bool {
	n := len(blocks)
	if n <= 16 {
		for i := range blocks {
			if hasParent && blocks[i].Seq == parent {
				return false
			}
			for j := i + 1; j < n; j++ {
				if blocks[i].Seq == blocks[j].Seq {
					return false
				}
			}
		}
		return true
	}
	if n > seqFilterMax {
		return o.validSet(env, parent, hasParent, blocks)
	}
	var filter [seqFilterBits / 64]uint64
	bits := o.bits[:0]
	work := 0
	for i := range blocks {
		seq := blocks[i].Seq
		if hasParent && seq == parent {
			return false
		}
		x := uint16((seq ^ seq>>29 ^ seq>>47) % seqFilterBits)
		w, m := &filter[x/64], uint64(1)<<(x%64)
		if *w&m != 0 {
			for j, y := range bits {
				if y == x && blocks[j].Seq == seq {
					o.bits = bits
					return false
				}
			}
			if work += i; work > 4*n {
				o.bits = bits
				return o.validSet(env, parent, hasParent, blocks)
			}
		}
		*w |= m
		bits = append(bits, x)
	}
	o.bits = bits
	return true
}

// seqFilterBits is the filter's size, and seqFilterMax the most blocks an event may
// have for the filter (above that it would fill and send most seqs to a comparison).
const (
	seqFilterBits = 4096
	seqFilterMax  = 512
)

// validSet is ValidStore's check by the seeded scratch set (seqSet): for events too
// long for the filter, and where the filter's comparisons pass their budget.
func (o *Outbox) validSet(env *Env, parent uint64, hasParent bool, blocks []Block) bool {
	seen := &o.seen
	seen.reset(len(blocks))
	defer seen.release()
	for _, b := range blocks {
		if hasParent && b.Seq == parent || !seen.add(&env.Seed, b.Seq) {
			return false
		}
	}
	return true
}

// seqSet is a scratch set of seqs for the duplicate check of one event: open addressing
// over at least twice as many slots as the event has blocks, emptied in O(1) by bumping
// gen (a slot is used only while its stamp equals gen).
type seqSet struct {
	slots []seqSetSlot
	gen   uint32
}

type seqSetSlot struct {
	seq uint64
	gen uint32
}

// seqSetKeep is the largest set kept between events; a bigger event's set is dropped
// after its check, so a rare huge event does not pin its memory.
const seqSetKeep = 1 << 12

func (s *seqSet) reset(n int) {
	c := 32
	for c < 2*n {
		c *= 2
	}
	if len(s.slots) < c {
		s.slots = make([]seqSetSlot, c)
		s.gen = 0
	}
	s.gen++
	if s.gen == 0 { // the stamps wrapped: start over
		clear(s.slots)
		s.gen = 1
	}
}

func (s *seqSet) release() {
	if len(s.slots) > seqSetKeep {
		*s = seqSet{}
	}
}

// add inserts seq and reports whether it was absent.
func (s *seqSet) add(seed *table.Seed, seq uint64) bool {
	for i := table.Home(seed.Hash64(seq), len(s.slots)); ; i = table.Next(i, len(s.slots)) {
		e := &s.slots[i]
		if e.gen != s.gen {
			*e = seqSetSlot{seq: seq, gen: s.gen}
			return true
		}
		if e.seq == seq {
			return false
		}
	}
}
