package server

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvindex/kvindex/engine"
	"github.com/kvindex/kvindex/fabric"
	"github.com/kvindex/kvindex/internal/atomicfile"
	"github.com/kvindex/kvindex/subscriber"
)

// Warm restart (Options.Snapshot): the index is restored from a snapshot file by New,
// written every SnapshotOptions.Interval while serving and once more by Shutdown, after
// the subscribers (or the replica) have stopped, so that the last file is their exact
// position. kvindex_snapshot_writes_total{result} and
// kvindex_snapshot_last_success_timestamp_seconds count the writes; a final write that
// fails is Shutdown's error.
//
// In ZeroMQ mode (no Options.Replica) the file is the engine's snapshot
// (engine.WriteSnapshotFile), one atomic file. Each worker's resume point travels in
// it: every event a subscriber applies carries its position (its batch's sequence and
// digest, its place in the batch), which the engine keeps with the worker's blocks
// under the worker's lock, so the snapshot holds each worker's checkpoint with exactly
// the blocks it describes, however busy the worker (subscriber.CheckpointAt). New
// restores the index and every worker with a checkpoint resumes from it: its first
// catch-up asks the engine's replay buffer for the checkpoint's batch (verified by its
// digest), applies what of it the snapshot lacks and what followed, so a restart, kill
// -9 included, loses nothing the engine still buffers (cmd/kvindex's TestKill9Recovery).
// A worker without a checkpoint is cleared and synced from scratch; a worker no longer
// configured (nor listed by the discovery file) is removed. The temporary files of a
// write that a kill interrupted, and the FILE.cursors sidecar of older builds, are
// removed at start. A snapshot is checked before it is read: a file larger than
// SnapshotOptions.MaxBytes, or one that does not start with a snapshot's magic, is not
// read at all. An unusable snapshot (those, and a damaged one or one of a newer build's
// version, which the engine refuses) is logged, kept aside as FILE.unusable (replacing
// an older one) so that the next write does not destroy it, and the index starts empty.
//
// With Options.Replica the file is the replica's (fabric.Replica.Snapshot: the index
// and its stream position), or a JetStream object (jetstream-object://BUCKET/NAME).

// SnapshotOptions configures warm restart (Options.Snapshot). The zero value is none.
type SnapshotOptions struct {
	// Path is the snapshot file; its directory must exist and be writable when New
	// runs. With Options.Replica it may also name a JetStream object store object
	// (jetstream-object://BUCKET/NAME).
	Path string
	// Interval is how often to write it while serving; 0 or less: only at Shutdown.
	Interval time.Duration
	// MaxBytes bounds the file New reads (0: DefaultSnapshotMaxBytes); a larger one is
	// unusable.
	MaxBytes int64
}

// DefaultSnapshotMaxBytes bounds a snapshot file by default: about 200 million block
// memberships at the engine's 70 bytes each (BENCHMARKS.md).
const DefaultSnapshotMaxBytes = 16 << 30

// snapshotMagic is how an engine snapshot starts (engine/snapshot.go's format;
// TestSnapshotKeptAside pins it against a snapshot the engine writes).
const snapshotMagic = "KVIXSNAP"

// unusableSuffix names where an unusable snapshot is kept aside.
const unusableSuffix = ".unusable"

// warmRestart writes the snapshot and counts the writes.
type warmRestart struct {
	opts   SnapshotOptions
	write  func() error // the engine's or the replica's snapshot; nil: no snapshot
	writes *prometheus.CounterVec
	last   prometheus.Gauge
}

func newWarmRestart(o SnapshotOptions) *warmRestart {
	w := &warmRestart{opts: o,
		writes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvindex_snapshot_writes_total",
			Help: "Snapshot writes (--snapshot), periodic and final, by result (ok, error).",
		}, []string{"result"}),
		last: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "kvindex_snapshot_last_success_timestamp_seconds",
			Help: "When the last snapshot was written (Unix seconds; 0: none yet).",
		}),
	}
	w.writes.WithLabelValues("ok")
	w.writes.WithLabelValues("error")
	return w
}

func (w *warmRestart) collectors() []prometheus.Collector {
	return []prometheus.Collector{w.writes, w.last}
}

// snapshot writes the snapshot once and counts the outcome.
func (w *warmRestart) snapshot() error {
	if err := w.write(); err != nil {
		w.writes.WithLabelValues("error").Inc()
		return err
	}
	w.writes.WithLabelValues("ok").Inc()
	w.last.Set(float64(time.Now().UnixNano()) / 1e9)
	return nil
}

