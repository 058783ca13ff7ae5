package main

import (
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"

	"github.com/kvindex/kvindex/engine"
	"github.com/kvindex/kvindex/internal/atomicfile"
	"github.com/kvindex/kvindex/server"
	"github.com/kvindex/kvindex/subscriber"
)

// serve --snapshot FILE in ZeroMQ mode (no --nats): FILE is the engine's snapshot
// (engine.WriteSnapshotFile), one atomic file. Each worker's resume point travels in
// it: every event a subscriber applies carries its position (its batch's sequence and
// digest, its place in the batch), which the engine keeps with the worker's blocks
// under the worker's lock, so the snapshot holds each worker's checkpoint with exactly
// the blocks it describes, however busy the worker (subscriber.CheckpointAt). At start
// the index is restored and every worker with a checkpoint resumes from it: its first
// catch-up asks the engine's replay buffer for the checkpoint's batch (verified by its
// digest), applies what of it the snapshot lacks and what followed, so a restart, kill -9
// included, loses nothing the engine still buffers. A worker without a checkpoint is
// cleared and synced from scratch; a worker no longer configured is removed. Temporary
// files of a write that a kill interrupted, and the FILE.cursors sidecar of older
// builds, are removed at start.

// restoreZMQSnapshot returns the engine to serve and the checkpoints to resume: the
// snapshot's, or a fresh engine when there is none or it is unusable.
func restoreZMQSnapshot(path string, cfg server.Config, log *slog.Logger) (*engine.Engine, map[string]subscriber.Checkpoint, error) {
	if n, err := atomicfile.RemoveStale(path); err != nil {
		log.Warn("snapshot: removing the temporary files of an interrupted write", "err", err)
	} else if n > 0 {
		log.Info("snapshot: removed the temporary files of an interrupted write", "files", n)
	}
	if err := os.Remove(path + ".cursors"); err == nil {
		log.Info("snapshot: removed FILE.cursors, which this build does not use (positions travel in the snapshot)")
	}
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
	subs, err := cfg.SubscriberConfigs()
	if err != nil {
		eng.Close()
		return nil, nil, err
	}
	planned := map[string]bool{}
	for _, sc := range subs {
		planned[sc.Worker] = true
	}
	cps := map[string]subscriber.Checkpoint{}
	for w, pos := range eng.Positions() {
		cp, ok := subscriber.CheckpointAt(pos)
		var ev engine.Event
		switch {
		case !planned[w]:
			ev = engine.Event{Kind: engine.EventRemoveWorker, Worker: w}
		case !ok:
			ev = engine.Event{Kind: engine.EventCleared, Worker: w}
		default:
			cps[w] = cp
			continue
		}
		if err := eng.Apply(&ev); err != nil {
			eng.Close()
			return nil, nil, fmt.Errorf("--snapshot: %w", err)
		}
	}
	log.Info("snapshot restored", "path", path, "workers", len(eng.Cursors()), "resumed", len(cps))
	return eng, cps, nil
}

// writeZMQSnapshot writes the engine's snapshot, the workers' checkpoints in it.
func writeZMQSnapshot(path string, eng *engine.Engine) error {
	return eng.WriteSnapshotFile(path)
}
