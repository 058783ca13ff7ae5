package sim

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"time"

	"github.com/kvindex/kvindex/hash"
)

// TraceBlockTokens is the block size of a Mooncake trace's hash ids.
const TraceBlockTokens = 512

// TraceRecord is one line of a Mooncake FAST'25 trace.
type TraceRecord struct {
	Timestamp    float64  `json:"timestamp"` // ms since the first request
	InputLength  int      `json:"input_length"`
	OutputLength int      `json:"output_length"`
	HashIDs      []uint64 `json:"hash_ids"` // one per 512-token block, chained to its prefix
}

// ReadTrace reads a Mooncake trace (JSON Lines). It stops after limit records when
// limit > 0. Blank lines are skipped; a malformed line is an error naming it.
func ReadTrace(r io.Reader, limit int) ([]TraceRecord, error) {
	s := bufio.NewScanner(r)
	s.Buffer(make([]byte, 0, 1<<16), 64<<20)
	var out []TraceRecord
	line := 0
	for s.Scan() && (limit <= 0 || len(out) < limit) {
		line++
		b := bytes.TrimSpace(s.Bytes())
		if len(b) == 0 {
			continue
		}
		var rec TraceRecord
		if err := json.Unmarshal(b, &rec); err != nil {
			return nil, fmt.Errorf("%w: trace line %d: %v", ErrWorkload, line, err)
		}
		if rec.InputLength < 0 || rec.OutputLength < 0 {
			return nil, fmt.Errorf("%w: trace line %d: negative length", ErrWorkload, line)
		}
		if rec.InputLength > len(rec.HashIDs)*TraceBlockTokens {
			return nil, fmt.Errorf("%w: trace line %d: input_length %d exceeds %d hash_ids of %d tokens",
				ErrWorkload, line, rec.InputLength, len(rec.HashIDs), TraceBlockTokens)
		}
		for _, id := range rec.HashIDs {
			if id > math.MaxUint32 {
				return nil, fmt.Errorf("%w: trace line %d: hash id %d does not fit a 32-bit token id", ErrWorkload, line, id)
			}
		}
		out = append(out, rec)
	}
	if err := s.Err(); err != nil {
		return nil, fmt.Errorf("%w: trace line %d: %v", ErrWorkload, line+1, err)
	}
	return out, nil
}

// TraceTokens appends a trace record's token ids to dst: each of its hash ids stands for
// TraceBlockTokens copies of itself, cut at the record's input length.
func TraceTokens(dst []uint32, rec TraceRecord) []uint32 {
	start := len(dst)
	for _, id := range rec.HashIDs {
		if len(dst)-start >= rec.InputLength {
			break
		}
		for range TraceBlockTokens {
			dst = append(dst, uint32(id))
		}
	}
	return dst[:start+min(len(dst)-start, max(rec.InputLength, 0))]
}

// FromTrace turns trace records into a workload, as NVIDIA Dynamo's indexer benchmark
// does: a request's token ids are its hash ids, each repeated 512 times, truncated to
// input_length, cut into blocks of blockSize tokens (a trailing partial block dropped),
// and hashed with package hash.
func FromTrace(name string, recs []TraceRecord, blockSize int) (*Workload, error) {
	if err := hash.CheckBlockSize(blockSize); err != nil {
		return nil, fmt.Errorf("sim: %w", err)
	}
	w := &Workload{Name: name, BlockSize: blockSize, Timed: true, Kind: "trace", Requests: make([]Request, 0, len(recs))}
	var tokens []uint32
	var blocks []uint64
	for _, rec := range recs {
		tokens = TraceTokens(tokens[:0], rec)
		// All requests' hashes share one growing arena; each request keeps its own window.
		if cap(blocks)-len(blocks) < len(tokens)/blockSize {
			blocks = make([]uint64, 0, max(1<<16, len(tokens)/blockSize))
		}
		from := len(blocks)
		var err error
		if blocks, err = hash.Blocks(blocks, tokens, blockSize); err != nil {
			return nil, err
		}
		at := time.Duration(rec.Timestamp * float64(time.Millisecond))
		w.add(Request{Tokens: len(tokens), Blocks: blocks[from:len(blocks):len(blocks)], At: at,
			Output: rec.OutputLength, Session: traceSession(rec.HashIDs)})
	}
	return w, nil
}

// traceSession names a trace request's conversation by its first two hash ids, as the
// Mooncake conversation trace has no session field: a conversation's turns repeat its
// opening blocks, and its first block alone is often a prompt shared by many. A
// heuristic: two conversations that open alike share a session.
func traceSession(ids []uint64) uint64 {
	var h uint64 = 0x73657373 // "sess"
	for _, id := range ids[:min(len(ids), 2)] {
		h = hash.Next(h, id)
	}
	return h | 1
}

// TraceCeiling is the infinite-cache prefix hit ratio of a trace at its own 512-token
// granularity, block-weighted over all requests: a request hits the longest prefix of its
// hash ids that earlier requests have seen; every id counts as one block reference.
func TraceCeiling(recs []TraceRecord) (hits, refs int64) {
	seen := make(map[uint64]struct{})
	for _, rec := range recs {
		k := 0
		for k < len(rec.HashIDs) {
			if _, ok := seen[rec.HashIDs[k]]; !ok {
				break
			}
			k++
		}
		hits += int64(k)
		refs += int64(len(rec.HashIDs))
		for _, id := range rec.HashIDs[k:] {
			seen[id] = struct{}{}
		}
	}
	return hits, refs
}