// loop writes the snapshot every Interval until ctx ends; a failed write is logged.
func (w *warmRestart) loop(ctx context.Context, log *slog.Logger) {
	t := time.NewTicker(w.opts.Interval)
	defer t.Stop()
	for {
		select {
		case <-t.C:
			if err := w.snapshot(); err != nil {
				log.Warn("snapshot", "err", err)
			}
		case <-ctx.Done():
			return
		}
	}
}

// checkSnapshotDir checks that a snapshot file can be written where it is to go: its
// directory exists and a file can be created in it (and is removed at once), so that
// a mistake fails the start rather than the first periodic write. Object store
// snapshots are NATS's business.
func checkSnapshotDir(path string) error {
	if path == "" || strings.HasPrefix(path, fabric.ObjectScheme) {
		return nil
	}
	dir := filepath.Dir(path)
	if st, err := os.Stat(dir); err != nil {
		return fmt.Errorf("snapshot: directory %s: %w", dir, err)
	} else if !st.IsDir() {
		return fmt.Errorf("snapshot: %s is not a directory", dir)
	}
	if st, err := os.Stat(path); err == nil && st.IsDir() {
		return fmt.Errorf("snapshot: %s is a directory, want a file path", path)
	}
	f, err := os.CreateTemp(dir, ".kvindex-check-*")
	if err != nil {
		return fmt.Errorf("snapshot: directory %s is not writable: %w", dir, err)
	}
	name := f.Name()
	f.Close()
	return os.Remove(name)
}

// restoreSnapshot returns the engine to serve and the checkpoints its workers resume
// from: the snapshot's (cfg plans the workers to keep), or a fresh engine when there is
// none or it is unusable.
func restoreSnapshot(path string, maxBytes int64, cfg Config, log *slog.Logger) (*engine.Engine, map[string]subscriber.Checkpoint, error) {
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
		return nil, nil, fmt.Errorf("snapshot: %w", err)
	}
	eng, err := readSnapshot(cfg, f, maxBytes)
	f.Close()
	if err != nil {
		aside := path + unusableSuffix
		if rerr := os.Rename(path, aside); rerr != nil {
			return nil, nil, fmt.Errorf("snapshot: unusable (%v), and it cannot be kept aside: %w", err, rerr)
		}
		log.Warn("snapshot: unusable; kept aside, starting empty", "path", path, "kept", aside, "err", err)
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
			return nil, nil, fmt.Errorf("snapshot: %w", err)
		}
	}
	log.Info("snapshot restored", "path", path, "workers", len(eng.Cursors()), "resumed", len(cps))
	return eng, cps, nil
}

// readSnapshot restores an engine from f after checking its size and magic, so that a
// file that is not a snapshot, or too large to be one, is not read.
func readSnapshot(cfg Config, f *os.File, maxBytes int64) (*engine.Engine, error) {
	if maxBytes <= 0 {
		maxBytes = DefaultSnapshotMaxBytes
	}
	fi, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if fi.Size() > maxBytes {
		return nil, fmt.Errorf("%d bytes, more than the %d a snapshot may have (SnapshotOptions.MaxBytes)", fi.Size(), maxBytes)
	}
	var head [len(snapshotMagic)]byte
	if _, err := io.ReadFull(f, head[:]); err != nil || string(head[:]) != snapshotMagic {
		return nil, fmt.Errorf("not a kvindex snapshot (it does not start with %q)", snapshotMagic)
	}
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return nil, err
	}
	return engine.Restore(cfg.Index.Engine(), f, maxBytes)
}

// withFileEngines returns cfg with the engines of its discovery file added, for the
// snapshot's plan: they are served from the start (New reads the file too), so their
// workers keep their blocks and resume from their checkpoints like the configured ones.
// A file that does not read or validate with the rest leaves cfg as it is (New then
// says what is wrong with it).
func withFileEngines(cfg Config) Config {
	fd := cfg.Discovery.File
	if fd == nil {
		return cfg
	}
	es, err := ReadEnginesFile(fd.Path)
	if err != nil {
		return cfg
	}
	plan := cfg
	plan.Engines = append(slices.Clone(cfg.Engines), es...)
	if plan.Validate() != nil {
		return cfg
	}
	return plan
}
