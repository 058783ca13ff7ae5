package main

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvindex/kvindex/server"
)

// serve checks at start what it will need later, so that a mistake fails the start
// with its reason rather than minutes later (the first periodic snapshot) or never (a
// subscriber retrying a bind forever): the snapshot's directory is writable, the HTTP
// and gRPC addresses are free (they are bound here and handed to the server), and every
// engine that binds (bind=true) can bind its endpoints. The configuration itself, the
// engines' specs included, is validated before (server.Config.Validate).

// checkSnapshotDir checks that a snapshot file can be written where it is to go: its
// directory exists and a file can be created in it (and is removed at once). Object
// store snapshots (jetstream-object://) are NATS's business.
func checkSnapshotDir(path string) error {
	if path == "" || strings.HasPrefix(path, "jetstream-object://") {
		return nil
	}
	dir := filepath.Dir(path)
	if st, err := os.Stat(dir); err != nil {
		return fmt.Errorf("--snapshot: directory %s: %w", dir, err)
	} else if !st.IsDir() {
		return fmt.Errorf("--snapshot: %s is not a directory", dir)
	}
	if st, err := os.Stat(path); err == nil && st.IsDir() {
		return fmt.Errorf("--snapshot: %s is a directory, want a file path", path)
	}
	f, err := os.CreateTemp(dir, ".kvindex-check-*")
	if err != nil {
		return fmt.Errorf("--snapshot: directory %s is not writable: %w", dir, err)
	}
	name := f.Name()
	f.Close()
	return os.Remove(name)
}

// listenEarly binds the HTTP address and, when configured, the gRPC one.
func listenEarly(cfg server.Config) (httpLn, grpcLn net.Listener, err error) {
	addr := cfg.Listen
	if addr == "" {
		addr = server.DefaultListen
	}
	if httpLn, err = net.Listen("tcp", addr); err != nil {
		return nil, nil, fmt.Errorf("listen %s: %w", addr, err)
	}
	if cfg.GRPC.Listen != "" {
		if grpcLn, err = net.Listen("tcp", cfg.GRPC.Listen); err != nil {
			httpLn.Close()
			return nil, nil, fmt.Errorf("--grpc %s: %w", cfg.GRPC.Listen, err)
		}
	}
	return httpLn, grpcLn, nil
}

// checkBinds binds, and closes at once, the endpoint of every engine rank that binds
// (tcp endpoints; others are left to the subscriber).
func checkBinds(cfg server.Config) error {
	subs, err := cfg.SubscriberConfigs()
	if err != nil {
		return err
	}
	var errs []error
	for _, sc := range subs {
		addr, ok := strings.CutPrefix(sc.Endpoint, "tcp://")
		if !sc.Bind || !ok {
			continue
		}
		l, err := net.Listen("tcp", addr)
		if err != nil {
			errs = append(errs, fmt.Errorf("engine %s binds %s: %w", sc.Worker, sc.Endpoint, err))
			continue
		}
		l.Close()
	}
	return errors.Join(errs...)
}

// snapshotMetrics counts serve's snapshot writes for /metrics (registered with the
// server's registry): a periodic write that fails is counted and logged, and a failed
// final one makes serve exit 1.
type snapshotMetrics struct {
	writes *prometheus.CounterVec
	last   prometheus.Gauge
}

func newSnapshotMetrics() *snapshotMetrics {
	m := &snapshotMetrics{
		writes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvindex_snapshot_writes_total",
			Help: "Snapshot writes (--snapshot), periodic and final, by result (ok, error).",
		}, []string{"result"}),
		last: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "kvindex_snapshot_last_success_timestamp_seconds",
			Help: "When the last snapshot was written (Unix seconds; 0: none yet).",
		}),
	}
	m.writes.WithLabelValues("ok")
	m.writes.WithLabelValues("error")
	return m
}

func (m *snapshotMetrics) collectors() []prometheus.Collector {
	return []prometheus.Collector{m.writes, m.last}
}

// note counts one write's outcome and returns err.
func (m *snapshotMetrics) note(err error) error {
	if err != nil {
		m.writes.WithLabelValues("error").Inc()
		return err
	}
	m.writes.WithLabelValues("ok").Inc()
	m.last.Set(float64(time.Now().UnixNano()) / 1e9)
	return nil
}

// withFileEngines returns cfg with the engines of its discovery file added, for the
// snapshot's plan: they are served from the start (server.New reads the file too), so
// their workers keep their blocks and resume from their cursors like the configured
// ones. A file that does not read or validate with the rest leaves cfg as it is (New
// then says what is wrong with it).
func withFileEngines(cfg server.Config) server.Config {
	fd := cfg.Discovery.File
	if fd == nil {
		return cfg
	}
	es, err := server.ReadEnginesFile(fd.Path)
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
