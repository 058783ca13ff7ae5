package fabric

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/kvindex/kvindex/hash"
	"github.com/kvindex/kvindex/route"
)

// Load sharing: router replicas tell each other the load they send (LoadShare).
//
// Each replica's Tracker (package route) knows only the requests it routed, so with N
// replicas behind a round-robin front each sees about 1/N of every worker's load and
// the load-aware policies under-count it N times. A LoadShare publishes the replica's
// own deltas (routed, first token, finished) on a core NATS subject and folds every
// other replica's into the local Tracker under keys of their own, so that each
// replica's Tracker counts the whole fleet's requests in flight. Core NATS, not
// JetStream: load is perishable, a lost delta costs accuracy until the request's
// finish, its TTL or the sender's silence, and nothing more.
//
// Deltas are input from whoever may publish on the subject, so a LoadShare bounds
// what they make it hold: at most MaxReplicas senders, each with at most
// MaxPerReplica requests in flight, names and ids of bounded length, at most
// route.MaxRequestBlocks hashes; a sender silent for Silence (it publishes a heartbeat
// every Heartbeat) has all its requests dropped. Every refused delta is counted in
// LoadShareStats.
//
// A request of another replica also stops counting TTL after it was folded, finish or
// not, as the sender's own Tracker forgets it (route.TrackerConfig.TTL): a request the
// sender drops by its TTL sends no finish, and core NATS may lose one, so without it a
// replica that keeps heartbeating would fill its MaxPerReplica with requests long
// gone and have every later delta refused. Each remote replica keeps its requests in
// folding order; the expired head is dropped whenever that replica's next delta is
// folded and, for every replica, at each heartbeat tick, so expiry costs amortised
// O(1) a delta and needs no timer per request.

// Load sharing defaults and bounds.
const (
	DefaultLoadSubject   = "kvindex.load"
	DefaultHeartbeat     = 2 * time.Second
	DefaultSilence       = 10 * time.Second
	DefaultMaxPerReplica = 1 << 16
	DefaultMaxReplicas   = 256
	// DefaultShareTTL is how long another replica's request counts without a finish:
	// the Tracker's default TTL, which the sender forgets it by.
	DefaultShareTTL = route.DefaultTrackerTTL
	// MaxLoadName bounds a replica id, a request id and a worker name in a delta.
	MaxLoadName = 256
	// MaxShareBlocks bounds the block hashes a routed delta carries; a longer request
	// shares its first MaxShareBlocks (its tail blocks then count as its own).
	MaxShareBlocks = 8192
	// MaxShareTokens bounds a routed delta's prompt tokens, so that no peer can make
	// one request count past any real prompt (or overflow a worker's sums).
	MaxShareTokens = 1 << 24
)

// The kinds of load delta.
const (
	deltaRouted     = "routed"
	deltaFirstToken = "first"
	deltaFinished   = "done"
	deltaBeat       = "beat"
)

// loadDelta is one message on the subject (JSON).
type loadDelta struct {
	Replica   string   `json:"r"`
	Kind      string   `json:"k"`
	ID        string   `json:"id,omitempty"`
	Worker    string   `json:"w,omitempty"`
	Tokens    int      `json:"t,omitempty"`
	Cached    int      `json:"c,omitempty"`
	BlockSize int      `json:"b,omitempty"`
	Blocks    []uint64 `json:"h,omitempty"`
}

// errDelta wraps every reason a delta is refused.
var errDelta = errors.New("fabric: bad load delta")

// decodeDelta reads and checks one delta.
func decodeDelta(data []byte) (loadDelta, error) {
	var d loadDelta
	if err := json.Unmarshal(data, &d); err != nil {
		return loadDelta{}, fmt.Errorf("%w: %v", errDelta, err)
	}
	switch {
	case d.Replica == "" || len(d.Replica) > MaxLoadName || len(d.ID) > MaxLoadName || len(d.Worker) > MaxLoadName:
		return loadDelta{}, fmt.Errorf("%w: replica, id or worker empty or over %d bytes", errDelta, MaxLoadName)
	case d.Kind != deltaBeat && d.ID == "":
		return loadDelta{}, fmt.Errorf("%w: %s without a request id", errDelta, d.Kind)
	case d.Kind == deltaRouted && (d.Worker == "" || d.Tokens < 0 || d.Tokens > MaxShareTokens || d.Cached < 0 ||
		d.BlockSize < 1 || d.BlockSize > hash.MaxBlockSize || len(d.Blocks) > MaxShareBlocks):
		return loadDelta{}, fmt.Errorf("%w: routed %q to %q: %d tokens, %d cached, block size %d, %d hashes",
			errDelta, d.ID, d.Worker, d.Tokens, d.Cached, d.BlockSize, len(d.Blocks))
	case d.Kind != deltaRouted && d.Kind != deltaFirstToken && d.Kind != deltaFinished && d.Kind != deltaBeat:
		return loadDelta{}, fmt.Errorf("%w: kind %q", errDelta, d.Kind)
	}
	return d, nil
}

