package server

import (
	"sync"
	"time"
)

// The resync gate: POST /v1/workers/{w}/resync replays a worker from the stream (the
// replica's lock held one message at a time: the other workers keep applying) and
// opens a consumer on the NATS server. Four clients calling it in a loop once held the
// replica 14.6 s behind its stream, when the replay held the lock throughout. So the
// endpoint is the admin role's (auth.go), names only a
// worker the replica follows (404 otherwise), runs one resync at a time, and resyncs a
// worker at most once per resyncInterval: a call past either bound is refused with 429
// and Retry-After, before anything is done.

// resyncInterval is how often one worker may be resynced on request.
const resyncInterval = 30 * time.Second

// resyncGate admits resyncs. Its map holds a worker only while its interval runs, so
// it is bounded by the workers resynced in the last resyncInterval, at most one a
// resync (one at a time, each bounded by resyncTimeout).
type resyncGate struct {
	mu      sync.Mutex
	running bool
	last    map[string]time.Time // worker -> when its last resync started
}

// admit reports whether a resync of worker may start at now; when not, how long to
// wait and why ("busy": another is running; "recent": the worker's interval runs).
// A resync admitted must be ended with done.
func (g *resyncGate) admit(worker string, now time.Time) (wait time.Duration, why string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	for w, t := range g.last { // drop the intervals that ended
		if now.Sub(t) >= resyncInterval {
			delete(g.last, w)
		}
	}
	if g.running {
		return time.Second, "busy"
	}
	if t, ok := g.last[worker]; ok {
		return resyncInterval - now.Sub(t), "recent"
	}
	if g.last == nil {
		g.last = map[string]time.Time{}
	}
	g.running, g.last[worker] = true, now
	return 0, ""
}

// done ends the running resync.
func (g *resyncGate) done() {
	g.mu.Lock()
	g.running = false
	g.mu.Unlock()
}
