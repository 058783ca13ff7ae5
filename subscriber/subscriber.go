package subscriber

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/zeebo/xxh3"

	"github.com/kvindex/kvindex/engine"
	"github.com/kvindex/kvindex/kvevents"
)

// Subscriber follows one engine publisher (one endpoint, one data-parallel rank) and
// applies its events to the index under one worker id.
//
// Ownership: Run's goroutine (the owner) owns every field below mu except the published
// status; it alone touches the sockets, the decoder, the sequence state and the index
// for this worker, so the worker's events reach the index in order. Status may be called
// from any goroutine: it copies pub under mu, which the owner refreshes after each
// message.
type Subscriber struct {
	cfg Config
	// tiers is the tier of each accepted medium (Config.mediaTiers); anyMed accepts
	// the others too, on the device tier (Media "*").
	tiers  map[string]engine.Tier
	anyMed bool
	topic  []byte

	dec    *kvevents.Decoder
	batch  kvevents.Batch
	ev     engine.Event
	blocks []engine.Block
	// A batch for a batchIndex (applyEvents): its index events, the position of each
	// in the decoded batch, whether each is a copy, and the index's answers.
	evs    []engine.Event
	srcs   []int32
	copied []bool
	errs   []error
	nsMemo map[string]string

	// Sequence state (owner only). has is false until a batch is applied; last is its
	// sequence and digest the xxh3 of its payload, which a replay starting at last must
	// reproduce (a publisher restart is told from a reconnection that way).
	has    bool
	last   uint64
	digest uint64
	// connFloor is last as it was when the current connection began (-1: nothing was
	// applied then): a live message at or below it cannot come from the same publisher.
	connFloor int64
	verified  bool // a suspected restart was checked on this connection
	exact     bool // the index holds exactly the worker's blocks (false: stale)
	connected bool
	synced    bool
	removed   bool
	inGap     bool   // a catch-up started by a live gap is running
	gapSeq    uint64 // ... for the live batch with this sequence
	replayErr error  // why the last failed replay failed
	// short: the last catch-up broke off (no end marker: a timeout, a malformed reply,
	// a refused dial), so the worker may hold only part of what its engine holds; it
	// is stale and the catch-up is retried (session's retry) until one completes.
	short bool
	// badSeen holds the (sequence, digest) of undecodable batches already counted: an
	// engine that still buffers one replays it at every resync (bounded, cleared when
	// full).
	badSeen map[badBatch]struct{}
	local   Status

	// The ZMTP guards of the SUB socket and the replay DEALER (zmtpguard.go), and the
	// count of peers they refused (written from zmq4's goroutines).
	subGuard, dealerGuard *guard
	refused               atomic.Uint64
	lastRefusal           atomic.Pointer[string] // the last refusal's reason

	diag *diagState   // diagnose.go
	hyb  *hybridState // hybrid.go; nil unless Config.Groups.Hybrid

	replay replayFunc // zmqReplay; tests substitute it
	now    func() time.Time

	running atomic.Bool
	warns   warnLimiter

	// resumeAfter is the Config.Resume checkpoint's Cursor until the first catch-up
	// has applied the rest of its batch (owner only).
	resumeAfter uint64

	// own is held by whichever goroutine works on the owner's state: the session's
	// (timers, socket errors, the catch-up) or a connection reader delivering a live
	// message (deliver). sess is the running session (nil between sessions), closedGen
	// the generation of the last socket closed; ownCond (on own) wakes readers waiting
	// for their socket's session.
	own       sync.Mutex
	ownCond   *sync.Cond
	sess      *sessionState
	closedGen uint64

	mu  sync.Mutex
	pub Status
	// wake is closed (and cleared) by publish when pub answers the callers of Wait;
	// nil while nobody waits (wait.go).
	wake chan struct{}
	// state is pub.State, readable without mu: a router asks it for every match of
	// every query.
	state atomic.Uint32
}

// New validates cfg and returns a Subscriber; Run starts it.
func New(cfg Config) (*Subscriber, error) {
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	dec, err := kvevents.New(kvevents.Config{BlockSize: cfg.BlockSize, Limits: cfg.Limits, Verbatim: cfg.HashCheck.Enabled, HashOnly: true, Units: cfg.Groups.Hybrid})
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrConfig, err)
	}
	tiers, anyMed, err := cfg.mediaTiers()
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrConfig, err)
	}
	s := &Subscriber{
		cfg:       cfg,
		tiers:     tiers,
		anyMed:    anyMed,
		topic:     []byte(cfg.Topic),
		dec:       dec,
		nsMemo:    map[string]string{},
		connFloor: -1,
		exact:     true,
		now:       time.Now,
		diag:      newDiagState(&cfg),
		hyb:       newHybridState(&cfg),
	}
	s.ownCond = sync.NewCond(&s.own)
	s.subGuard = &guard{self: zmq4.Sub, maxMsg: uint64(cfg.MaxMessageBytes), handshake: cfg.ReplayTimeout,
		maxConns: maxBoundConns, refused: s.peerRefused, sink: s.deliver}
	s.subGuard.allowed, _ = ParsePeers(cfg.AllowedPeers) // validated
	s.dealerGuard = &guard{self: zmq4.Dealer, maxMsg: uint64(cfg.MaxMessageBytes), handshake: cfg.ReplayTimeout,
		maxConns: 1, refused: s.peerRefused}
	s.replay = s.zmqReplay
	if r := cfg.Resume; r != nil {
		// Resuming from a snapshot of the index: the worker's blocks are there as of
		// batch r.Seq; the first catch-up checks the engine still has that batch (by
		// its digest) and replays what followed.
		s.has, s.last, s.digest, s.exact, s.resumeAfter = true, r.Seq, r.Digest, r.Exact, r.Cursor
		if s.hyb != nil {
			s.hyb.resume(cfg.Index, cfg.Worker)
		}
	}
	s.local = Status{
		Worker:         cfg.Worker,
		Endpoint:       cfg.Endpoint,
		ReplayEndpoint: cfg.ReplayEndpoint,
		Model:          cfg.Model,
		DPRank:         cfg.DPRank,
	}
	s.publish()
	return s, nil
}

// Worker returns the worker id the subscriber applies events under.
func (s *Subscriber) Worker() string { return s.cfg.Worker }