// LoadSink is where a LoadShare folds the other replicas' load: a route.Tracker.
type LoadSink interface {
	Routed(id string, worker string, req route.Request, cached int) error
	FirstToken(id string) bool
	Finished(id string) bool
}

// LoadShareConfig configures a LoadShare. Zero fields take their defaults.
type LoadShareConfig struct {
	// Subject is the core NATS subject every replica of the fleet shares (default
	// DefaultLoadSubject).
	Subject string
	// Replica is this replica's id (default random): deltas carrying it are its own.
	Replica string
	// Heartbeat is how often the replica says it is alive (default DefaultHeartbeat),
	// Silence how long another may stay quiet before its load is dropped (default
	// DefaultSilence; more than Heartbeat).
	Heartbeat, Silence time.Duration
	// TTL drops another replica's request that has had no finish for this long
	// (default DefaultShareTTL): set it to the senders' Tracker TTL.
	TTL time.Duration
	// MaxPerReplica and MaxReplicas bound what the others make this replica hold.
	MaxPerReplica, MaxReplicas int
	// Logger reports refused deltas, at a bounded rate (default: discard).
	Logger *slog.Logger
	// Now is the clock (default time.Now).
	Now func() time.Time
}

// LoadShareStats counts what a LoadShare did.
type LoadShareStats struct {
	// Published counts this replica's deltas sent, PublishErrors those NATS refused.
	Published, PublishErrors uint64
	// Folded counts the other replicas' deltas applied to the sink.
	Folded uint64
	// Refused counts deltas malformed or over a bound; Expired the requests dropped
	// without a finish, past the TTL or because their replica went silent.
	Refused, Expired uint64
	// Replicas is the other replicas heard from and not silent, InFlight their
	// requests in flight.
	Replicas, InFlight int
}

// LoadShare publishes a router replica's load deltas and folds the others' into its
// sink (see the package's load sharing notes). Its methods are safe for concurrent
// use; the NATS subscription's goroutine folds, a heartbeat goroutine of its own
// publishes heartbeats and drops silent replicas; Close stops both.
type LoadShare struct {
	nc   *nats.Conn
	sink LoadSink
	cfg  LoadShareConfig
	sub  *nats.Subscription
	stop chan struct{}
	done chan struct{}

	mu     sync.Mutex
	remote map[string]*remoteReplica // guarded by mu: by replica id
	st     LoadShareStats            // guarded by mu
	warned time.Time                 // guarded by mu
	// expired is expireLocked's scratch, kept to spare an allocation a delta.
	expired []string // guarded by mu
}

// remoteReplica is another replica's requests in flight, as folded into the sink.
type remoteReplica struct {
	ids  map[string]uint64 // request id -> the serial of its entry in folded
	seen time.Time
	// folded is the requests by folding time, for the TTL, from index next on. A
	// finished request's entry stays until it reaches the front or the queue is
	// compacted (its serial no longer matches ids), so the queue holds at most twice
	// MaxPerReplica entries past next.
	folded []foldedEntry
	next   int
	serial uint64
}

// foldedEntry is one routed delta folded: the request, when, and its serial.
type foldedEntry struct {
	id     string
	at     time.Time
	serial uint64
}

// live reports whether e is the entry of a request still in flight.
func (r *remoteReplica) live(e foldedEntry) bool {
	s, ok := r.ids[e.id]
	return ok && s == e.serial
}

// add records request id folded at now.
func (r *remoteReplica) add(id string, now time.Time) {
	r.serial++
	r.ids[id] = r.serial
	r.folded = append(r.folded, foldedEntry{id: id, at: now, serial: r.serial})
}

