package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/kvindex/kvindex/fabric"
	"github.com/kvindex/kvindex/internal/buildinfo"
	"github.com/kvindex/kvindex/kvevents"
	"github.com/kvindex/kvindex/server"
	"github.com/kvindex/kvindex/subscriber"
)

// What a relay shows of the fleet: its series in /metrics and its own health and
// metrics endpoints (serve's NATS replica shows its own: package server's replica.go).
// Everything here reads counters at request or scrape time; nothing runs on the event
// path.

// defaultConnectTimeout bounds how long relay keeps trying to reach NATS and create
// its stream at start before it gives up with the reason (--connect-timeout).
const defaultConnectTimeout = 10 * time.Second

// connectNATS dials url until it answers or timeout passes, backing off from 100 ms to
// 2 s between attempts, and returns the connection (which then reconnects by itself
// for as long as the process runs) or the last attempt's error with the attempts made.
// A server that is down at start is a configuration error far more often than a
// transient one: the caller exits instead of waiting silently.
func connectNATS(ctx context.Context, url, name string, timeout time.Duration, log *slog.Logger, auth ...nats.Option) (*nats.Conn, error) {
	start := time.Now()
	deadline := start.Add(timeout)
	wait := 100 * time.Millisecond
	for attempt := 1; ; attempt++ {
		dial := min(2*time.Second, max(time.Until(deadline), 100*time.Millisecond))
		nc, err := nats.Connect(url, append([]nats.Option{nats.Name(name), nats.Timeout(dial), nats.MaxReconnects(-1),
			nats.ReconnectWait(250 * time.Millisecond)}, auth...)...)
		if err == nil {
			return nc, nil
		}
		if time.Now().Add(wait).After(deadline) || ctx.Err() != nil {
			return nil, fmt.Errorf("no NATS server at %s after %d attempts in %v: %w", url, attempt, time.Since(start).Round(time.Millisecond), err)
		}
		log.Warn("NATS not reachable; retrying", "url", url, "attempt", attempt, "err", err, "wait", wait)
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
		case <-t.C:
		}
		wait = min(2*wait, 2*time.Second)
	}
}

// natsState names a connection's state for /readyz ("connected", "reconnecting", ...).
func natsState(nc *nats.Conn) string {
	switch nc.Status() {
	case nats.CONNECTED:
		return "connected"
	case nats.RECONNECTING:
		return "reconnecting"
	case nats.CONNECTING:
		return "connecting"
	case nats.CLOSED:
		return "closed"
	case nats.DRAINING_PUBS, nats.DRAINING_SUBS:
		return "draining"
	}
	return "disconnected"
}

// desc is a kvindex_ series description.
func desc(name, help string, labels ...string) *prometheus.Desc {
	return prometheus.NewDesc("kvindex_"+name, help, labels, nil)
}

