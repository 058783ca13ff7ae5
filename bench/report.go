package bench

import (
	"fmt"
	"io"
	"runtime"
	"strings"
	"unicode/utf8"
)

// Header is what a report says about its run.
type Header struct {
	// Command is the exact command line, shown verbatim.
	Command  string
	Workload *Workload
	Options  Options
}

// WriteReport writes the results as tables: markdown when markdown is set, aligned plain
// text otherwise.
func WriteReport(out io.Writer, h Header, results []Result, markdown bool) error {
	opt := h.Options.withDefaults()
	w := h.Workload
	var b strings.Builder
	if markdown {
		b.WriteString("### kvindex bench\n\n")
		fmt.Fprintf(&b, "`%s`\n\n", h.Command)
	} else {
		fmt.Fprintf(&b, "kvindex bench: %s\n\n", h.Command)
	}
	bullet := "- "
	if !markdown {
		bullet = "  "
	}
	fmt.Fprintf(&b, "%s%s %s/%s, %d CPUs, GOMAXPROCS %d\n", bullet, runtime.Version(), runtime.GOOS, runtime.GOARCH, runtime.NumCPU(), runtime.GOMAXPROCS(0))
	avg := 0.0
	if len(w.Queries) > 0 {
		avg = float64(w.QueryBlocks) / float64(len(w.Queries))
	}
	fmt.Fprintf(&b, "%sworkload %s: %s ops, %s events (%s block ops), %s queries (%.0f blocks on average), %d workers\n",
		bullet, w.Name, Thousands(int64(w.Ops)), Thousands(int64(len(w.Events))), Thousands(w.BlockOps), Thousands(int64(len(w.Queries))), avg, len(w.Workers))
	if len(results) > 0 && len(results[0].Events) > 0 {
		fmt.Fprintf(&b, "%srejected stored events per pass: %d\n", bullet, results[0].Events[0].Rejected)
	}
	fmt.Fprintf(&b, "%s%v per measurement; medians of passes for events; under load: 1 streamer + %d queriers\n\n", bullet, opt.Duration, opt.Queriers)

	// Event throughput.
	hdr := []string{"impl"}
	for _, p := range opt.Producers {
		hdr = append(hdr, fmt.Sprintf("events/s P=%d", p), fmt.Sprintf("block ops/s P=%d", p))
	}
	hdr = append(hdr, "allocs/event", "passes")
	var rows [][]string
	for _, r := range results {
		row := []string{r.Impl}
		passes := make([]string, 0, len(r.Events))
		for _, e := range r.Events {
			row = append(row, rate(e.EventsPerSec), rate(e.BlockOpsPerSec))
			passes = append(passes, fmt.Sprint(e.Passes))
		}
		for len(row) < len(hdr)-2 {
			row = append(row, "-")
		}
		allocs := "-"
		if len(r.Events) > 0 {
			allocs = fmt.Sprintf("%.2f", r.Events[0].AllocsPerEvent)
		}
		rows = append(rows, append(row, allocs, strings.Join(passes, "/")))
	}
	section(&b, markdown, "Event throughput (every event on a fresh index, one Apply each, then Sync; P producers own disjoint workers; "+
		"block ops: stored blocks + removed seqs, queries not counted, unlike kvindex replay's)", hdr, rows)

	// Queries under load.
	hdr = []string{"impl", "queries/s", "p50", "p99", "p99.9", "events/s meanwhile", "stream loops"}
	rows = rows[:0]
	for _, r := range results {
		q := r.Load
		rows = append(rows, []string{r.Impl, rate(q.QueriesPerSec), dur(q.P50), dur(q.P99), dur(q.P999), rate(q.EventsPerSec), fmt.Sprint(q.Loops)})
	}
	section(&b, markdown, fmt.Sprintf("find-matches under load (%d queriers; 1 streamer looping over the stream, its first, index-filling loop untimed)", opt.Queriers), hdr, rows)

	// Queries at rest.
	hdr = []string{"impl", "queries/s", "p50", "p99", "p99.9", "allocs/query", "round trips/query", "probes/query"}
	rows = rows[:0]
	for _, r := range results {
		q := r.Rest
		rows = append(rows, []string{r.Impl, rate(q.QueriesPerSec), dur(q.P50), dur(q.P99), dur(q.P999), fmt.Sprintf("%.2f", q.AllocsPerQuery),
			perQuery(q.RoundsPerQuery, "%.3f"), perQuery(q.ProbesPerQuery, "%.1f")})
	}
	section(&b, markdown, "find-matches at rest (1 querier, the index a full pass leaves, no events)", hdr, rows)

	// Memory and correctness.
	hdr = []string{"impl", "memberships", "heap", "bytes/membership", "verified queries"}
	rows = rows[:0]
	for _, r := range results {
		m := r.Memory
		v := "skipped"
		if r.Verify.Passed+r.Verify.Failed > 0 || w.Checked == 0 {
			v = fmt.Sprintf("%d/%d", r.Verify.Passed, r.Verify.Passed+r.Verify.Failed)
			if r.Verify.Failed > 0 {
				v += " FAILED"
			}
		}
		rows = append(rows, []string{r.Impl, Thousands(m.Memberships), mib(m.HeapBytes), fmt.Sprintf("%.0f", m.BytesPerMembership), v})
	}
	section(&b, markdown, "Memory after one full pass (live heap growth after GC / sum of worker sizes) and correctness", hdr, rows)
	for _, r := range results {
		if r.Verify.First != "" {
			fmt.Fprintf(&b, "%s: first mismatch: %s\n", r.Impl, r.Verify.First)
		}
	}
	_, err := io.WriteString(out, b.String())
	return err
}