// expire removes the requests folded at or before now - ttl from r and returns them
// (appended to dst), then bounds the queue: it drops the entries of finished
// requests when they are most of it, and moves the live ones to the front when the
// expired front is most of it.
func (r *remoteReplica) expire(now time.Time, ttl time.Duration, maxLive int, dst []string) []string {
	for ; r.next < len(r.folded); r.next++ {
		e := r.folded[r.next]
		if r.live(e) {
			if now.Sub(e.at) < ttl {
				break
			}
			delete(r.ids, e.id)
			dst = append(dst, e.id)
		}
		r.folded[r.next] = foldedEntry{}
	}
	pending := r.folded[r.next:]
	switch {
	case len(pending) >= 2*maxLive:
		kept := r.folded[:0]
		for _, e := range pending {
			if r.live(e) {
				kept = append(kept, e)
			}
		}
		clear(r.folded[len(kept):])
		r.folded, r.next = kept, 0
	case r.next > 1024 && 2*r.next > len(r.folded):
		n := copy(r.folded, pending)
		clear(r.folded[n:])
		r.folded, r.next = r.folded[:n], 0
	}
	return dst
}

// NewLoadShare subscribes to the subject and starts the heartbeat.
func NewLoadShare(nc *nats.Conn, sink LoadSink, cfg LoadShareConfig) (*LoadShare, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	l := &LoadShare{nc: nc, sink: sink, cfg: cfg, remote: map[string]*remoteReplica{},
		stop: make(chan struct{}), done: make(chan struct{})}
	if l.sub, err = nc.Subscribe(cfg.Subject, l.receive); err != nil {
		return nil, fmt.Errorf("fabric: load share: %w", err)
	}
	// The subscription is in place at the server before the first delta this replica
	// publishes, so that replicas started together hear each other from the start.
	if err := nc.Flush(); err != nil {
		_ = l.sub.Unsubscribe()
		return nil, fmt.Errorf("fabric: load share: %w", err)
	}
	go l.beat()
	return l, nil
}

