package server

import (
	"strconv"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvindex/kvindex/engine"
	"github.com/kvindex/kvindex/internal/buildinfo"
	"github.com/kvindex/kvindex/kvevents"
	"github.com/kvindex/kvindex/subscriber"
)

// workerSeries are the per-worker series of a subscriber's Status (kvindex_events_*,
// kvindex_worker_*, kvindex_gaps_*, ...): serve's collector and the relay's
// (relay.go) both export them through collect, so a dashboard reads a worker the same
// way whichever process follows its engine ("applied" is handed to the index: serve's
// engine, or the relay's stream).
type workerSeries struct {
	applied, rejected, batches, duplicates                    *prometheus.Desc
	gapsDetected, gapsRecovered, gapsUnrecoverable, invalid   *prometheus.Desc
	replays, replayFailures, restarts, resyncs                *prometheus.Desc
	connects, disconnects, removals, unsupportedSeq, badFrame *prometheus.Desc
	peersRefused                                              *prometheus.Desc
	state, lastSeq, lag                                       *prometheus.Desc
}

func newWorkerSeries() workerSeries {
	w := "worker"
	return workerSeries{
		applied:           desc("events_applied_total", "KV events handed to the index (serve's; a relay's stream), by worker and kind (stored, removed, cleared, copied: an offload named by engine hash only).", w, "kind"),
		rejected:          desc("events_rejected_total", "KV events not handed over, by worker and reason (decoder reasons, index rejections, filters).", w, "reason"),
		batches:           desc("batches_applied_total", "Event batches applied (live and replayed).", w),
		duplicates:        desc("duplicate_batches_total", "Batches skipped as already applied.", w),
		gapsDetected:      desc("gaps_detected_total", "Missing sequence ranges detected.", w),
		gapsRecovered:     desc("gaps_recovered_total", "Missing sequence ranges filled by replay.", w),
		gapsUnrecoverable: desc("gaps_unrecoverable_total", "Missing sequence ranges no longer buffered (worker invalidated).", w),
		invalid:           desc("worker_invalidations_total", "Times a worker was cleared and marked stale.", w),
		replays:           desc("replays_total", "Replay requests sent.", w),
		replayFailures:    desc("replay_failures_total", "Replay requests that failed.", w),
		restarts:          desc("publisher_restarts_total", "Publisher restarts detected.", w),
		resyncs:           desc("resyncs_total", "Stale workers made exact again.", w),
		connects:          desc("connects_total", "Connections to the publisher.", w),
		disconnects:       desc("disconnects_total", "Connections lost.", w),
		removals:          desc("worker_removals_total", "Workers removed after the grace period.", w),
		unsupportedSeq:    desc("unsupported_seq_frames_total", "Messages whose sequence frame is not 8 bytes.", w),
		badFrame:          desc("malformed_messages_total", "Messages with a wrong frame count, topic or a live end marker.", w),
		peersRefused:      desc("peers_refused_total", "Connections closed by the ZMTP guard: a frame past the message cap, a malformed handshake, too many connections.", w),
		state:             desc("worker_state", "1 for the worker's current subscriber state.", w, "state"),
		lastSeq:           desc("worker_last_seq", "Sequence number of the last applied batch (-1: none).", w),
		lag:               desc("worker_lag_seconds", "Apply time minus the batch's timestamp, for the last batch (a stream-fed worker: minus the time the stream stored its last message; a relay's: the time the stream acknowledged it).", w),
	}
}

// metricSink writes const metrics to a Collect channel.
type metricSink chan<- prometheus.Metric

func (ch metricSink) counter(d *prometheus.Desc, v uint64, labels ...string) {
	ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), labels...)
}

func (ch metricSink) gauge(d *prometheus.Desc, v float64, labels ...string) {
	ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
}