// buildInfo is kvindex_build_info for the relay (serve's comes from package server).
func buildInfo() prometheus.Collector {
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

// relayCollector exports what a relay published and dropped (kvindex_relay_*) and its
// subscribers' worker series.
type relayCollector struct {
	pub                                   *fabric.Publisher
	subs                                  []*subscriber.Subscriber
	published, duplicates, skipped, retry *prometheus.Desc
	split, refused                        *prometheus.Desc
	dropped, events, state, lastSeq, lag  *prometheus.Desc
	gapsDetected, gapsRecovered, gapsLost *prometheus.Desc
}

func newRelayCollector(pub *fabric.Publisher, subs []*subscriber.Subscriber) *relayCollector {
	w := "worker"
	return &relayCollector{pub: pub, subs: subs,
		published:     desc("relay_published_total", "Events the stream stored."),
		duplicates:    desc("relay_duplicates_total", "Events the stream acknowledged as duplicates of stored ones (its deduplication window)."),
		skipped:       desc("relay_skipped_total", "Events not sent because the stream already held them (a restarted relay's replayed history)."),
		retry:         desc("relay_publish_retries_total", "Publish attempts that failed and were retried."),
		split:         desc("relay_split_total", "Events published in parts because one message would exceed the server's max_payload."),
		refused:       desc("relay_refused_total", "Events not published because they cannot fit a message even split (their names alone), or are malformed."),
		dropped:       desc("relay_dropped_total", "Engine events not published, by worker and reason (decoder rejections, filters).", w, "reason"),
		events:        desc("relay_events_total", "Engine events handed to the stream, by worker and kind.", w, "kind"),
		state:         desc("worker_state", "1 for the worker's current subscriber state.", w, "state"),
		lastSeq:       desc("worker_last_seq", "Sequence number of the worker's last batch published (-1: none).", w),
		lag:           desc("worker_lag_seconds", "The time the stream acknowledged the worker's last batch minus the batch's engine timestamp: the stream's lag behind the engine.", w),
		gapsDetected:  desc("gaps_detected_total", "Missing sequence ranges detected.", w),
		gapsRecovered: desc("gaps_recovered_total", "Missing sequence ranges filled by replay.", w),
		gapsLost:      desc("gaps_unrecoverable_total", "Missing sequence ranges no longer buffered (the worker was cleared).", w),
	}
}

func (c *relayCollector) Describe(ch chan<- *prometheus.Desc) { prometheus.DescribeByCollect(c, ch) }

func (c *relayCollector) Collect(ch chan<- prometheus.Metric) {
	g := func(d *prometheus.Desc, v float64, l ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, l...)
	}
	n := func(d *prometheus.Desc, v uint64, l ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), l...)
	}
	ps := c.pub.Stats()
	n(c.published, ps.Published)
	n(c.duplicates, ps.Duplicates)
	n(c.skipped, ps.Skipped)
	n(c.retry, ps.Retries)
	n(c.split, ps.Split)
	n(c.refused, ps.Refused)
	for _, sub := range c.subs {
		st := sub.Status()
		w := st.Worker
		for r := subscriber.Reason(0); r < subscriber.NumReasons; r++ {
			n(c.dropped, st.Rejected[r], w, r.String())
		}
		for r := kvevents.Reason(0); r < kvevents.NumReasons; r++ {
			n(c.dropped, st.DecoderRejected[r], w, subscriber.DecoderReasonName(r))
		}
		n(c.events, st.Stored, w, "stored")
		n(c.events, st.Removed, w, "removed")
		n(c.events, st.Cleared, w, "cleared")
		n(c.events, st.Copied, w, "copied")
		for _, s := range subscriber.States() {
			v := 0.0
			if s == st.State {
				v = 1
			}
			g(c.state, v, w, s.String())
		}
		seq := -1.0
		if st.HasSeq {
			seq = float64(st.LastSeq)
		}
		g(c.lastSeq, seq, w)
		g(c.lag, st.Lag.Seconds(), w)
		n(c.gapsDetected, st.GapsDetected, w)
		n(c.gapsRecovered, st.GapsRecovered, w)
		n(c.gapsLost, st.GapsUnrecoverable, w)
	}
}

// relayHTTP serves the relay's /healthz, /readyz and /metrics on ln until Close.
//
// /healthz is liveness: 200 while the NATS connection is not closed for good (it
// reconnects by itself otherwise). /readyz is 200 once NATS is connected and every
// subscriber has synced (or its engine was removed after the grace period), 503 with
// what it waits for otherwise.
type relayHTTP struct {
	srv  *http.Server
	done chan error
}

func startRelayHTTP(ln net.Listener, nc *nats.Conn, pub *fabric.Publisher, subs []*subscriber.Subscriber) (*relayHTTP, error) {
	reg := prometheus.NewRegistry()
	for _, c := range []prometheus.Collector{newRelayCollector(pub, subs), server.NewNATSCollector(nc), buildInfo()} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, r *http.Request) {
		if nc.IsClosed() {
			writeJSONStatus(w, http.StatusServiceUnavailable, map[string]string{"status": "unhealthy", "nats": "closed"})
			return
		}
		writeJSONStatus(w, http.StatusOK, map[string]string{"status": "ok", "nats": natsState(nc)})
	})
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, r *http.Request) {
		var waiting []string
		if !nc.IsConnected() {
			waiting = append(waiting, "nats ("+natsState(nc)+")")
		}
		for _, sub := range subs {
			if st := sub.Status(); !st.Synced && st.State != subscriber.StateRemoved {
				waiting = append(waiting, st.Worker+" ("+st.State.String()+")")
			}
		}
		if len(waiting) > 0 {
			writeJSONStatus(w, http.StatusServiceUnavailable, map[string]any{"ready": false, "waiting": waiting})
			return
		}
		writeJSONStatus(w, http.StatusOK, map[string]any{"ready": true})
	})
	h := &relayHTTP{srv: &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}, done: make(chan error, 1)}
	go func() { h.done <- h.srv.Serve(ln) }()
	return h, nil
}

// Close stops serving and waits for the serving goroutine.
func (h *relayHTTP) Close() error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	err := h.srv.Shutdown(ctx)
	if serr := <-h.done; !errors.Is(serr, http.ErrServerClosed) {
		err = errors.Join(err, serr)
	}
	return err
}

func writeJSONStatus(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}