func (c LoadShareConfig) withDefaults() (LoadShareConfig, error) {
	if c.Subject == "" {
		c.Subject = DefaultLoadSubject
	}
	if c.Replica == "" {
		var b [8]byte
		_, _ = rand.Read(b[:])
		c.Replica = hex.EncodeToString(b[:])
	}
	if c.Heartbeat == 0 {
		c.Heartbeat = DefaultHeartbeat
	}
	if c.Silence == 0 {
		c.Silence = max(DefaultSilence, 3*c.Heartbeat)
	}
	if c.TTL == 0 {
		c.TTL = DefaultShareTTL
	}
	if c.MaxPerReplica == 0 {
		c.MaxPerReplica = DefaultMaxPerReplica
	}
	if c.MaxReplicas == 0 {
		c.MaxReplicas = DefaultMaxReplicas
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	switch {
	case len(c.Replica) > MaxLoadName:
		return c, fmt.Errorf("fabric: load share: replica id of %d bytes, want at most %d", len(c.Replica), MaxLoadName)
	case c.Heartbeat < time.Millisecond || c.Silence <= c.Heartbeat:
		return c, fmt.Errorf("fabric: load share: heartbeat %v and silence %v: want heartbeat >= 1ms and silence > heartbeat", c.Heartbeat, c.Silence)
	case c.TTL < 0:
		return c, fmt.Errorf("fabric: load share: TTL %v, want > 0", c.TTL)
	case c.MaxPerReplica < 1 || c.MaxPerReplica > route.MaxInFlight || c.MaxReplicas < 1 || c.MaxReplicas > 1<<16:
		return c, fmt.Errorf("fabric: load share: %d per replica, %d replicas: want 1..%d and 1..%d",
			c.MaxPerReplica, c.MaxReplicas, route.MaxInFlight, 1<<16)
	}
	return c, nil
}

// Routed publishes that this replica routed request id to worker (its tokens and
// hashes cut to MaxShareTokens and MaxShareBlocks, which the others refuse past).
func (l *LoadShare) Routed(id, worker string, req route.Request, cached int) {
	blocks := req.Blocks
	if len(blocks) > MaxShareBlocks {
		blocks = blocks[:MaxShareBlocks]
	}
	l.publish(loadDelta{Kind: deltaRouted, ID: id, Worker: worker, Tokens: min(req.Tokens, MaxShareTokens), Cached: cached,
		BlockSize: req.BlockSize, Blocks: blocks})
}

// FirstToken publishes that request id, routed by this replica, has its first token.
func (l *LoadShare) FirstToken(id string) { l.publish(loadDelta{Kind: deltaFirstToken, ID: id}) }

// Finished publishes that request id, routed by this replica, is done.
func (l *LoadShare) Finished(id string) { l.publish(loadDelta{Kind: deltaFinished, ID: id}) }

func (l *LoadShare) publish(d loadDelta) {
	d.Replica = l.cfg.Replica
	data, err := json.Marshal(d)
	if err == nil {
		err = l.nc.Publish(l.cfg.Subject, data)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if err != nil {
		l.st.PublishErrors++
		return
	}
	l.st.Published++
}

// key is the sink's id of another replica's request: a prefix no local id carries
// (serve's ids are printable), then the replica, then its id.
func key(replica, id string) string { return "\x00" + replica + "\x00" + id }

// receive folds one message (the subscription's goroutine).
func (l *LoadShare) receive(m *nats.Msg) {
	d, err := decodeDelta(m.Data)
	if err == nil && d.Replica == l.cfg.Replica {
		return // our own
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if err == nil {
		err = l.foldLocked(d, l.cfg.Now())
	}
	if err != nil {
		l.st.Refused++
		if now := l.cfg.Now(); now.Sub(l.warned) >= time.Minute {
			l.warned = now
			l.cfg.Logger.Warn("load share: refused a delta (counted; warned at most once a minute)", "err", err)
		}
		return
	}
	l.st.Folded++
}

func (l *LoadShare) foldLocked(d loadDelta, now time.Time) error {
	r := l.remote[d.Replica]
	if r == nil {
		if len(l.remote) >= l.cfg.MaxReplicas {
			return fmt.Errorf("%w: more than %d replicas", errDelta, l.cfg.MaxReplicas)
		}
		r = &remoteReplica{ids: map[string]uint64{}}
		l.remote[d.Replica] = r
	}
	r.seen = now
	l.expireLocked(d.Replica, r, now)
	switch d.Kind {
	case deltaRouted:
		if len(r.ids) >= l.cfg.MaxPerReplica {
			return fmt.Errorf("%w: replica %q has %d requests in flight", errDelta, d.Replica, len(r.ids))
		}
		req := route.Request{Tokens: d.Tokens, BlockSize: d.BlockSize, Blocks: d.Blocks}
		if err := l.sink.Routed(key(d.Replica, d.ID), d.Worker, req, d.Cached); err != nil {
			return fmt.Errorf("%w: %w", errDelta, err)
		}
		r.add(d.ID, now)
	case deltaFirstToken:
		l.sink.FirstToken(key(d.Replica, d.ID))
	case deltaFinished:
		l.sink.Finished(key(d.Replica, d.ID))
		delete(r.ids, d.ID)
	}
	return nil
}

// expireLocked drops replica name's requests past the TTL from r and the sink.
func (l *LoadShare) expireLocked(name string, r *remoteReplica, now time.Time) {
	l.expired = r.expire(now, l.cfg.TTL, l.cfg.MaxPerReplica, l.expired[:0])
	for _, id := range l.expired {
		l.sink.Finished(key(name, id))
		l.st.Expired++
	}
	clear(l.expired)
}

// sweep drops the requests past the TTL, and every request of the replicas silent
// since before now - Silence.
func (l *LoadShare) sweep(now time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for name, r := range l.remote {
		if now.Sub(r.seen) < l.cfg.Silence {
			l.expireLocked(name, r, now)
			continue
		}
		for id := range r.ids {
			l.sink.Finished(key(name, id))
		}
		l.st.Expired += uint64(len(r.ids))
		delete(l.remote, name)
	}
}

// beat is the heartbeat goroutine.
func (l *LoadShare) beat() {
	defer close(l.done)
	t := time.NewTicker(l.cfg.Heartbeat)
	defer t.Stop()
	l.publish(loadDelta{Kind: deltaBeat})
	for {
		select {
		case <-l.stop:
			return
		case <-t.C:
			l.publish(loadDelta{Kind: deltaBeat})
			l.sweep(l.cfg.Now())
		}
	}
}

// Stats returns what the LoadShare did so far.
func (l *LoadShare) Stats() LoadShareStats {
	l.mu.Lock()
	defer l.mu.Unlock()
	st := l.st
	st.Replicas = len(l.remote)
	for _, r := range l.remote {
		st.InFlight += len(r.ids)
	}
	return st
}

// Close stops the heartbeat and the subscription (the connection stays the caller's).
func (l *LoadShare) Close() error {
	close(l.stop)
	<-l.done
	return l.sub.Unsubscribe()
}
