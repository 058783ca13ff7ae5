package worker

import "github.com/kvindex/kvindex/internal/table"

// ValidStore checks the parts of a stored event that do not depend on state: no seq
// twice, no seq equal to the parent. Holder of o (the events' applier).
func (o *Outbox) ValidStore(env *Env, parent uint64, hasParent bool, blocks []Block) bool {
	if len(blocks) <= 16 {
		for i := range blocks {
			if hasParent && blocks[i].Seq == parent {
				return false
			}
			for j := i + 1; j < len(blocks); j++ {
				if blocks[i].Seq == blocks[j].Seq {
					return false
				}
			}
		}
		return true
	}
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