// Model returns the configured model name.
func (s *Subscriber) Model() string { return s.cfg.Model }

// Status returns a snapshot of the subscriber's state and counters. Safe for concurrent
// use.
func (s *Subscriber) Status() Status {
	s.mu.Lock()
	st := s.pub
	s.mu.Unlock()
	st.PeersRefused = s.refused.Load()
	if m := s.lastRefusal.Load(); m != nil {
		st.LastRefusal = *m
	} // refusals happen in zmq4's goroutines, at any time
	return st
}

// peerRefused counts and logs a peer the ZMTP guard refused: once per connection, from
// whichever goroutine read it.
func (s *Subscriber) peerRefused(err error) {
	msg := err.Error()
	s.lastRefusal.Store(&msg)
	s.refused.Add(1)
	s.warn("peer refused; connection closed", "err", err)
}

// publish copies the owner's status into the shared one.
func (s *Subscriber) publish() {
	st := &s.local
	st.PeersRefused = s.refused.Load()
	st.HasSeq, st.LastSeq = s.has, s.last
	st.Connected, st.Synced, st.ReplayShort = s.connected, s.synced, s.short
	st.DecoderRejected = s.dec.Stats().Rejected
	s.diag.publishInto(st, s.now())
	s.mu.Lock()
	st.Diag.LastServed = s.pub.Diag.LastServed // NoteServed writes it there
	s.pub = *st
	s.state.Store(uint32(st.State))
	s.wakeWaiters()
	s.mu.Unlock()
}

// State returns the subscriber's current state (Status().State, without copying the
// counters). Safe for concurrent use.
func (s *Subscriber) State() State { return State(s.state.Load()) }

// setState computes the visible state from the owner's flags.
func (s *Subscriber) setState() {
	st := &s.local
	switch {
	case st.State == StateStopped:
	case s.removed:
		st.State = StateRemoved
	case !s.connected && st.Connects > 0:
		st.State = StateDisconnected
	case !s.connected:
		st.State = StateConnecting
	case !s.synced:
		st.State = StateSyncing
	case s.exact && !s.short:
		st.State = StateLive
	default:
		st.State = StateStale
	}
}

type badBatch struct{ seq, digest uint64 }

const maxBadSeen = 256

// Checkpoint is where a subscriber's worker stands in its publisher's stream, as the
// index records it: the batch of the last event applied (its sequence and the xxh3 of
// its payload), the event's SourceCursor in it, and whether the index then held exactly
// the worker's blocks. Every event a subscriber applies carries its position (Cursor
// SourceCursor(seq, i), Mark the digest and exactness, see Mark), which the engine keeps
// with the worker's blocks under the worker's lock; so a snapshot holds each worker's
// checkpoint with the blocks it describes (engine.Engine.Positions, CheckpointAt), in
// one file, however busy the worker was while it was written. Config.Resume starts a
// subscriber there: the first catch-up verifies the batch by its digest, applies the
// batch's events after Cursor and replays what followed.
type Checkpoint struct {
	Seq    uint64 `json:"seq"`
	Digest uint64 `json:"digest"`
	Exact  bool   `json:"exact"`
	// Cursor is the SourceCursor of the last event of batch Seq the index holds; 0
	// means the whole batch.
	Cursor uint64 `json:"cursor,omitempty"`
}

// Mark is the engine.Event Mark of an event from a batch whose payload has xxh3 digest
// while the index is exact or not: the digest with its lowest bit replaced by
// exactness (the continuity check compares the other 63 bits). Never 0 for an exact
// index; a made-up event (Mark 0) leaves the worker no checkpoint.
func Mark(digest uint64, exact bool) uint64 {
	if exact {
		return digest | 1
	}
	return digest &^ 1
}

// CheckpointAt returns the checkpoint a worker's position in an index describes, and
// false when it describes none: no event of a batch applied since the worker's last
// clear (a restarted or invalidated worker, or one fed by something else than a
// Subscriber).
func CheckpointAt(p engine.Position) (Checkpoint, bool) {
	if p.Cursor>>24 == 0 || p.Mark == 0 {
		return Checkpoint{}, false
	}
	return Checkpoint{Seq: p.Cursor>>24 - 1, Digest: p.Mark, Exact: p.Mark&1 == 1, Cursor: p.Cursor}, true
}

// sameBatch reports whether two batch digests match in the bits a Mark keeps.
func sameBatch(a, b uint64) bool { return (a^b)&^1 == 0 }

// errFatal marks an error that ends Run: the index is closed or failed.
type errFatal struct{ err error }

func (e errFatal) Error() string { return e.err.Error() }
func (e errFatal) Unwrap() error { return e.err }

// Run follows the publisher until ctx ends: it connects (retrying with backoff), catches
// up through the replay endpoint, applies live batches in sequence order and recovers
// gaps. It returns nil when ctx ends, or an error if the index fails (engine.ErrClosed,
// engine.ErrShardFailed) or Run was already called.
func (s *Subscriber) Run(ctx context.Context) (err error) {
	if !s.running.CompareAndSwap(false, true) {
		return ErrRunning
	}
	defer func() {
		s.connected = false
		s.local.State = StateStopped
		s.publish()
	}()
	backoff := s.cfg.ReconnectMin
	for ctx.Err() == nil {
		gen := s.subGuard.gen.Add(1) // the new socket's connections deliver under gen
		sock, err := openSub(ctx, s.cfg.Endpoint, s.cfg.Topic, s.cfg.Bind, s.cfg.ReplayTimeout, s.subGuard)
		if err != nil {
			s.own.Lock()
			s.closedGen = gen
			s.ownCond.Broadcast()
			s.own.Unlock()
			if ctx.Err() != nil {
				return nil
			}
			s.down(err)
			// Said at once, not only when the grace period ends: a mistyped endpoint is
			// the usual cause, and Status.LastError shows it meanwhile.
			s.warn("publisher unreachable; retrying", "endpoint", s.cfg.Endpoint, "err", err, "retry_in", backoff)
			if err := s.checkGrace(); err != nil {
				return err
			}
			s.setState()
			s.publish()
			if !s.sleep(ctx, s.jitter(backoff)) {
				return nil
			}
			backoff = min(backoff*2, s.cfg.ReconnectMax)
			continue
		}
		err = s.session(ctx, sock, gen)
		var fe errFatal
		if errors.As(err, &fe) {
			return fe.err
		}
		if !errors.Is(err, ErrPeerRefused) {
			backoff = s.cfg.ReconnectMin
			continue
		}
		// A peer that completes the handshake and then sends what the guard refuses
		// would otherwise be redialled at once, forever.
		if !s.sleep(ctx, s.jitter(backoff)) {
			return nil
		}
		backoff = min(backoff*2, s.cfg.ReconnectMax)
	}
	return nil
}

