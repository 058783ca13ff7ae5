package fabric

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"os"
	"slices"
	"sort"
	"time"

	"github.com/kvindex/kvindex/engine"
	"github.com/kvindex/kvindex/internal/atomicfile"
	"github.com/kvindex/kvindex/internal/readlimit"
)

// ErrSnapshot wraps every reason a replica snapshot is refused (engine.ErrSnapshot
// too, for the index part).
var ErrSnapshot = errors.New("fabric: snapshot refused")

const (
	snapMagic = "KVFABSN\x00"
	// snapVersion 4 records each worker's next part of a split event and whether
	// its last event removed it; version 3, which does not (a worker then stands at a
	// whole event), is still read, as is version 2, which lacks the workers' models
	// too (they show once the workers publish again). Version 2 added the replica's
	// models; a version 1 snapshot, which lacks them, is refused (the replica replays
	// the stream).
	snapVersion = 4
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

type snapshot struct {
	eng     *engine.Engine
	last    uint64
	created time.Time
	workers map[string]workerState
	// workerModels is each worker's model (version 3; nil from a version 2 file).
	workerModels map[string]string
	// models are the models whose subjects the replica followed, sorted (empty:
	// every model). The snapshot describes the stream up to last for those subjects
	// only, so it is restored only into a replica following the same models.
	models []string
}

// modelSet returns models sorted and deduplicated: the set a snapshot records.
func modelSet(models []string) []string {
	out := slices.Clone(models)
	slices.Sort(out)
	return slices.Compact(out)
}

// encodeSnapshot lays a replica snapshot out as
//
//	magic | version u32 | last u64 | created unix-nanos i64 | nmodels u32 |
//	(len u32, name)* sorted | nworkers u32 | (len u32, name, seq u64, len u32, model,
//	next part u32, removed u8)* sorted by name (version 3: no next part nor removed;
//	version 2: no model either) | engine snapshot length u64 |
//	engine snapshot (engine.WriteSnapshot) | CRC-32C of all the above u32
//
// all little-endian.
func encodeSnapshot(s *snapshot) ([]byte, error) { return encodeSnapshotAs(s, snapVersion) }

// encodeSnapshotAs encodes s in format version (2 to 4; tests write older ones).
func encodeSnapshotAs(s *snapshot, version uint32) ([]byte, error) {
	var b bytes.Buffer
	b.WriteString(snapMagic)
	le := binary.LittleEndian
	var tmp []byte
	tmp = le.AppendUint32(tmp, version)
	tmp = le.AppendUint64(tmp, s.last)
	tmp = le.AppendUint64(tmp, uint64(s.created.UnixNano()))
	tmp = le.AppendUint32(tmp, uint32(len(s.models)))
	for _, m := range s.models {
		tmp = le.AppendUint32(tmp, uint32(len(m)))
		tmp = append(tmp, m...)
	}
	names := make([]string, 0, len(s.workers))
	for n := range s.workers {
		names = append(names, n)
	}
	sort.Strings(names)
	tmp = le.AppendUint32(tmp, uint32(len(names)))
	for _, n := range names {
		tmp = le.AppendUint32(tmp, uint32(len(n)))
		tmp = append(tmp, n...)
		st := s.workers[n]
		tmp = le.AppendUint64(tmp, st.seq)
		if version >= 3 {
			m := s.workerModels[n]
			tmp = le.AppendUint32(tmp, uint32(len(m)))
			tmp = append(tmp, m...)
		}
		if version >= 4 {
			tmp = le.AppendUint32(tmp, st.next)
			tmp = append(tmp, b2u8(st.removed))
		}
	}
	b.Write(tmp)
	lenAt := b.Len()
	b.Write(make([]byte, 8))
	if err := s.eng.WriteSnapshot(&b); err != nil {
		return nil, err
	}
	out := b.Bytes()
	le.PutUint64(out[lenAt:], uint64(len(out)-lenAt-8))
	return le.AppendUint32(out, crc32.Checksum(out, castagnoli)), nil
}

func writeSnapshot(path string, s *snapshot) error {
	data, err := encodeSnapshot(s)
	if err != nil {
		return err
	}
	return atomicfile.Write(path, func(w io.Writer) error {
		_, err := w.Write(data)
		return err
	})
}

// readSnapshot reads and verifies a replica snapshot and restores its index. Errors
// wrap ErrSnapshot, except a missing file (os.ErrNotExist).
func readSnapshot(path string, cfg engine.Config, maxBytes int64) (*snapshot, error) {
	f, err := os.Open(path)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, err
		}
		return nil, fmt.Errorf("%w: %v", ErrSnapshot, err)
	}
	defer f.Close()
	data, err := readlimit.ReadAll(f, maxBytes)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrSnapshot, err)
	}
	return decodeSnapshot(data, cfg)
}