// collect writes one subscriber's series.
func (ws *workerSeries) collect(ch metricSink, st subscriber.Status) {
	w := st.Worker
	ch.counter(ws.applied, st.Stored, w, "stored")
	ch.counter(ws.applied, st.Removed, w, "removed")
	ch.counter(ws.applied, st.Cleared, w, "cleared")
	ch.counter(ws.applied, st.Copied, w, "copied")
	for r := subscriber.Reason(0); r < subscriber.NumReasons; r++ {
		ch.counter(ws.rejected, st.Rejected[r], w, r.String())
	}
	for r := kvevents.Reason(0); r < kvevents.NumReasons; r++ {
		ch.counter(ws.rejected, st.DecoderRejected[r], w, subscriber.DecoderReasonName(r))
	}
	for _, p := range []struct {
		d *prometheus.Desc
		v uint64
	}{
		{ws.batches, st.Batches}, {ws.duplicates, st.Duplicates}, {ws.gapsDetected, st.GapsDetected},
		{ws.gapsRecovered, st.GapsRecovered}, {ws.gapsUnrecoverable, st.GapsUnrecoverable},
		{ws.invalid, st.Invalidations}, {ws.replays, st.Replays}, {ws.replayFailures, st.ReplayFailures},
		{ws.restarts, st.Restarts}, {ws.resyncs, st.Resyncs}, {ws.connects, st.Connects},
		{ws.disconnects, st.Disconnects}, {ws.removals, st.Removals}, {ws.unsupportedSeq, st.UnsupportedSeq},
		{ws.badFrame, st.BadFrames}, {ws.peersRefused, st.PeersRefused},
	} {
		ch.counter(p.d, p.v, w)
	}
	for _, state := range subscriber.States() {
		v := 0.0
		if state == st.State {
			v = 1
		}
		ch.gauge(ws.state, v, w, state.String())
	}
	seq := -1.0
	if st.HasSeq {
		seq = float64(st.LastSeq)
	}
	ch.gauge(ws.lastSeq, seq, w)
	ch.gauge(ws.lag, st.Lag.Seconds(), w)
}

// collector reads the subscribers' statuses and the engine's Stats at scrape time, so
// the metrics need no bookkeeping of their own on the event path.
type collector struct {
	s *Server
	workerSeries
	workerBlocks *prometheus.Desc

	workers, blocks, memberships, entries, indexBytes *prometheus.Desc
	indexEvents, indexRejected, skippedRemovals       *prometheus.Desc
	tierBlocks, skippedCopies                         *prometheus.Desc
	queries, abandoned                                *prometheus.Desc
	queueLen, shardApplied, producerWaits, waitSecs   *prometheus.Desc
	predictions, predictedBlocks                      *prometheus.Desc
	namespaces, namespaceBytes, nsDropped, nsRefused  *prometheus.Desc
	replaySlots, replaysWaited                        *prometheus.Desc
}

func newCollector(s *Server) *collector {
	d := desc
	return &collector{
		s:               s,
		workerSeries:    newWorkerSeries(),
		workerBlocks:    d("worker_blocks", "Blocks the worker holds in the index.", "worker"),
		workers:         d("workers", "Workers known to the index."),
		blocks:          d("blocks", "(worker, block) pairs held."),
		memberships:     d("memberships", "(key, worker) memberships in the positional index."),
		entries:         d("index_entries", "Distinct (position, prefix) keys."),
		indexBytes:      d("index_bytes", "Estimated heap held by the shards' tables."),
		indexEvents:     d("index_events_total", "Events the index accepted."),
		indexRejected:   d("index_rejected_total", "Events the index rejected, by reason.", "reason"),
		skippedRemovals: d("index_skipped_removals_total", "Removed hashes the worker did not hold."),
		tierBlocks:      d("tier_blocks", "(worker, block) pairs held, by storage tier (device, host, disk); they sum to kvindex_blocks.", "tier"),
		skippedCopies:   d("index_skipped_copies_total", "Hashes of copied (offloaded) blocks that no other tier of the worker held."),
		queries:         d("index_queries_total", "Find-matches calls with a non-empty query."),
		abandoned:       d("index_queries_abandoned_total", "Find-matches calls ended early by their context."),
		queueLen:        d("shard_queue_len", "Occupancy of each shard's event ring.", "shard"),
		shardApplied:    d("shard_applied_total", "Deltas applied by each shard.", "shard"),
		producerWaits:   d("producer_waits_total", "Times an event producer waited for room in a full shard ring."),
		waitSecs:        d("producer_wait_seconds_total", "Time event producers spent waiting for full shard rings."),
		namespaces:      d("index_namespaces", "Namespace names (models, LoRA adapters, cache salts) the index has interned."),
		namespaceBytes:  d("index_namespace_bytes", "Accounted bytes of the interned namespace names, out of index.namespace_bytes."),
		nsDropped:       d("index_namespaces_dropped_total", "Namespace names dropped because no block and no live prediction used them."),
		nsRefused:       d("index_namespaces_refused_total", "Stored events and predictions refused because the namespace table was full."),
		predictions:     d("predictions", "Predictions held (POST /v1/routed, record; expired ones not yet freed included)."),
		predictedBlocks: d("predicted_blocks", "Blocks in the predictions held."),
		replaySlots:     d("replays_in_progress", "Replays running (state running) and waiting for one of the max_concurrent_replays slots (state waiting).", "state"),
		replaysWaited:   d("replays_waited_total", "Replays that waited for a max_concurrent_replays slot."),
	}
}

