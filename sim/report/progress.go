package report

import (
	"fmt"
	"io"
	"time"

	"github.com/schollz/progressbar/v3"
)

// Progress is a bar of an experiment's simulated requests. It runs, and measures its
// rate, from the first request, but shows only once the runs have gone on for a delay:
// a short run prints nothing. Its methods are not safe for concurrent use.
type Progress struct {
	w       *gatedWriter
	delay   time.Duration
	start   time.Time
	bar     *progressbar.ProgressBar
	stopped bool
}

// gatedWriter discards what is written until it opens.
type gatedWriter struct {
	w    io.Writer
	open bool
}

func (g *gatedWriter) Write(b []byte) (int, error) {
	if !g.open {
		return len(b), nil
	}
	return g.w.Write(b)
}

// NewProgress returns a bar of total requests that writes to w after delay; when on is
// false it shows nothing.
func NewProgress(w io.Writer, on bool, total int, delay time.Duration) *Progress {
	p := &Progress{w: &gatedWriter{w: w}, delay: delay, start: time.Now()}
	if on {
		p.bar = progressbar.NewOptions(total,
			progressbar.OptionSetWriter(p.w),
			progressbar.OptionSetDescription("simulating"),
			progressbar.OptionShowCount(),
			progressbar.OptionSetItsString("req"),
			progressbar.OptionShowIts(),
			progressbar.OptionThrottle(100*time.Millisecond),
			progressbar.OptionSetWidth(30),
		)
		p.bar.StartWithoutRender()
	}
	return p
}

// Add counts n more requests simulated (sim.Config.Progress).
func (p *Progress) Add(n int) {
	if p.bar == nil || p.stopped {
		return
	}
	if !p.w.open && time.Since(p.start) >= p.delay {
		p.w.open = true
	}
	_ = p.bar.Add(n)
}

// Finish ends the bar's line, if it showed; later calls do nothing.
func (p *Progress) Finish() {
	if p.stopped {
		return
	}
	p.stopped = true
	if p.bar != nil && p.w.open {
		_ = p.bar.Finish()
		fmt.Fprintln(p.w)
	}
}