func b2u8(b bool) byte {
	if b {
		return 1
	}
	return 0
}

func decodeSnapshot(data []byte, cfg engine.Config) (*snapshot, error) {
	bad := func(format string, args ...any) (*snapshot, error) {
		return nil, fmt.Errorf("%w: %s", ErrSnapshot, fmt.Sprintf(format, args...))
	}
	if len(data) < len(snapMagic)+4+4 {
		return bad("truncated (%d bytes)", len(data))
	}
	body := data[:len(data)-4]
	le := binary.LittleEndian
	if string(body[:len(snapMagic)]) != snapMagic {
		return bad("not a kvindex replica snapshot")
	}
	if crc32.Checksum(body, castagnoli) != le.Uint32(data[len(data)-4:]) {
		return bad("checksum mismatch (truncated or corrupted)")
	}
	p := body[len(snapMagic):]
	take := func(n uint64) []byte {
		if uint64(len(p)) < n {
			return nil
		}
		v := p[:n]
		p = p[n:]
		return v
	}
	hdr := take(4 + 8 + 8)
	if hdr == nil {
		return bad("truncated header")
	}
	version := le.Uint32(hdr)
	if version < 2 || version > snapVersion {
		return bad("version %d, this build reads versions 2 to %d", version, snapVersion)
	}
	s := &snapshot{
		last:         le.Uint64(hdr[4:]),
		created:      time.Unix(0, int64(le.Uint64(hdr[12:]))),
		workers:      map[string]workerState{},
		workerModels: map[string]string{},
	}
	l := take(4)
	if l == nil {
		return bad("truncated model table")
	}
	for i, n := uint32(0), le.Uint32(l); i < n; i++ {
		l := take(4)
		if l == nil {
			return bad("truncated model table")
		}
		name := take(uint64(le.Uint32(l)))
		if name == nil {
			return bad("truncated model table")
		}
		s.models = append(s.models, string(name))
	}
	if !slices.Equal(s.models, modelSet(s.models)) {
		return bad("model table not sorted")
	}
	l = take(4)
	if l == nil {
		return bad("truncated worker table")
	}
	n := le.Uint32(l)
	for i := uint32(0); i < n; i++ {
		l := take(4)
		if l == nil {
			return bad("truncated worker table")
		}
		name := take(uint64(le.Uint32(l)))
		seq := take(8)
		if name == nil || seq == nil {
			return bad("truncated worker table")
		}
		st := workerState{seq: le.Uint64(seq)}
		if version >= 3 {
			l := take(4)
			if l == nil {
				return bad("truncated worker table")
			}
			model := take(uint64(le.Uint32(l)))
			if model == nil {
				return bad("truncated worker table")
			}
			s.workerModels[string(name)] = string(model)
		}
		if version >= 4 {
			x := take(4 + 1)
			if x == nil {
				return bad("truncated worker table")
			}
			if x[4] > 1 {
				return bad("worker table: removed flag %d", x[4])
			}
			st.next, st.removed = le.Uint32(x), x[4] == 1
		}
		s.workers[string(name)] = st
	}
	l = take(8)
	if l == nil || le.Uint64(l) != uint64(len(p)) {
		return bad("index length does not match")
	}
	eng, err := engine.RestoreBytes(cfg, p)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrSnapshot, err)
	}
	for w, c := range eng.Cursors() {
		if c > s.last {
			eng.Close()
			return bad("worker %q at stream sequence %d, past the snapshot's %d", w, c, s.last)
		}
	}
	s.eng = eng
	return s, nil
}

// RestoreSnapshot reads a replica snapshot file (Replica.Snapshot) and returns its
// index, for tools that inspect one (kvindex doctor --compare). Errors wrap ErrSnapshot,
// except a missing file (os.ErrNotExist).
func RestoreSnapshot(path string, cfg engine.Config, maxBytes int64) (*engine.Engine, error) {
	s, err := readSnapshot(path, cfg, maxBytes)
	if err != nil {
		return nil, err
	}
	return s.eng, nil
}
