package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvindex/kvindex/engine"
	"github.com/kvindex/kvindex/fabric"
)

// The NATS replica feed (Options.Replica): instead of (or besides) ZeroMQ engines, the
// index follows a kvindex relay's JetStream stream (package fabric) for the
// configuration's models (Config.Models). New connects, starts a fabric.Replica (from
// Options.Snapshot's file or object when it is there and sound, else replaying the
// stream) and serves its engine; /readyz waits until the replica has applied what the
// stream held at start; /v1/workers, gRPC Workers and /metrics list the stream's
// workers (state syncing, replicated or removed) and export kvindex_stream_* and
// kvindex_nats_*. Shutdown writes the replica's last snapshot, closes it and the
// connection.

// ErrReplica wraps New's failure to connect to NATS or to start the replica: a runtime
// failure (the server or its stream unreachable), not a configuration error.
var ErrReplica = errors.New("server: replica")

// ReplicaOptions configures the NATS replica feed (Options.Replica).
type ReplicaOptions struct {
	// URL is the NATS server ("nats://host:4222").
	URL string
	// Stream is the relay's stream (default fabric.DefaultStream).
	Stream string
	// NATS are the connection's options beyond the server's own (reconnect for ever,
	// the client name): credentials and TLS (fabric.NATSAuth).
	NATS []nats.Option
	// Peer is another serve replica of the same stream ("http://host:8080"): every
	// PeerInterval (default 30s) the replica compares its workers' digests with the
	// peer's (peercheck.go). Empty: no peer check.
	Peer         string
	PeerInterval time.Duration
	// PeerResync rebuilds from the stream each worker the peer check finds differing.
	PeerResync bool
	// PeerClient reads the peer's /v1/workers (TLS, credentials); nil: a client with a
	// 10 s timeout that trusts PeerCAFile's CAs (PEM; "": the system's) and sends the
	// first token of PeerTokenFile (the token file's format; "": none) as a bearer
	// token.
	PeerClient    *http.Client
	PeerTokenFile string
	PeerCAFile    string
	// PeerMaxBytes bounds the peer's answer (0: 8 MiB); it lists at most 65,536
	// workers either way.
	PeerMaxBytes int64
}

// The states of a stream-fed worker in /v1/workers and kvindex_worker_state.
const (
	// fedSyncing: the replica is still applying what the stream held when the server
	// started.
	fedSyncing = "syncing"
	// fedReplicated: caught up; the worker's events arrive as its relay publishes
	// them (the state a match reports for a worker fed by another process).
	fedReplicated = "replicated"
	// fedRemoved: the worker's last event removed it (its relay gave up on the engine).
	fedRemoved = "removed"
)

// replicaFeed is the server's NATS side: a fabric.Replica applying the relay's stream
// to the engine the server answers from.
type replicaFeed struct {
	nc     *nats.Conn
	rep    *fabric.Replica
	engine *engine.Engine
	target uint64 // the stream's last sequence when the server started
}

// startReplica connects to NATS and starts a replica of the stream for cfg's models,
// from the snapshot when one is given and sound.
func startReplica(ctx context.Context, log *slog.Logger, o ReplicaOptions, cfg Config, snapshot string) (*replicaFeed, error) {
	// Tried for fabric.DefaultConnectTimeout, as the relay is: a server down at start
	// fails New with the attempts made rather than a silent wait.
	nc, err := fabric.Dial(ctx, o.URL, "kvindex serve", 0, log, o.NATS...)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrReplica, err)
	}
	models := make([]string, 0, len(cfg.Models))
	for m := range cfg.Models {
		models = append(models, m)
	}
	rep := fabric.NewReplica(nc, fabric.ReplicaConfig{
		Stream: fabric.StreamConfig{Name: o.Stream}, Models: models, Logger: log.With("component", "replica"),
		Engine: cfg.Index.Engine(),
	})
	feed := &replicaFeed{nc: nc, rep: rep}
	if js, err := jetstream.New(nc); err == nil {
		name := o.Stream
		if name == "" {
			name = fabric.DefaultStream
		}
		if st, err := js.Stream(ctx, name); err == nil {
			if info, err := st.Info(ctx); err == nil {
				feed.target = info.State.LastSeq
			}
		}
	}
	if err := rep.Start(ctx, snapshot); err != nil {
		rep.Close()
		nc.Close()
		return nil, fmt.Errorf("%w: %w", ErrReplica, err)
	}
	feed.engine = rep.Engine()
	return feed, nil
}