func (c *collector) Describe(ch chan<- *prometheus.Desc) { prometheus.DescribeByCollect(c, ch) }

func (c *collector) Collect(out chan<- prometheus.Metric) {
	ch := metricSink(out)
	counter, gauge := ch.counter, ch.gauge
	sizer := c.s.sizer()
	for _, sub := range c.s.fleet().subs.All() {
		st := sub.Status()
		c.workerSeries.collect(ch, st)
		if sizer != nil {
			if n, ok := sizer.WorkerSize(st.Worker); ok {
				gauge(c.workerBlocks, float64(n), st.Worker)
			}
		}
	}
	// Workers fed from elsewhere (Options.Workers): the series their source knows.
	for _, wi := range c.s.fedWorkers(c.s.fleet()) {
		w := wi.Worker
		counter(c.applied, wi.Events.Stored, w, "stored")
		counter(c.applied, wi.Events.Removed, w, "removed")
		counter(c.applied, wi.Events.Cleared, w, "cleared")
		counter(c.applied, wi.Events.Copied, w, "copied")
		counter(c.duplicates, wi.Duplicates, w)
		counter(c.gapsDetected, wi.Gaps.Detected, w)
		gauge(c.state, 1, w, wi.State)
		seq := -1.0
		if wi.LastSeq != nil {
			seq = float64(*wi.LastSeq)
		}
		gauge(c.lastSeq, seq, w)
		gauge(c.lag, wi.LagSeconds, w)
		if sizer != nil {
			if n, ok := sizer.WorkerSize(w); ok {
				gauge(c.workerBlocks, float64(n), w)
			}
		}
	}
	es := c.s.eng.Stats()
	gauge(c.workers, float64(es.Workers))
	gauge(c.blocks, float64(es.Blocks))
	gauge(c.memberships, float64(es.Memberships))
	gauge(c.entries, float64(es.IndexEntries))
	gauge(c.indexBytes, float64(es.IndexBytes))
	counter(c.indexEvents, es.Events)
	counter(c.indexRejected, es.RejectedParentNotFound, "parent_not_found")
	counter(c.indexRejected, es.RejectedInvalid, "invalid_event")
	counter(c.skippedRemovals, es.SkippedRemovals)
	for t, n := range es.TierBlocks {
		gauge(c.tierBlocks, float64(n), engine.Tier(t).String())
	}
	counter(c.skippedCopies, es.SkippedCopies)
	counter(c.queries, es.Queries)
	counter(c.abandoned, es.Abandoned)
	for i, sh := range es.Shards {
		id := strconv.Itoa(i)
		gauge(c.queueLen, float64(sh.QueueLen), id)
		counter(c.shardApplied, sh.Applied, id)
	}
	counter(c.producerWaits, es.ProducerWaits)
	out <- prometheus.MustNewConstMetric(c.waitSecs, prometheus.CounterValue, float64(es.ProducerWaitNanos)/1e9)
	rs := c.s.replays.Stats()
	gauge(c.replaySlots, float64(rs.Running), "running")
	gauge(c.replaySlots, float64(rs.Waiting), "waiting")
	counter(c.replaysWaited, rs.Waited)
	gauge(c.namespaces, float64(es.Namespaces))
	gauge(c.namespaceBytes, float64(es.NamespaceBytes))
	counter(c.nsDropped, es.NamespacesDropped)
	counter(c.nsRefused, es.NamespacesRefused)
	ps := c.s.eng.PredictionStats()
	gauge(c.predictions, float64(ps.Predictions))
	gauge(c.predictedBlocks, float64(ps.Blocks))
}

// buildInfoGauge is kvindex_build_info: always 1, its labels say which binary runs
// (package buildinfo), so a dashboard can join any series with the version behind it.
func buildInfoGauge() prometheus.Collector {
	info := buildinfo.Read()
	g := prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "kvindex_build_info",
		Help: "Always 1; the labels name the running binary's version, VCS revision and Go toolchain.",
		ConstLabels: prometheus.Labels{
			"version": info.Version, "revision": info.Revision, "goversion": info.GoVersion,
		},
	})
	g.Set(1)
	return g
}