// section writes one titled table; the first column is left-aligned, the others right.
func section(b *strings.Builder, markdown bool, title string, hdr []string, rows [][]string) {
	if markdown {
		fmt.Fprintf(b, "#### %s\n\n", title)
		b.WriteString("| " + strings.Join(hdr, " | ") + " |\n|")
		for i := range hdr {
			if i == 0 {
				b.WriteString(" --- |")
			} else {
				b.WriteString(" ---: |")
			}
		}
		b.WriteString("\n")
		for _, r := range rows {
			b.WriteString("| " + strings.Join(r, " | ") + " |\n")
		}
		b.WriteString("\n")
		return
	}
	fmt.Fprintf(b, "%s\n", title)
	width := make([]int, len(hdr))
	for _, r := range append([][]string{hdr}, rows...) {
		for i, c := range r {
			if i < len(width) {
				width[i] = max(width[i], utf8.RuneCountInString(c))
			}
		}
	}
	for _, r := range append([][]string{hdr}, rows...) {
		b.WriteString(" ")
		for i, c := range r {
			pad := strings.Repeat(" ", width[i]-utf8.RuneCountInString(c))
			if i == 0 {
				b.WriteString(" " + c + pad)
			} else {
				b.WriteString("  " + pad + c)
			}
		}
		b.WriteString("\n")
	}
	b.WriteString("\n")
}

// rate formats a per-second rate with three significant digits and a k/M suffix.
func rate(x float64) string {
	switch {
	case x <= 0:
		return "-"
	case x >= 1e6:
		return sig3(x/1e6) + "M"
	case x >= 1e3:
		return sig3(x/1e3) + "k"
	}
	return sig3(x)
}

func sig3(x float64) string {
	switch {
	case x >= 100:
		return fmt.Sprintf("%.0f", x)
	case x >= 10:
		return fmt.Sprintf("%.1f", x)
	}
	return fmt.Sprintf("%.2f", x)
}

// dur formats nanoseconds.
func dur(ns int64) string {
	switch {
	case ns <= 0:
		return "-"
	case ns >= 1e6:
		return sig3(float64(ns)/1e6) + " ms"
	case ns >= 1e3:
		return sig3(float64(ns)/1e3) + " µs"
	}
	return fmt.Sprintf("%d ns", ns)
}

func mib(b int64) string { return fmt.Sprintf("%.1f MiB", float64(b)/(1<<20)) }

// Thousands formats n with thousands separators (1,234,567).
func Thousands(n int64) string {
	s := fmt.Sprint(n)
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	var b strings.Builder
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	if neg {
		return "-" + b.String()
	}
	return b.String()
}

// perQuery formats a per-query count, "-" where the implementation does not count it
// (v < 0).
func perQuery(v float64, format string) string {
	if v < 0 {
		return "-"
	}
	return fmt.Sprintf(format, v)
}
