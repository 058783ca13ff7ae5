package main

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"

	"github.com/kvindex/kvindex/engine"
	"github.com/kvindex/kvindex/internal/atomicfile"
	"github.com/kvindex/kvindex/server"
	"github.com/kvindex/kvindex/subscriber"
)

// serve --snapshot FILE in ZeroMQ mode (no --nats): FILE is the engine's snapshot
// (engine.WriteSnapshotFile, format unchanged) and FILE.cursors a JSON sidecar with each
// worker's subscriber.Checkpoint, tied to the snapshot by its checksum. At start the
// index is restored and every worker with a checkpoint resumes from it: its first
// catch-up asks the engine's replay buffer for the checkpoint's batch (verified by its
// digest) and what followed, so a restart loses nothing the engine still buffers. A
// worker without a usable checkpoint is cleared and synced from scratch; a worker no
// longer configured is removed.

// cursorFile is the sidecar's content.
type cursorFile struct {
	// SnapshotCRC is the snapshot file's trailing checksum: a sidecar left from another
	// snapshot (a crash between the two renames) does not match and is ignored.
	SnapshotCRC uint32                           `json:"snapshot_crc"`
	Workers     map[string]subscriber.Checkpoint `json:"workers"`
}

// maxCheckpointTries bounds the captures writeZMQSnapshot makes to find every worker
// unchanged across one; workers still changing after that are left out of the sidecar
// (they sync from scratch after a restart).
const maxCheckpointTries = 5

func cursorPath(snapshot string) string { return snapshot + ".cursors" }

// snapshotCRC reads the checksum a snapshot file ends with.
func snapshotCRC(path string) (uint32, error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	var b [4]byte
	if _, err := f.Seek(-4, io.SeekEnd); err != nil {
		return 0, err
	}
	if _, err := io.ReadFull(f, b[:]); err != nil {
		return 0, err
	}
	return binary.LittleEndian.Uint32(b[:]), nil
}

// restoreZMQSnapshot returns the engine to serve and the checkpoints to resume: the
// snapshot's, or a fresh engine when there is none or it is unusable.
func restoreZMQSnapshot(path string, cfg server.Config, log *slog.Logger) (*engine.Engine, map[string]subscriber.Checkpoint, error) {
	fresh := func() (*engine.Engine, map[string]subscriber.Checkpoint, error) {
		e, err := engine.New(cfg.Index.Engine())
		return e, nil, err
	}
	f, err := os.Open(path)
	if errors.Is(err, fs.ErrNotExist) {
		log.Info("snapshot: none yet; starting empty", "path", path)
		return fresh()
	}
	if err != nil {
		return nil, nil, fmt.Errorf("--snapshot: %w", err)
	}
	eng, err := engine.Restore(cfg.Index.Engine(), f, 0)
	f.Close()
	if err != nil {
		log.Warn("snapshot: unusable; starting empty", "path", path, "err", err)
		return fresh()
	}
	cps := map[string]subscriber.Checkpoint{}
	if b, err := os.ReadFile(cursorPath(path)); err != nil {
		log.Warn("snapshot: no cursors; every worker syncs from scratch", "err", err)
	} else {
		var cf cursorFile
		crc, crcErr := snapshotCRC(path)
		switch err := json.Unmarshal(b, &cf); {
		case err != nil || crcErr != nil:
			log.Warn("snapshot: unreadable cursors; every worker syncs from scratch", "err", errors.Join(err, crcErr))
		case cf.SnapshotCRC != crc:
			log.Warn("snapshot: cursors belong to another snapshot; every worker syncs from scratch")
		default:
			cps = cf.Workers
		}
	}
	subs, err := cfg.SubscriberConfigs()
	if err != nil {
		eng.Close()
		return nil, nil, err
	}
	planned := map[string]bool{}
	for _, sc := range subs {
		planned[sc.Worker] = true
	}
	for w, cursor := range eng.Cursors() {
		cp, ok := cps[w]
		// The engine's cursor is the last event applied with one: from the checkpoint's
		// batch or an earlier one (a batch may carry no event), never a later one.
		if ok && cursor != 0 && cursor>>24 > cp.Seq+1 {
			ok = false
		}
		var ev engine.Event
		switch {
		case !planned[w]:
			ev = engine.Event{Kind: engine.EventRemoveWorker, Worker: w}
		case !ok:
			ev = engine.Event{Kind: engine.EventCleared, Worker: w}
		default:
			continue
		}
		delete(cps, w)
		if err := eng.Apply(&ev); err != nil {
			eng.Close()
			return nil, nil, fmt.Errorf("--snapshot: %w", err)
		}
	}
	for w := range cps {
		if !planned[w] {
			delete(cps, w)
		}
	}
	log.Info("snapshot restored", "path", path, "workers", len(eng.Cursors()), "resumed", len(cps))
	return eng, cps, nil
}

// writeZMQSnapshot writes the engine's snapshot and the sidecar of the subscribers'
// checkpoints taken around it.
func writeZMQSnapshot(path string, eng *engine.Engine, subs []*subscriber.Subscriber) error {
	type mark struct {
		cp      subscriber.Checkpoint
		ok      bool
		version uint64
	}
	take := func() []mark {
		out := make([]mark, len(subs))
		for i, s := range subs {
			out[i].cp, out[i].ok, out[i].version = s.Checkpoint()
		}
		return out
	}
	var cf cursorFile
	for try := 1; ; try++ {
		before := take()
		if err := eng.WriteSnapshotFile(path); err != nil {
			return err
		}
		after := take()
		cf.Workers = map[string]subscriber.Checkpoint{}
		steady := true
		for i, s := range subs {
			b, a := before[i], after[i]
			if b.version != a.version || b.version&1 != 0 {
				steady = false
				continue
			}
			if a.ok {
				cf.Workers[s.Worker()] = a.cp
			}
		}
		if steady || try == maxCheckpointTries {
			break
		}
	}
	crc, err := snapshotCRC(path)
	if err != nil {
		return fmt.Errorf("snapshot cursors: %w", err)
	}
	cf.SnapshotCRC = crc
	b, err := json.MarshalIndent(cf, "", "  ")
	if err != nil {
		return err
	}
	if err := atomicfile.Write(cursorPath(path), func(w io.Writer) error {
		_, err := w.Write(b)
		return err
	}); err != nil {
		return fmt.Errorf("snapshot cursors: %w", err)
	}
	return nil
}
