package shard

// The ops a Delta carries.
const (
	// OpAdd makes the delta's worker a member of its key.
	OpAdd uint8 = iota + 1
	// OpRemove takes the delta's worker out of its key.
	OpRemove
	// OpBarrier is a barrier token: the delta's id names it in the engine's Barriers.
	OpBarrier
)

// Delta is one message on a shard's ring: a membership change of one worker at one key
// (named by its fingerprint, see Hash), or a barrier token (OpBarrier; its id names the
// barrier in a Barriers table). It is 12 bytes, 4-byte aligned: the fingerprint in two
// words and the op in the top two bits of the id's word, so that a ring cell (the delta
// and its 4-byte sequence word) is 16 bytes, four deltas per cache line crossing the
// cores. A delta holds no pointer, so the rings hold nothing the garbage collector
// scans and storing a cell needs no write barrier.
type Delta struct {
	lo, hi uint32 // fingerprint
	w      uint32 // op<<opShift | id
}

// opShift places a delta's op above its id; ids (worker ids and barrier ids) are at
// most MaxID.
const opShift = 30

// MaxID is the largest id a delta carries: worker ids and barrier ids travel in its 30
// id bits.
const MaxID = 1<<opShift - 1

// NewDelta encodes op at the key with fingerprint fp for id (a worker id, or a barrier
// id for OpBarrier; at most MaxID).
func NewDelta(op uint8, fp uint64, id uint32) Delta {
	return Delta{lo: uint32(fp), hi: uint32(fp >> 32), w: uint32(op)<<opShift | id}
}

// Op is the delta's op.
func (d *Delta) Op() uint8 { return uint8(d.w >> opShift) }

// ID is the delta's worker or barrier id.
func (d *Delta) ID() uint32 { return d.w & MaxID }

// FP is the fingerprint of the delta's key.
func (d *Delta) FP() uint64 { return uint64(d.lo) | uint64(d.hi)<<32 }