// close closes the replica (and its engine) and the connection.
func (r *replicaFeed) close() error {
	err := r.rep.Close()
	r.nc.Close()
	return err
}

// caughtUp reports whether the replica has applied everything the stream held at start.
// It takes a barrier before saying so: applied events reach the shards asynchronously,
// and a ready server must answer from all of them.
func (r *replicaFeed) caughtUp() bool {
	if r.rep.LastApplied() < r.target || r.rep.Err() != nil {
		return false
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return r.engine.Barrier(ctx) == nil
}

// workers lists the replica's workers (Server.extWorkers).
func (r *replicaFeed) workers() []WorkerInfo {
	syncing := r.rep.LastApplied() < r.target
	connected := r.nc.IsConnected()
	now := time.Now()
	ws := r.rep.Workers()
	out := make([]WorkerInfo, 0, len(ws))
	for _, w := range ws {
		wi := WorkerInfo{Worker: w.Worker, Model: w.Model, State: fedReplicated, Connected: connected,
			Duplicates: w.Duplicates, LagSeconds: w.Lag.Seconds(), Rejected: map[string]uint64{}}
		switch {
		case w.Gone:
			wi.State = fedRemoved
		case syncing:
			wi.State = fedSyncing
		}
		wi.Synced = wi.State != fedSyncing
		if w.Seq != 0 {
			seq := w.Seq
			wi.LastSeq = &seq
		}
		if !w.LastAt.IsZero() {
			idle := now.Sub(w.LastAt).Seconds()
			wi.IdleSeconds = &idle
		}
		wi.Gaps.Detected = w.Gaps
		wi.Events.Stored, wi.Events.Removed, wi.Events.Cleared, wi.Events.Copied = w.Stored, w.Removed, w.Cleared, w.Copied
		if w.Rejected > 0 {
			wi.Rejected["index"] = w.Rejected
		}
		out = append(out, wi)
	}
	return out
}

// collectors are the feed's series in /metrics.
func (r *replicaFeed) collectors() []prometheus.Collector {
	return []prometheus.Collector{newReplicaCollector(r), NewNATSCollector(r.nc)}
}

// desc is a kvindex_ series description.
func desc(name, help string, labels ...string) *prometheus.Desc {
	return prometheus.NewDesc("kvindex_"+name, help, labels, nil)
}

// natsCollector exports a NATS connection's state (kvindex_nats_*).
type natsCollector struct {
	nc                             *nats.Conn
	connected, reconnects, bytesIn *prometheus.Desc
}

// NewNATSCollector exports a NATS connection's state as kvindex_nats_connected,
// kvindex_nats_reconnects_total and kvindex_nats_bytes_total{direction}: the replica
// feed's and kvindex relay's.
func NewNATSCollector(nc *nats.Conn) prometheus.Collector {
	return &natsCollector{nc: nc,
		connected:  desc("nats_connected", "1 while the NATS connection is up."),
		reconnects: desc("nats_reconnects_total", "Times the NATS connection was re-established."),
		bytesIn:    desc("nats_bytes_total", "Bytes over the NATS connection, by direction (in, out).", "direction"),
	}
}

func (c *natsCollector) Describe(ch chan<- *prometheus.Desc) { prometheus.DescribeByCollect(c, ch) }

func (c *natsCollector) Collect(ch chan<- prometheus.Metric) {
	up := 0.0
	if c.nc.IsConnected() {
		up = 1
	}
	st := c.nc.Stats()
	ch <- prometheus.MustNewConstMetric(c.connected, prometheus.GaugeValue, up)
	ch <- prometheus.MustNewConstMetric(c.reconnects, prometheus.CounterValue, float64(st.Reconnects))
	ch <- prometheus.MustNewConstMetric(c.bytesIn, prometheus.CounterValue, float64(st.InBytes), "in")
	ch <- prometheus.MustNewConstMetric(c.bytesIn, prometheus.CounterValue, float64(st.OutBytes), "out")
}

// replicaCollector exports a replica's stream position and lag (kvindex_stream_*).
type replicaCollector struct {
	feed                                    *replicaFeed
	lastApplied, target, pending, lag, idle *prometheus.Desc
	messages, gaps                          *prometheus.Desc
}

func newReplicaCollector(feed *replicaFeed) *replicaCollector {
	return &replicaCollector{feed: feed,
		lastApplied: desc("stream_last_applied_sequence", "Stream sequence of the last message the replica applied."),
		target:      desc("stream_start_sequence", "The stream's last sequence when serve started: /readyz waits until it is applied."),
		pending:     desc("stream_pending_messages", "Messages of the replica's models the stream held past the last one applied, as of that message: the replica's lag in messages."),
		lag:         desc("stream_lag_seconds", "Apply time of the last message minus the time the stream stored it."),
		idle:        desc("stream_idle_seconds", "Time since the replica applied a message (-1: none since start)."),
		messages:    desc("stream_messages_total", "Stream messages the replica consumed, by result (applied, rejected by the index, duplicate, malformed, foreign to their subject, seq_refused: a worker sequence past max_seq_gap, too_many_workers: a new worker past max_workers).", "result"),
		gaps:        desc("stream_gaps_total", "Messages whose worker sequence skipped ahead of the worker's last."),
	}
}

func (c *replicaCollector) Describe(ch chan<- *prometheus.Desc) { prometheus.DescribeByCollect(c, ch) }

// streamResults are kvindex_stream_messages_total's results, each with the counter of
// fabric.ReplicaStats it reads ("applied" is Applied less Rejected).
var streamResults = []struct {
	result string
	n      func(*fabric.ReplicaStats) uint64
}{
	{"applied", func(st *fabric.ReplicaStats) uint64 { return st.Applied - st.Rejected }},
	{"rejected", func(st *fabric.ReplicaStats) uint64 { return st.Rejected }},
	{"seq_refused", func(st *fabric.ReplicaStats) uint64 { return st.SeqRefused }},
	{"too_many_workers", func(st *fabric.ReplicaStats) uint64 { return st.TooManyWorkers }},
	{"duplicate", func(st *fabric.ReplicaStats) uint64 { return st.Duplicates }},
	{"malformed", func(st *fabric.ReplicaStats) uint64 { return st.Malformed }},
	{"foreign", func(st *fabric.ReplicaStats) uint64 { return st.Foreign }},
}

func (c *replicaCollector) Collect(ch chan<- prometheus.Metric) {
	st := c.feed.rep.Stats()
	g := func(d *prometheus.Desc, v float64, l ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, l...)
	}
	g(c.lastApplied, float64(st.LastApplied))
	g(c.target, float64(c.feed.target))
	g(c.pending, float64(st.Pending))
	g(c.lag, st.Lag.Seconds())
	idle := -1.0
	if !st.LastAt.IsZero() {
		idle = time.Since(st.LastAt).Seconds()
	}
	g(c.idle, idle)
	for _, r := range streamResults {
		ch <- prometheus.MustNewConstMetric(c.messages, prometheus.CounterValue, float64(r.n(&st)), r.result)
	}
	ch <- prometheus.MustNewConstMetric(c.gaps, prometheus.CounterValue, float64(st.Gaps))
}