func (s *Subscriber) jitter(d time.Duration) time.Duration {
	if d <= 0 {
		return 0
	}
	return time.Duration(float64(d) * (0.8 + 0.4*rand.Float64()))
}

// sleep waits d, or until the grace period ends if that comes first, or ctx ends (false).
func (s *Subscriber) sleep(ctx context.Context, d time.Duration) bool {
	if g := s.graceLeft(); g >= 0 && g < d {
		d = g
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// down records that the publisher is unreachable.
func (s *Subscriber) down(err error) {
	if s.connected {
		s.local.Disconnects++
		s.cfg.Logger.Info("publisher lost", "worker", s.cfg.Worker, "err", err)
	}
	s.connected = false
	if s.local.DownSince.IsZero() {
		s.local.DownSince = s.now()
	}
	if err != nil {
		s.local.LastError = err.Error()
	}
}

// up records a connection (dial mode) or a publisher seen (bind mode) and resets the
// connection-scoped sequence state.
func (s *Subscriber) up() {
	s.connected = true
	s.local.Connects++
	s.local.DownSince = time.Time{}
	s.removed = false
	s.verified = false
	s.connFloor = -1
	if s.has {
		s.connFloor = int64(s.last)
	}
}

// graceLeft is the time until the worker is removed; -1 when no removal is pending.
func (s *Subscriber) graceLeft() time.Duration {
	if s.cfg.Grace < 0 || s.connected || s.removed || s.local.DownSince.IsZero() {
		return -1
	}
	return max(0, s.cfg.Grace-s.now().Sub(s.local.DownSince))
}

// checkGrace removes the worker once the publisher has been unreachable for Grace.
func (s *Subscriber) checkGrace() error {
	if s.graceLeft() != 0 {
		return nil
	}
	s.removed = true
	s.local.Removals++
	s.has, s.exact, s.synced = false, true, false
	s.warn("publisher gone past the grace period; worker removed")
	return s.apply(&engine.Event{Kind: engine.EventRemoveWorker, Worker: s.cfg.Worker})
}

type received struct {
	msg zmq4.Msg
	err error
}

// sessionState is what a session shares with its socket's connection readers, which
// hand it live messages (deliver) in their own goroutines. Guarded by Subscriber.own.
type sessionState struct {
	ctx   context.Context
	gen   uint64 // the socket's generation (guard.gen)
	fresh bool   // bind mode: the next message comes from a new connection
	tail  tailWatch
	err   error         // a message's handling failed: the session ends with it
	fail  chan struct{} // signalled (1 slot) when err is set
}

// session runs one socket: the catch-up after connecting, then live messages, until the
// connection is lost (dial mode), ctx ends, or the index fails. The live messages
// reach the subscriber through deliver, in the connections' reader goroutines; this
// goroutine sees the socket's errors and runs the timers. Either holds s.own while it
// works on the subscriber's state, so each works as its owner.
func (s *Subscriber) session(ctx context.Context, sock zmq4.Socket, gen uint64) error {
	recv := make(chan received)
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { // the reader: the only goroutine calling sock.Recv until it exits
		defer wg.Done()
		for {
			m, err := sock.Recv()
			select {
			case recv <- received{m, err}:
			case <-done:
				return
			}
			if err != nil && ctx.Err() != nil {
				return
			}
		}
	}()
	defer func() {
		// No message is applied past here: the readers still delivering drop theirs.
		s.own.Lock()
		s.sess, s.closedGen = nil, gen
		s.ownCond.Broadcast()
		s.own.Unlock()
		_ = sock.Close()
		close(done)
		wg.Wait()
		closeDrain(sock)
	}()
	ss := &sessionState{ctx: ctx, gen: gen, fresh: true, fail: make(chan struct{}, 1), tail: tailWatch{every: s.cfg.TailCheck}}
	if s.cfg.ReplayEndpoint == "" {
		ss.tail.every = 0
	}
	if ss.tail.every > 0 {
		// Created now, stopped: deliver arms it, and the loop below selects on its
		// channel.
		ss.tail.timer = time.NewTimer(ss.tail.every)
		ss.tail.timer.Stop()
	}
	defer ss.tail.stop()
	s.own.Lock()
	defer s.own.Unlock()
	s.sess = ss
	s.ownCond.Broadcast()
	return s.sessionLoop(ss, recv)
}

// sessionLoop is session's work, run with s.own held except while it waits.
func (s *Subscriber) sessionLoop(ss *sessionState, recv <-chan received) error {
	ctx := ss.ctx
	if !s.cfg.Bind {
		s.up()
		s.setState()
		s.publish()
		if err := s.catchUp(ctx); err != nil {
			return err
		}
		ss.fresh = false
	} else {
		// A bound socket: nothing tells when a publisher connects until it sends, so
		// the catch-up runs now (through the replay endpoint, which the engine binds)
		// and again when a message follows a dropped connection.
		s.connected = true
		s.local.DownSince = time.Time{}
		if err := s.catchUp(ctx); err != nil {
			return err
		}
	}

	var retry catchRetry
	defer retry.stop()
	retry.arm(s)
	s.setState()
	s.publish()
	var resync <-chan time.Time
	if s.cfg.ResyncInterval > 0 && s.cfg.ReplayEndpoint != "" {
		t := time.NewTicker(s.cfg.ResyncInterval)
		defer t.Stop()
		resync = t.C
	}
	var graceTimer *time.Timer
	var graceC <-chan time.Time
	defer func() {
		if graceTimer != nil {
			graceTimer.Stop()
		}
	}()
	tailC := ss.tail.c()
	for {
		retry.arm(s) // also for a catch-up a message ran (deliver) since the last turn
		s.own.Unlock()
		var r received
		var tailAt, graceAt, resyncAt, retryAt bool
		select {
		case <-ctx.Done():
		case <-ss.fail:
		case r = <-recv:
		case <-tailC:
			tailAt = true
		case <-graceC:
			graceAt = true
		case <-resync:
			resyncAt = true
		case <-retry.c:
			retryAt = true
		}
		s.own.Lock()
		switch {
		case ctx.Err() != nil:
			return nil
		case ss.err != nil:
			return ss.err
		case tailAt:
			if ss.tail.fired(s.now()) && s.connected {
				s.local.TailChecks++
				res, err := s.catchUpResult(ctx)
				if err != nil {
					return err
				}
				s.noteCatch(res)
			}
		case retryAt:
			retry.c = nil
			s.local.ReplayRetries++
			if err := s.catchUp(ctx); err != nil {
				return err
			}
		case graceAt:
			graceC = nil
			if !ss.fresh { // a message came after the connection dropped
				break
			}
			if err := s.checkGrace(); err != nil {
				return err
			}
		case resyncAt:
			if err := s.resync(ctx); err != nil {
				return err
			}
			if s.cfg.Bind && s.exact && s.connected {
				// A bound socket cannot tell that a publisher connected; batches it sent
				// before the connection came up are fetched here if nothing follows them.
				if err := s.catchUp(ctx); err != nil {
					return err
				}
			}
		case r.err != nil:
			if errors.Is(r.err, ErrPeerRefused) {
				// The refused message is lost, whatever it held: the index can no
				// longer vouch for the worker.
				if err := s.invalidate(); err != nil {
					return err
				}
			}
			s.down(r.err)
			if !s.cfg.Bind {
				s.setState()
				s.publish()
				return r.err
			}
			ss.fresh = true
			if g := s.graceLeft(); g >= 0 {
				if graceTimer == nil {
					graceTimer = time.NewTimer(g)
				} else {
					graceTimer.Reset(g)
				}
				graceC = graceTimer.C
			}
		default: // a message zmq4 delivered (the guard hands them to deliver)
			if err := s.message(ss, r.msg.Frames); err != nil {
				return err
			}
		}
		s.setState()
		s.publish()
	}
}

// deliver is the SUB guard's sink: a live message read by a connection of the socket
// of generation gen, in that connection's goroutine. It waits for the socket's
// session to start (a dialled publisher may send before it does) and drops the
// message once the session is over (the socket is closing). frames are views of the
// connection's buffer: nothing here keeps them past the call.
func (s *Subscriber) deliver(gen uint64, frames [][]byte) {
	s.own.Lock()
	defer s.own.Unlock()
	for (s.sess == nil || s.sess.gen != gen) && gen > s.closedGen {
		s.ownCond.Wait()
	}
	ss := s.sess
	if ss == nil || ss.gen != gen || ss.err != nil {
		return
	}
	if err := s.message(ss, frames); err != nil {
		ss.err = err
		select {
		case ss.fail <- struct{}{}:
		default:
		}
		return
	}
	s.setState()
	s.publish()
}

// message handles one live message of the session (s.own held).
func (s *Subscriber) message(ss *sessionState, frames [][]byte) error {
	if ss.fresh && s.cfg.Bind {
		ss.fresh = false
		s.up()
		if err := s.catchUp(ss.ctx); err != nil {
			return err
		}
	}
	if err := s.handle(ss.ctx, frames); err != nil {
		return err
	}
	ss.tail.saw(s.now())
	return nil
}

// tailWatch times the quiet-stream catch-up (Config.TailCheck). A PUB drops what is
// past its high-water mark, and a gap shows only when the next batch arrives: batches
// dropped at the end of a burst would stay missing while the engine is idle (kvindex
// loadtest lost the last batches of a level that way). A live message arms the watch;
// once the stream has been quiet for every, one catch-up from the last applied batch
// fetches what it missed. An idle engine is asked once per burst, not periodically.
// Owner goroutine only.
type tailWatch struct {
	every   time.Duration // 0: off
	timer   *time.Timer
	armed   bool
	pending bool      // a live message arrived since the last check
	last    time.Time // when the last one arrived
}

func (w *tailWatch) c() <-chan time.Time {
	if w.timer == nil {
		return nil
	}
	return w.timer.C
}

func (w *tailWatch) arm(d time.Duration) {
	if w.timer == nil {
		w.timer = time.NewTimer(d)
	} else {
		w.timer.Reset(d)
	}
	w.armed = true
}

// saw records a live message at now.
func (w *tailWatch) saw(now time.Time) {
	if w.every <= 0 {
		return
	}
	w.pending, w.last = true, now
	if !w.armed {
		w.arm(w.every)
	}
}

// fired handles the timer and reports whether the check is due now.
func (w *tailWatch) fired(now time.Time) bool {
	w.armed = false
	if !w.pending {
		return false
	}
	if quiet := now.Sub(w.last); quiet < w.every {
		w.arm(w.every - quiet)
		return false
	}
	w.pending = false
	return true
}

func (w *tailWatch) stop() {
	if w.timer != nil {
		w.timer.Stop()
	}
}

// handle processes one live message [topic, seq, payload].
func (s *Subscriber) handle(ctx context.Context, frames [][]byte) error {
	s.local.Messages++
	s.local.LastMessage = s.now()
	if len(frames) != 3 || !bytes.HasPrefix(frames[0], s.topic) {
		s.local.BadFrames++
		return nil
	}
	seq, end, err := kvevents.ParseSeq(frames[1])
	if err != nil {
		// Unmerged snapshot work makes this frame 24 bytes (see kvevents.ErrSeqLength): an
		// extension this package does not speak; counted, never guessed at. A message
		// skipped this way shows up as a gap once 8-byte frames resume.
		s.local.UnsupportedSeq++
		return nil
	}
	if end {
		s.local.BadFrames++
		return nil
	}
	return s.live(ctx, seq, frames[2])
}

// live applies a live batch in sequence order.
func (s *Subscriber) live(ctx context.Context, seq uint64, payload []byte) error {
	if !s.has {
		if seq == 0 {
			s.short = false // the engine's first batch: nothing before it to miss
			return s.applyBatch(seq, payload)
		}
		return s.gap(ctx, seq, payload)
	}
	switch next := s.last + 1; {
	case seq == next:
		return s.applyBatch(seq, payload)
	case seq > next:
		return s.gap(ctx, seq, payload)
	}
	// An old sequence: a batch the catch-up replay already applied, or a publisher
	// that restarted (its counter went back) without this subscriber seeing the
	// connection drop. A sequence at or below where this connection started, or 0,
	// cannot come from the publisher this connection began with: check once per
	// connection through the replay endpoint (a replay from the last applied batch tells
	// a restart by its content), or, without one, take it for a restart.
	if !s.verified && (seq == 0 || int64(seq) <= s.connFloor) {
		s.verified = true
		res, err := s.catchUpResult(ctx)
		if err != nil {
			return err
		}
		if res == catchFailed || res == catchNoReplay {
			if err := s.restart(fmt.Sprintf("sequence went back to %d", seq)); err != nil {
				return err
			}
		}
		if !s.has || seq > s.last {
			return s.live(ctx, seq, payload)
		}
	}
	s.local.Duplicates++
	return nil
}

// gap handles a live batch past the next expected sequence: catch up through the
// replay endpoint, then apply the batch if it now follows; otherwise the missing range
// is lost and the worker is invalidated.
func (s *Subscriber) gap(ctx context.Context, seq uint64, payload []byte) error {
	s.local.GapsDetected++
	s.inGap, s.gapSeq = true, seq
	res, err := s.catchUpResult(ctx)
	backoff := s.cfg.ReconnectMin
	for try := 0; err == nil && res == catchFailed && try < gapRetries && retryable(s.replayErr); try++ {
		// A replay that failed in transit says nothing about the engine's buffer: try
		// again before taking the range for lost (which clears the worker, and only a
		// clear, a restart or a replay from 0 makes it exact again).
		if !s.sleep(ctx, s.jitter(backoff)) {
			break
		}
		backoff = min(2*backoff, s.cfg.ReconnectMax)
		res, err = s.catchUpResult(ctx)
	}
	s.inGap = false
	if err != nil {
		return err
	}
	s.noteCatch(res)
	switch {
	case s.has && seq <= s.last:
		if res == catchOK {
			s.local.GapsRecovered++
		}
		s.local.Duplicates++
		return nil
	case (!s.has && seq == 0) || (s.has && seq == s.last+1):
		if res == catchOK {
			s.local.GapsRecovered++
		}
		return s.applyBatch(seq, payload)
	}
	s.local.GapsUnrecoverable++
	s.warn("sequence gap not recoverable; worker invalidated", "seq", seq)
	if err := s.invalidate(); err != nil {
		return err
	}
	return s.applyBatch(seq, payload)
}

// gapRetries is how many more times a live gap's catch-up runs after a replay that
// failed in transit (a timeout, a refused or reset connection) before the missing range
// is taken for lost. A serve that stalled (a GC pause, SIGSTOP, a partition) finds
// every engine's gap at once, and the first replays can run out of ReplayTimeout
// behind the backlog: at 2,048 engines one stall left 5 to 145 workers invalidated
// (kvindex loadtest --engines 2048 --stall 5s --hwm-bytes 4096).
const gapRetries = 2

// retryable reports whether a failed replay may succeed if run again: not one the
// engine answered wrongly.
func retryable(err error) bool {
	return err != nil && !errors.Is(err, errBadReply) && !errors.Is(err, errReplayLimit) && !errors.Is(err, ErrPeerRefused)
}

// catchResult is how a catch-up went.
type catchResult uint8

const (
	catchOK       catchResult = iota // the replay ran to its end; nothing was missing
	catchHole                        // a range was no longer buffered: the worker was invalidated
	catchFailed                      // the replay failed (dial, timeout, malformed reply)
	catchNoReplay                    // no replay endpoint
)

// catchUp runs a catch-up after connecting. A first catch-up that fails leaves the
// worker stale: its history could not be had.
func (s *Subscriber) catchUp(ctx context.Context) error {
	res, err := s.catchUpResult(ctx)
	if err != nil {
		return err
	}
	s.noteCatch(res)
	if !s.synced && s.connected {
		s.synced = true
		if res == catchFailed && !s.has {
			s.exact = false
		}
	}
	return nil
}

// noteCatch records whether a catch-up completed: one that broke off leaves the worker
// stale (short) until a retry completes.
func (s *Subscriber) noteCatch(res catchResult) {
	switch res {
	case catchFailed:
		if !s.short {
			s.local.ShortReplays++
		}
		s.short = true
	case catchOK, catchHole:
		s.short = false
	}
}

// catchRetry times the retries of a catch-up that broke off: from ReconnectMin,
// doubling to ReconnectMax, with jitter. Owner goroutine only.
type catchRetry struct {
	timer   *time.Timer
	c       <-chan time.Time // nil: not armed
	backoff time.Duration
}

// arm starts the wait for the next retry while the worker is short, and forgets the
// backoff once it is not.
func (r *catchRetry) arm(s *Subscriber) {
	switch {
	case !s.short || !s.connected:
		r.backoff = 0
		if r.c != nil {
			r.timer.Stop()
			r.c = nil
		}
	case r.c == nil:
		r.backoff = min(max(2*r.backoff, s.cfg.ReconnectMin), s.cfg.ReconnectMax)
		d := s.jitter(r.backoff)
		if r.timer == nil {
			r.timer = time.NewTimer(d)
		} else {
			r.timer.Reset(d)
		}
		r.c = r.timer.C
	}
}

func (r *catchRetry) stop() {
	if r.timer != nil {
		r.timer.Stop()
	}
}

// catchUpResult asks the replay endpoint for every batch from the last applied one (or
// from 0) on. The first reply must be the last applied batch, byte for byte: if it
// differs, or nothing at all is buffered from there, the publisher restarted, and the
// worker is reset and synced again from 0. A missing range invalidates the worker. Only
// index failures are returned as errors.
func (s *Subscriber) catchUpResult(ctx context.Context) (catchResult, error) {
	if s.cfg.ReplayEndpoint == "" {
		return catchNoReplay, nil
	}
	for attempt := 0; ; attempt++ {
		from := uint64(0)
		if s.has {
			from = s.last
		}
		s.local.Replays++
		first, restart, hole := true, false, false
		resumed, batches0 := s.has, s.local.Batches
		var applyErr error
		stop := int64(-1)
		if s.inGap {
			stop = int64(s.gapSeq) // the live stream carries the rest
		}
		err := s.checkedReplay(ctx, from, stop, func(seq uint64, payload []byte) bool {
			if first {
				first = false
				if s.has && seq <= s.last {
					if seq == s.last && sameBatch(xxh3.Hash(payload), s.digest) {
						if after := s.resumeAfter; after != 0 {
							// Resumed from a snapshot cut inside this batch: the
							// index holds its events up to after.
							s.resumeAfter = 0
							if applyErr = s.applyBatchAfter(seq, payload, after); applyErr != nil {
								return false
							}
						}
						return true // continuity verified
					}
					restart = true
					return false
				}
			}
			h, err := s.replayed(seq, payload)
			hole = hole || h
			if err != nil {
				applyErr = err
				return false
			}
			return true
		})
		if applyErr != nil {
			return catchFailed, applyErr
		}
		if err != nil {
			s.replayErr = err
			if ctx.Err() == nil {
				s.local.ReplayFailures++
				s.local.LastError = err.Error()
				s.warn("replay failed", "from", from, "err", err)
			}
			return catchFailed, nil
		}
		if first && s.has {
			restart = true // the last applied batch is not buffered, nor anything after it
		}
		if !restart && !hole && resumed && !s.inGap && s.local.Batches > batches0 {
			// Batches published while this subscriber was away, filled by the replay.
			s.local.GapsDetected++
			s.local.GapsRecovered++
		}
		switch {
		case !restart && hole:
			return catchHole, nil
		case !restart:
			return catchOK, nil
		case attempt > 0:
			return catchFailed, nil // cannot happen: the second attempt starts from 0
		}
		if err := s.restart("replay does not continue the last applied batch"); err != nil {
			return catchFailed, err
		}
	}
}

// checkedReplay runs s.replay from sequence from, handing fn only replies a buffer of
// the engine can send: the first at or after from, each next one the sequence after
// the previous; anything else fails the replay (errBadReply), so a hostile replay
// socket cannot push the worker's sequence around. With stop >= 0 (a catch-up for the
// live batch stop) the replay ends at stop: the live stream carries what follows, and
// a reply past it cannot fill the gap.
func (s *Subscriber) checkedReplay(ctx context.Context, from uint64, stop int64, fn func(uint64, []byte) bool) error {
	var bad error
	n := 0
	var prev uint64
	err := s.replay(ctx, from, func(seq uint64, payload []byte) bool {
		switch {
		case n == 0 && seq < from:
			bad = fmt.Errorf("%w: answered %d, asked from %d", errBadReply, seq, from)
			return false
		case n > 0 && seq != prev+1:
			bad = fmt.Errorf("%w: answered %d after %d", errBadReply, seq, prev)
			return false
		case stop >= 0 && seq > uint64(stop):
			return false
		}
		n++
		prev = seq
		return fn(seq, payload) && (stop < 0 || seq < uint64(stop))
	})
	if bad != nil {
		return bad
	}
	return err
}

// replayed applies one replayed batch: skipped if already applied; a batch past the next
// expected one means the range between is no longer buffered (hole).
func (s *Subscriber) replayed(seq uint64, payload []byte) (hole bool, err error) {
	if s.has && seq <= s.last {
		s.local.Duplicates++
		return false, nil
	}
	next := uint64(0)
	if s.has {
		next = s.last + 1
	}
	if seq > next {
		hole = true
		if !s.inGap {
			s.local.GapsDetected++
		}
		s.local.GapsUnrecoverable++
		s.warn("replay misses a range; worker invalidated", "want", next, "got", seq)
		if err := s.invalidate(); err != nil {
			return hole, err
		}
	}
	return hole, s.applyBatch(seq, payload)
}

// restart handles a publisher that restarted: a new engine process starts with an
// empty cache, so the worker is cleared and its sequence forgotten; the state is exact.
func (s *Subscriber) restart(why string) error {
	s.local.Restarts++
	s.cfg.Logger.Info("publisher restart detected", "worker", s.cfg.Worker, "why", why)
	s.has, s.exact, s.connFloor, s.short = false, true, -1, false
	return s.apply(&engine.Event{Kind: engine.EventCleared, Worker: s.cfg.Worker})
}

// invalidate clears the worker and marks it stale: the index keeps only what it can
// vouch for.
func (s *Subscriber) invalidate() error {
	s.local.Invalidations++
	s.exact = false
	return s.apply(&engine.Event{Kind: engine.EventCleared, Worker: s.cfg.Worker})
}

// resync tries to rebuild a stale worker from a replay that starts at sequence 0. It
// changes nothing unless sequence 0 is still buffered.
func (s *Subscriber) resync(ctx context.Context) error {
	if s.exact || s.cfg.ReplayEndpoint == "" || !s.connected {
		return nil
	}
	started := false
	var applyErr error
	s.local.Replays++
	err := s.checkedReplay(ctx, 0, -1, func(seq uint64, payload []byte) bool {
		if !started {
			if seq != 0 {
				return false
			}
			started = true
			applyErr = s.apply(&engine.Event{Kind: engine.EventCleared, Worker: s.cfg.Worker})
			s.has, s.exact = false, true
			if applyErr != nil {
				return false
			}
		}
		if _, applyErr = s.replayed(seq, payload); applyErr != nil {
			return false
		}
		return true
	})
	if applyErr != nil {
		return applyErr
	}
	if err != nil && ctx.Err() == nil {
		s.local.ReplayFailures++
		s.local.LastError = err.Error()
	}
	switch {
	case started && err != nil:
		s.noteCatch(catchFailed) // rebuilt in part: the retries go on from there
	case started:
		s.noteCatch(catchOK)
	}
	if started && s.exact {
		s.local.Resyncs++
		s.cfg.Logger.Info("stale worker rebuilt from sequence 0", "worker", s.cfg.Worker)
	}
	return nil
}

// apply hands one event to the index; index failures are fatal.
func (s *Subscriber) apply(ev *engine.Event) error {
	return s.applied(ev, s.cfg.Index.Apply(ev))
}

// applied counts the index's answer err to ev: a rejection, or a fatal failure.
func (s *Subscriber) applied(ev *engine.Event, err error) error {
	if h := s.hyb; h != nil && err == nil {
		switch ev.Kind {
		case engine.EventStored:
			h.held = true
		case engine.EventCleared:
			h.held = false
		case engine.EventRemoveWorker: // the index forgets the declaration too
			h.held, h.sent = false, isDense(h.unit, h.decl)
		}
	}
	switch {
	case err == nil:
		return nil
	case errors.Is(err, engine.ErrParentNotFound):
		s.local.Rejected[ReasonParentNotFound]++
		return nil
	case errors.Is(err, engine.ErrInvalidEvent):
		s.local.Rejected[ReasonInvalidEvent]++
		return nil
	}
	return errFatal{err}
}

// applyBatch decodes one batch and applies its events; the batch's sequence becomes
// the last applied one whatever its content.
func (s *Subscriber) applyBatch(seq uint64, payload []byte) error {
	return s.applyBatchAfter(seq, payload, 0)
}

// applyBatchAfter is applyBatch for a batch the index holds up to the event whose
// SourceCursor is after (0: none of it): the events up to it are skipped.
func (s *Subscriber) applyBatchAfter(seq uint64, payload []byte, after uint64) error {
	bi, _ := s.cfg.Index.(batchIndex)
	if bi == nil {
		return s.decodeApply(seq, payload, after, nil)
	}
	applySlots <- struct{}{}
	defer func() { <-applySlots }()
	return s.decodeApply(seq, payload, after, bi)
}

// applySlots bounds the batches being decoded and applied at once in the process, over
// every subscriber whose Index applies batches (batchIndex: an in-memory index,
// engine.Engine), to GOMAXPROCS-1 (at least one): each subscriber applies in its
// connections' reader goroutines, so without a bound a burst (a fleet's catch-up
// after a stall, replays) could hold every P, and a router's queries would wait
// behind event application in the Go scheduler's run queues. With it one P is
// always free of ingestion. A slot is held for one batch's CPU work only, never
// across a replay's network wait; an Index without ApplyBatch (a relay's, which
// publishes each event over the network) takes none, so that one slow stream cannot
// hold the others up.
var applySlots = make(chan struct{}, max(1, runtime.GOMAXPROCS(0)-1))

// decodeApply is applyBatchAfter's work (holding an apply slot when bi, the Index
// as a batchIndex, is not nil).
func (s *Subscriber) decodeApply(seq uint64, payload []byte, after uint64, bi batchIndex) error {
	s.resumeAfter = 0 // a batch applied: the resumed one is behind
	s.has, s.last, s.digest = true, seq, xxh3.Hash(payload)
	s.local.Batches++
	if err := s.dec.Decode(payload, &s.batch); err != nil {
		// Its removals are lost with it: nothing the worker holds can be vouched for.
		// Counted once: a resync replays it as long as the engine buffers it.
		key := badBatch{seq, s.digest}
		if _, seen := s.badSeen[key]; !seen {
			if s.badSeen == nil || len(s.badSeen) >= maxBadSeen {
				s.badSeen = map[badBatch]struct{}{}
			}
			s.badSeen[key] = struct{}{}
			s.local.Rejected[ReasonMalformedBatch]++
			s.warn("undecodable batch; worker invalidated", "seq", seq, "err", err)
		}
		return s.invalidate()
	}
	b := &s.batch
	now := s.now() // one clock read per batch: the diagnosis's times and windows need no finer
	s.diag.batch(b, s.dec, now)
	s.local.Rejected[ReasonUnknownType] += uint64(b.UnknownTypes)
	if b.HasDPRank && b.DPRank != s.cfg.DPRank {
		s.local.Rejected[ReasonRankMismatch] += uint64(len(b.Events))
		return nil
	}
	if s.hyb != nil {
		if err := s.hybridBatch(b); err != nil {
			return err
		}
	}
	if bi != nil && s.hyb == nil {
		if err := s.applyEvents(bi, b, seq, after, now); err != nil {
			return err
		}
	} else {
		for i := range b.Events {
			c := SourceCursor(seq, i)
			if c <= after {
				continue
			}
			if err := s.applyEvent(&b.Events[i], c, now); err != nil {
				return err
			}
		}
	}
	if b.Timestamp > 0 {
		sec := int64(b.Timestamp)
		s.local.LastBatchTime = time.Unix(sec, int64((b.Timestamp-float64(sec))*1e9))
		s.local.LastApplied = s.now()
		s.local.Lag = s.local.LastApplied.Sub(s.local.LastBatchTime)
	}
	if b.RejectedDrops > 0 {
		// A removal or clear the decoder rejected: the index may now hold blocks the
		// worker dropped.
		s.warn("rejected removal; worker invalidated", "seq", seq)
		return s.invalidate()
	}
	return nil
}

// SourceCursor is the engine.Event Cursor of the idx-th event of the publisher's batch
// with sequence seq: (seq+1) << 24 | idx, increasing along the publisher's stream and
// never 0. Events the subscriber makes up itself (the clear of a stale or restarted
// worker, the removal of a vanished one) carry Cursor 0, so a consumer can tell them
// apart. An index past 2^24-1 (more events in one batch than the decoder accepts by
// default, 262,144) saturates.
func SourceCursor(seq uint64, idx int) uint64 {
	return (seq+1)<<24 | uint64(min(idx, 1<<24-1))
}

// tierOf returns the tier of an event's medium, or false when the medium is not
// accepted. The medium is the peer's string (its length bounded only by the payload,
// kvevents.Limits.MaxPayloadBytes): one longer than any configured name is not hashed.
func (s *Subscriber) tierOf(medium string) (engine.Tier, bool) {
	if len(medium) <= MaxMediumLen {
		if t, ok := s.tiers[medium]; ok {
			return t, true
		}
	}
	return engine.TierDevice, s.anyMed
}

// applyEvent hands one decoded event to the index; now is its batch's time.
func (s *Subscriber) applyEvent(e *kvevents.Event, cursor uint64, now time.Time) error {
	ev := &s.ev
	s.blocks = s.blocks[:0]
	copied, ok := s.prepare(e, ev, cursor, s.exact, now)
	if !ok {
		return nil
	}
	before := s.local.Rejected
	if err := s.apply(ev); err != nil {
		return err
	}
	s.settle(e, ev, copied, before, now)
	return nil
}

// prepare fills ev with the index event of e (at cursor; exact: the index holds
// exactly the worker's blocks before it), counting and reporting false for an event
// the index is not to get. A store's blocks are appended to s.blocks.
func (s *Subscriber) prepare(e *kvevents.Event, ev *engine.Event, cursor uint64, exact bool, now time.Time) (copied, ok bool) {
	tier, ok := s.tierOf(e.Medium)
	if !ok {
		s.local.Rejected[ReasonMedium]++
		return false, false
	}
	if s.hyb == nil {
		if ok, label := s.diag.indexed(e); !ok {
			s.local.Rejected[ReasonKVGroup]++
			s.diag.skipGroup(label)
			return false, false
		}
	}
	if e.HashOnly && tier == engine.TierDevice {
		// No content and no faster tier to copy from: indexing it would need positions
		// and prefixes it does not carry.
		s.local.Rejected[ReasonHashOnly]++
		return false, false
	}
	if s.hyb == nil || e.BlockSize == s.cfg.BlockSize || e.BlockSize == 0 {
		s.diag.checkHashes(e, now) // a larger group block's hash covers its units' tokens
	}
	if tier == engine.TierDevice {
		s.diag.forget(e) // a copy's removal leaves the hash valid on the other tiers
	}
	// A clear from the publisher leaves the index exact (applied below).
	*ev = engine.Event{Worker: s.cfg.Worker, Cursor: cursor, Mark: Mark(s.digest, exact || e.Kind == kvevents.Cleared)}
	switch e.Kind {
	case kvevents.Stored:
		if e.HashOnly {
			// vLLM's offloading connector: the worker copied blocks it holds (on the
			// device) to this tier, named by engine hash. The copies take the keys of
			// the worker's own blocks; a parent, if given, adds nothing.
			ev.Kind, ev.Tier, ev.Seqs, copied = engine.EventCopied, tier, e.Seqs, true
			break
		}
		if e.ExtraKeys && s.cfg.SkipExtraKeys {
			s.local.Rejected[ReasonExtraKeys]++
			return false, false
		}
		ev.Kind = engine.EventStored
		ev.Tier = tier
		ev.Namespace = s.namespace(e.Namespace)
		ev.Parent, ev.HasParent = e.Parent, e.HasParent
		// Appended after the blocks of the batch's earlier stores (batched): a growth
		// leaves theirs in the old array, still whole.
		start := len(s.blocks)
		for i, seq := range e.Seqs {
			s.blocks = append(s.blocks, engine.Block{Content: e.Contents[i], Seq: seq})
		}
		ev.Blocks = s.blocks[start:len(s.blocks):len(s.blocks)]
	case kvevents.Removed:
		ev.Kind = engine.EventRemoved
		ev.Tier = tier
		ev.Seqs = e.Seqs
	case kvevents.Cleared:
		// A clear covers every tier (the engine takes none); AllBlocksCleared carries no
		// medium, so it always reads as the device's.
		ev.Kind = engine.EventCleared
	default:
		s.local.Rejected[ReasonUnknownType]++
		return false, false
	}
	if s.hyb != nil && ev.Kind != engine.EventCleared && !s.hybridEvent(e, ev) {
		return false, false
	}
	return copied, true
}

// settle counts e once the index has taken ev (the rejections before it in before).
func (s *Subscriber) settle(e *kvevents.Event, ev *engine.Event, copied bool, before [NumReasons]uint64, now time.Time) {
	s.diag.applied(e, s.local.Rejected == before,
		s.local.Rejected[ReasonParentNotFound] != before[ReasonParentNotFound], now)
	if s.local.Rejected != before {
		return
	}
	switch {
	case copied:
		s.local.Copied++
	case e.Kind == kvevents.Stored:
		s.local.Stored++
	case e.Kind == kvevents.Removed:
		s.local.Removed++
	case e.Kind == kvevents.Cleared:
		s.local.Cleared++
		if !s.exact {
			// The engine dropped everything: from here on the index is exact again.
			s.exact = true
			s.local.Resyncs++
		}
	}
}

// batchIndex is an Index that applies a batch of events at once (engine.Engine).
type batchIndex interface {
	ApplyBatch(evs []engine.Event, errs []error) []error
}

// applyEvents hands the batch's events from index from on (those after after) to a
// batchIndex in one call: one acquisition of the worker and one hand-over to the
// shards per batch instead of per event. The counts and the diagnosis are those of
// applyEvent, event by event.
func (s *Subscriber) applyEvents(bi batchIndex, b *kvevents.Batch, seq, after uint64, now time.Time) error {
	evs, srcs, copied := s.evs[:0], s.srcs[:0], s.copied[:0]
	s.blocks = s.blocks[:0]
	exact := s.exact
	for i := range b.Events {
		c := SourceCursor(seq, i)
		if c <= after {
			continue
		}
		evs = append(evs, engine.Event{})
		cp, ok := s.prepare(&b.Events[i], &evs[len(evs)-1], c, exact, now)
		if !ok {
			evs = evs[:len(evs)-1]
			continue
		}
		exact = exact || b.Events[i].Kind == kvevents.Cleared
		srcs, copied = append(srcs, int32(i)), append(copied, cp)
	}
	s.evs, s.srcs, s.copied = evs, srcs, copied
	if len(evs) == 0 {
		return nil
	}
	s.errs = bi.ApplyBatch(evs, s.errs[:0])
	defer clear(s.errs)
	for k := range evs {
		before := s.local.Rejected
		if err := s.applied(&evs[k], s.errs[k]); err != nil {
			return err
		}
		s.settle(&b.Events[srcs[k]], &evs[k], copied[k], before, now)
	}
	return nil
}

// namespace maps an event namespace to the index namespace, memoised (bounded).
func (s *Subscriber) namespace(ns string) string {
	if s.cfg.Model == "" {
		return ns
	}
	if v, ok := s.nsMemo[ns]; ok {
		return v
	}
	if len(s.nsMemo) >= 1024 {
		clear(s.nsMemo)
	}
	v := Namespace(s.cfg.Model, ns)
	s.nsMemo[ns] = v
	return v
}
