package server

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/zeebo/xxh3"

	"github.com/kvindex/kvindex/internal/readlimit"
)

// Discovery: sources that find engines by themselves and hand the server their whole
// current list (SetEngines), each under its own source name: a watched file
// (SourceFile) and Kubernetes pods (SourceKubernetes, discovery_kube.go).
//
// The file is polled, not watched with inotify: polling needs no dependency and sees
// every way a file is replaced (an editor's rename, a Kubernetes ConfigMap's symlink
// swap, a network file system), where an inotify watch on the file is lost on a
// rename and one on its directory misses NFS. The cost is a read every Interval (1 s
// by default; contents compared by hash, so an unchanged file costs a read and a hash)
// and up to Interval of delay.
//
// Each source runs one goroutine from Start to Shutdown (s.wg); it owns its own state
// and talks to the server through SetEngines only. The file's first list is taken in
// New (a file that is missing, does not parse or lists an engine that does not
// validate fails New, as a configuration would); Kubernetes' settings and service
// account are checked in New and its first list comes from its goroutine, retried
// until the API server answers. /readyz waits until every source has delivered a
// list.

// The discovery sources' names.
const (
	SourceFile       = "file"
	SourceKubernetes = "kubernetes"
)

// Bounds of discovery.
const (
	DefaultFileInterval = time.Second
	MinFileInterval     = 10 * time.Millisecond
	MaxFileInterval     = time.Hour
	// MaxEnginesFileBytes bounds the engines file (16 MiB: some 50,000 engines).
	MaxEnginesFileBytes = 16 << 20
)

// DiscoveryConfig configures the discovery sources; each is off unless set.
type DiscoveryConfig struct {
	// File is a watched file of engines.
	File *FileDiscovery `json:"file,omitempty"`
	// Kubernetes follows pods by label selector (discovery_kube.go).
	Kubernetes *KubeDiscovery `json:"kubernetes,omitempty"`
}

// FileDiscovery is a file that lists engines, re-read when it changes: a JSON array of
// "engines" entries of the configuration, or an object {"engines": [...]}.
type FileDiscovery struct {
	Path string `json:"path"`
	// Interval is how often the file is checked. Default 1s, 10ms..1h.
	Interval Duration `json:"interval,omitempty"`
}

func (d DiscoveryConfig) validate() error {
	if f := d.File; f != nil {
		if f.Path == "" {
			return fmt.Errorf("%w: discovery.file.path is required", ErrConfig)
		}
		if iv := time.Duration(f.Interval); iv != 0 && (iv < MinFileInterval || iv > MaxFileInterval) {
			return fmt.Errorf("%w: discovery.file.interval %v: want %v..%v", ErrConfig, iv, MinFileInterval, MaxFileInterval)
		}
	}
	if k := d.Kubernetes; k != nil {
		return k.validate()
	}
	return nil
}

// ReadEnginesFile reads an engines file: a JSON array of engine entries or an object
// {"engines": [...]}, read strictly (unknown fields, repeated keys, trailing data are
// errors), of at most MaxEnginesFileBytes. The engines are not validated.
func ReadEnginesFile(path string) ([]EngineConfig, error) {
	b, err := readEnginesFile(path)
	if err != nil {
		return nil, err
	}
	return parseEngines(b)
}

func readEnginesFile(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return readlimit.ReadAll(f, MaxEnginesFileBytes)
}

func parseEngines(b []byte) ([]EngineConfig, error) {
	if t := bytes.TrimLeft(b, " \t\r\n"); len(t) > 0 && t[0] == '[' {
		var list []EngineConfig
		if err := decodeStrict(b, &list); err != nil {
			return nil, err
		}
		return list, nil
	}
	var obj struct {
		Engines []EngineConfig `json:"engines"`
	}
	if err := decodeStrict(b, &obj); err != nil {
		return nil, err
	}
	return obj.Engines, nil
}

// initDiscovery takes each discovery source's first list and sets up its loop (New).
func (s *Server) initDiscovery() error {
	if fd := s.cfg.Discovery.File; fd != nil {
		w, list, err := s.newFileWatcher(*fd)
		if err != nil {
			return err
		}
		ch, err := s.SetEngines(SourceFile, list)
		if err == nil && len(ch.Rejected) > 0 {
			err = fmt.Errorf("%w: discovery.file %s: engine %q: %s", ErrConfig, fd.Path, ch.Rejected[0].Key, ch.Rejected[0].Error)
		}
		if err != nil {
			return err
		}
		w.st.synced.Store(true)
		w.st.up.Store(true)
		s.discovery = append(s.discovery, w.st)
		s.runners = append(s.runners, w.run)
	}
	if kd := s.cfg.Discovery.Kubernetes; kd != nil {
		k, err := s.newKubeWatcher(*kd)
		if err != nil {
			return err
		}
		s.discovery = append(s.discovery, k.st)
		s.runners = append(s.runners, k.run)
	}
	return nil
}

