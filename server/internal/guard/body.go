package guard

import (
	"io"
	"time"
)

// BodyRate is the minimum rate of a request body: after Grace, a body must have
// arrived at MinRate bytes a second, and no read may wait longer than Grace for its
// first byte. A client that sends all of a body but its last bytes and stalls, or that
// trickles it, loses its connection (and its reservation) after Grace rather than after
// the server's read timeout.
type BodyRate struct {
	MinRate int64         // bytes a second, > 0
	Grace   time.Duration // > 0
}

// deadline is when the next read must have returned, start being when the body's
// first read began and read what it has read so far: the body's schedule (Grace plus
// read+1 bytes at MinRate) but no later than Grace from now, so that a stall ends after
// Grace however far ahead of its schedule the body was.
func (r BodyRate) deadline(start, now time.Time, read int64) time.Time {
	n := read + 1
	sched := start.Add(r.Grace + time.Duration(n/r.MinRate)*time.Second + time.Duration(n%r.MinRate)*time.Second/time.Duration(r.MinRate))
	idle := now.Add(r.Grace)
	if idle.Before(sched) {
		return idle
	}
	return sched
}

// Reader enforces r on body through setDeadline (http.ResponseController's
// SetReadDeadline): before each read it sets the read's deadline. now is the clock.
func (r BodyRate) Reader(body io.Reader, setDeadline func(time.Time) error, now func() time.Time) io.Reader {
	return &rateReader{rate: r, body: body, set: setDeadline, now: now}
}

type rateReader struct {
	rate  BodyRate
	body  io.Reader
	set   func(time.Time) error
	now   func() time.Time
	start time.Time
	read  int64
}

func (rr *rateReader) Read(p []byte) (int, error) {
	now := rr.now()
	if rr.start.IsZero() {
		rr.start = now
	}
	// A writer that cannot set deadlines (a handler served without a connection) is
	// read without them.
	_ = rr.set(rr.rate.deadline(rr.start, now, rr.read))
	n, err := rr.body.Read(p)
	rr.read += int64(n)
	return n, err
}
