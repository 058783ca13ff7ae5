package fleet

import (
	"fmt"
	"io"
	"slices"
	"strings"
	"time"
)

func ms(d time.Duration) string {
	switch {
	case d == 0:
		return "-"
	case d < time.Millisecond:
		return fmt.Sprintf("%.0f µs", float64(d)/1e3)
	case d < 100*time.Millisecond:
		return fmt.Sprintf("%.1f ms", float64(d)/1e6)
	}
	return fmt.Sprintf("%.0f ms", float64(d)/1e6)
}

func mib(b int64) string { return fmt.Sprintf("%.0f MiB", float64(b)/(1<<20)) }

// CPUPerBatch is serve's CPU time per applied batch, in µs: a cost that depends less on
// what else the machine runs than the rates do (queries and probes included, so it
// falls as the rate grows).
func (l *Level) CPUPerBatch() float64 {
	if l.AppliedRate == 0 {
		return 0
	}
	return l.CPU / l.AppliedRate * 1e6
}

// line is a level in one line (progress output).
func (l *Level) line() string {
	held := "held"
	if !l.Held {
		held = "NOT held: " + strings.Join(l.Why, "; ")
	}
	m := []string{}
	for _, api := range slices.Sorted(mapKeys(l.Match)) {
		x := l.Match[api]
		m = append(m, fmt.Sprintf("%s p50 %s p99 %s (from send %s)", api, ms(x.P50), ms(x.P99), ms(l.MatchSent[api].P99)))
	}
	return fmt.Sprintf("%d engines, offered %.0f/s: published %.0f/s, applied %.0f batches/s (%.0f blocks/s), loss %d, gaps %d (unrecoverable %d), replays %d (served in at most %v), dropped %d, stale %d, size mismatches %d, drained in %v, lag p50 %s p99 %s, match %s; serve's match p99 %s, sched p99 %s, find p99 %s; serve RSS %s, %d goroutines, %d fds, CPU %.2f (%.0f µs/batch; load generator %.2f); load %s: %s",
		l.Engines, l.Offered, l.PublishRate, l.AppliedRate, l.BlocksRate, l.Loss, l.Gaps, l.Unrecoverable, l.Replays,
		l.ReplayServeMax.Round(time.Millisecond), l.Dropped, l.Stale, l.SizeMismatch, l.Drained.Round(time.Millisecond), ms(l.Lag.P50), ms(l.Lag.P99),
		strings.Join(m, ", "), serveMatch(l), ms(l.ServeSched), ms(l.ServeFind), mib(l.RSS), l.Goroutines, l.FDs, l.CPU, l.CPUPerBatch(), l.GenCPU, l.Load, held)
}

// queriesFrom says where the match clients ran.
func queriesFrom(c *Config) string {
	if len(c.QueryCommand) > 0 {
		return " from a child process at serve's priority"
	}
	return " from the load generator"
}

// serveMatch is serve's own match p99 by API, "grpc X, http Y" ("-" where unread).
func serveMatch(l *Level) string {
	if len(l.ServeMatch) == 0 {
		return "-"
	}
	var m []string
	for _, api := range slices.Sorted(mapKeys(l.ServeMatch)) {
		m = append(m, api+" "+ms(l.ServeMatch[api]))
	}
	return strings.Join(m, ", ")
}

func mapKeys[V any](m map[string]V) func(func(string) bool) {
	return func(yield func(string) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	}
}

// Markdown writes the report as a Markdown table, one row per level (the warm-up
// first), with the command that produced it.
func (r *Report) Markdown(w io.Writer, command string) {
	c := r.Config
	fmt.Fprintf(w, "Command: `%s`\n\n", command)
	wl := c.Fleet.Workload
	fmt.Fprintf(w, "Setup: %d engines (%s server, GOMAXPROCS %d, %d CPUs), each a ZMTP PUB and ROUTER on 127.0.0.1; "+
		"block size %d, %d-block caches, %d system prompts of %d blocks, %d sessions per engine, turns of 1-%d blocks + %d output; "+
		"%s events; replay buffer %d batches; PUB queue %d KiB; queries %.0f/s over %s%s; %.0f lag probes/s. "+
		"Connected and synced in %v.\n\n",
		r.Workers, r.Server, r.GoMax, r.CPUs, wl.BlockSize, wl.Capacity, wl.SystemPrompts, wl.SystemBlocks, wl.Sessions,
		2*wl.TurnBlocks, wl.OutputBlocks, c.Fleet.Encoding, c.Fleet.BufferSteps, c.Fleet.HWMBytes>>10, c.QueryRate,
		strings.Join(c.APIs, "+"), queriesFrom(&c), c.ProbeRate, r.Setup.Round(time.Millisecond))
	fmt.Fprintln(w, "| engines | offered batches/s | published/s | applied batches/s | blocks/s | loss | gaps (unrec.) | replays | PUB drops | stale | size ≠ | lag p50 | lag p99 | match p50 | match p99 | match p99 from send | serve's match p99 | serve's sched p99, find p99 | serve RSS | goroutines | fds | serve CPU | serve CPU µs/batch | loadgen CPU | load | held |")
	fmt.Fprintln(w, "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---|")
	row := func(name string, l *Level) {
		var p50, p99, p99s []string
		for _, api := range slices.Sorted(mapKeys(l.Match)) {
			p50 = append(p50, api+" "+ms(l.Match[api].P50))
			p99 = append(p99, api+" "+ms(l.Match[api].P99))
			p99s = append(p99s, api+" "+ms(l.MatchSent[api].P99))
		}
		held := "yes"
		if !l.Held {
			held = "no: " + strings.Join(l.Why, "; ")
		}
		gen := "-"
		if r.Server == ServerExec {
			gen = fmt.Sprintf("%.2f", l.GenCPU)
		}
		fmt.Fprintf(w, "| %s | %.0f | %.0f | %.0f | %.0f | %d | %d (%d) | %d | %d | %d | %d | %s | %s | %s | %s | %s | %s | %s, %s | %s | %d | %d | %.2f | %.0f | %s | %s | %s |\n",
			name, l.Offered, l.PublishRate, l.AppliedRate, l.BlocksRate, l.Loss, l.Gaps, l.Unrecoverable, l.Replays,
			l.Dropped, l.Stale, l.SizeMismatch, ms(l.Lag.P50), ms(l.Lag.P99), strings.Join(p50, ", "), strings.Join(p99, ", "), strings.Join(p99s, ", "),
			serveMatch(l), ms(l.ServeSched), ms(l.ServeFind), mib(l.RSS), l.Goroutines, l.FDs, l.CPU, l.CPUPerBatch(), gen, l.Load, held)
	}
	if r.Warmup != nil {
		row(fmt.Sprintf("%d (warm-up)", r.Warmup.Engines), r.Warmup)
	}
	for i := range r.Levels {
		row(fmt.Sprint(r.Levels[i].Engines), &r.Levels[i])
	}
	fmt.Fprintln(w)
}
