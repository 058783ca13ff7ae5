package kvevents

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// ErrSeqLength reports a sequence frame that is not 8 bytes long. Unmerged vLLM/SGLang
// snapshot work extends it to 24 bytes (an 8-byte seq and a 16-byte publisher id):
// treat it as an unsupported extension, not as garbage.
var ErrSeqLength = errors.New("kvevents: sequence frame is not 8 bytes")

// ParseSeq decodes the sequence frame of a message (frame 1 of a live PUB message
// [topic, seq, payload], or the seq frame of a replay reply): an unsigned 8-byte
// big-endian counter, starting at 0 and incremented per batch by each publisher (one per
// data-parallel rank). end reports the replay end marker, ff ff ff ff ff ff ff ff
// (END_SEQ = -1), which comes with an empty payload.
func ParseSeq(frame []byte) (seq uint64, end bool, err error) {
	if len(frame) != 8 {
		return 0, false, fmt.Errorf("%w (got %d)", ErrSeqLength, len(frame))
	}
	seq = binary.BigEndian.Uint64(frame)
	return seq, seq == ^uint64(0), nil
}