// discoveryState is one source's health, for /readyz and /metrics.
type discoveryState struct {
	source  string
	synced  atomic.Bool   // a list was delivered once
	up      atomic.Bool   // the last attempt succeeded
	errors  atomic.Uint64 // failed attempts
	updates atomic.Uint64 // lists delivered that changed something
}

// fileWatcher is the file source (its goroutine owns it).
type fileWatcher struct {
	s     *Server
	cfg   FileDiscovery
	st    *discoveryState
	last  uint64 // hash of the contents last applied
	err   string // the last error logged (each distinct error is logged once)
	every time.Duration
}

// newFileWatcher reads the file once (New's check) and returns the watcher with the
// engines to start with.
func (s *Server) newFileWatcher(cfg FileDiscovery) (*fileWatcher, []EngineConfig, error) {
	w := &fileWatcher{s: s, cfg: cfg, st: &discoveryState{source: SourceFile},
		every: max(time.Duration(cfg.Interval), 0)}
	if w.every == 0 {
		w.every = DefaultFileInterval
	}
	b, err := readEnginesFile(cfg.Path)
	if err != nil {
		return nil, nil, fmt.Errorf("%w: discovery.file: %w", ErrConfig, err)
	}
	list, err := parseEngines(b)
	if err != nil {
		return nil, nil, fmt.Errorf("%w: discovery.file %s: %w", ErrConfig, cfg.Path, err)
	}
	w.last = xxh3.Hash(b)
	return w, list, nil
}

// run polls the file until ctx ends.
func (w *fileWatcher) run(ctx context.Context) {
	t := time.NewTicker(w.every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			w.poll()
		}
	}
}

// poll re-reads the file and hands a changed list to the server. A file that cannot
// be read or parsed changes nothing (its engines keep running) and is counted; so is
// an engine the server rejects, while the file's other engines apply.
func (w *fileWatcher) poll() {
	b, err := readEnginesFile(w.cfg.Path)
	var list []EngineConfig
	if err == nil {
		if h := xxh3.Hash(b); h == w.last {
			w.ok()
			return
		}
		list, err = parseEngines(b)
	}
	if err != nil {
		w.fail(err)
		return
	}
	ch, err := w.s.SetEngines(SourceFile, list)
	if err != nil {
		return // shut down
	}
	w.last = xxh3.Hash(b)
	w.ok()
	if !ch.Empty() {
		w.st.updates.Add(1)
	}
}

func (w *fileWatcher) ok() {
	w.st.up.Store(true)
	if w.err != "" {
		w.s.log.Info("discovery: engines file readable again", "path", w.cfg.Path)
		w.err = ""
	}
}

func (w *fileWatcher) fail(err error) {
	w.st.up.Store(false)
	w.st.errors.Add(1)
	if msg := err.Error(); msg != w.err {
		w.s.log.Error("discovery: engines file unusable; its engines stay as they were", "path", w.cfg.Path, "err", err)
		w.err = msg
	}
}

// discoveryCollector exports the sources' health (kvindex_discovery_*).
type discoveryCollector struct {
	s                  *Server
	up, errors, update *prometheus.Desc
}

func newDiscoveryCollector(s *Server) *discoveryCollector {
	d := func(name, help string) *prometheus.Desc {
		return prometheus.NewDesc("kvindex_discovery_"+name, help, []string{"source"}, nil)
	}
	return &discoveryCollector{s: s,
		up:     d("up", "1 when the discovery source's last attempt succeeded (file read and parsed, Kubernetes listed or watched)."),
		errors: d("errors_total", "Failed attempts of the discovery source (the engines stay as they were)."),
		update: d("updates_total", "Lists from the discovery source that changed the engines."),
	}
}

func (c *discoveryCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.up
	ch <- c.errors
	ch <- c.update
}

func (c *discoveryCollector) Collect(ch chan<- prometheus.Metric) {
	for _, st := range c.s.discovery {
		up := 0.0
		if st.up.Load() {
			up = 1
		}
		ch <- prometheus.MustNewConstMetric(c.up, prometheus.GaugeValue, up, st.source)
		ch <- prometheus.MustNewConstMetric(c.errors, prometheus.CounterValue, float64(st.errors.Load()), st.source)
		ch <- prometheus.MustNewConstMetric(c.update, prometheus.CounterValue, float64(st.updates.Load()), st.source)
	}
}
