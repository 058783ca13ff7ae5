package fabric

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/kvindex/kvindex/engine"
	"github.com/kvindex/kvindex/internal/atomicfile"
	"github.com/kvindex/kvindex/internal/namespace"
	"github.com/kvindex/kvindex/internal/warnlimit"
)

// ReplicaConfig configures a Replica. Zero fields take their defaults.
type ReplicaConfig struct {
	// Stream names the stream and its subject prefix (only Name and SubjectPrefix are
	// used: a replica never creates the stream).
	Stream StreamConfig
	// Models, when not empty, restricts the replica to these models' subjects (a
	// replica per model group); empty follows every model.
	Models []string
	// Engine configures the index.
	Engine engine.Config
	// MaxSnapshotBytes bounds a snapshot (file or object) read by Start. Default 0: no
	// bound.
	MaxSnapshotBytes int64
	// MaxWorkers bounds the workers the replica follows (the workers a stream's
	// messages can create): a message of a new worker past it is skipped
	// (ReplicaStats.TooManyWorkers), after the workers that were removed make room.
	// Default DefaultMaxWorkers.
	MaxWorkers int
	// MaxSeqGap bounds how far past a worker's last sequence a message's may be: one
	// further is refused (ReplicaStats.SeqRefused), so that one message claiming
	// sequence 2^64-1 cannot make every later event of its worker a duplicate. A
	// worker's first message may carry at most its own stream sequence (a relay numbers
	// each worker's events from 1, one stream message each), and a later one at most as
	// far past the worker's last as the stream's own sequence moved since that message
	// (each event of the worker took a stream message of its own), so that a chain of
	// messages each within MaxSeqGap cannot carry the worker's sequence away either
	// (before, 21 messages each 2^20 ahead silenced a worker for good). After a restore
	// from a snapshot, until a worker's first message, MaxSeqGap alone bounds it.
	// Default DefaultMaxSeqGap.
	MaxSeqGap uint64
	// Logger receives snapshot fallbacks and consumer errors, and the skipped messages'
	// warnings (at most 20 at once, then one a second). Default: discard.
	Logger *slog.Logger
}

// Defaults of ReplicaConfig.
const (
	DefaultMaxWorkers = 1 << 16
	// DefaultMaxSeqGap is far more messages than a relay loses to a stream's retention
	// while a replica follows it.
	DefaultMaxSeqGap = 1 << 20
)

// ReplicaStats counts what a Replica did.
type ReplicaStats struct {
	// LastApplied is the stream sequence of the last message applied (or skipped).
	LastApplied uint64
	// Applied counts messages applied to the engine (Rejected of them refused by it
	// as contract violations: parent not found, invalid); Duplicates counts messages
	// skipped because their worker sequence was already applied; Malformed counts
	// undecodable messages (skipped).
	Applied, Rejected, Duplicates, Malformed uint64
	// Gaps counts messages whose worker sequence was more than one past the last (or
	// a part past the next of a split event).
	Gaps uint64
	// SeqRefused counts messages skipped for a worker sequence past MaxSeqGap;
	// TooManyWorkers messages of a new worker past MaxWorkers.
	SeqRefused, TooManyWorkers uint64
	// Foreign counts messages skipped because their subject names another worker than
	// the message, or a model whose namespaces (subscriber.Namespace) do not hold the
	// message's: applied, they could never be matched by a query for their model.
	Foreign uint64
	// Restored says Start loaded a snapshot; SnapshotErr is why a snapshot was refused
	// (the replica then replayed the stream from its start).
	Restored    bool
	SnapshotErr error
	// Pending is how many messages of the replica's subjects the stream held past the
	// last one applied, as of that message (its delivery's pending count): the replica's
	// lag behind the stream, in messages. Lag is the last message's apply time minus
	// the time the stream stored it; LastAt when it was applied (zero before one).
	Pending uint64
	Lag     time.Duration
	LastAt  time.Time
}

// ReplicaWorker is what a replica knows of one worker of its stream (Replica.Workers).
type ReplicaWorker struct {
	Worker string
	// Model is the model whose subject carried the worker's last message.
	Model string
	// Seq is the worker sequence of the last message applied (0: none numbered).
	Seq uint64
	// Stored, Removed, Cleared and Copied count the worker's events applied, by kind;
	// Rejected those of them the index refused; Duplicates messages skipped as applied
	// already; Gaps messages more than one past the worker's last sequence. They count
	// from the replica's start (a snapshot keeps only Seq and Model).
	Stored, Removed, Cleared, Copied, Rejected, Duplicates, Gaps uint64
	// LastAt is when the replica applied the worker's last message (zero: none since
	// Start); Lag that message's apply time minus the time the stream stored it.
	LastAt time.Time
	Lag    time.Duration
	// Gone says the worker's last event removed it from the index: its relay gave up
	// on its engine (the grace period passed). Its next event brings it back.
	Gone bool
}

// Replica is a router's copy of the index fed from the stream (the serve side). It
// consumes the stream with an ordered consumer, applies each message in stream order
// with Cursor set to the message's stream sequence, and tracks each worker's sequence
// so a message applied once is never applied again.
type Replica struct {
	nc  *nats.Conn
	cfg ReplicaConfig

	// mu serialises applying messages, Snapshot and Close.
	mu        sync.Mutex
	eng       *engine.Engine
	workerSeq map[string]workerState    // every worker seen; at most MaxWorkers
	workers   map[string]*ReplicaWorker // what Workers reports, by worker
	models    map[string]string         // subject token -> model name (checkSubject's memo)
	stats     ReplicaStats
	created   time.Time // the stream's creation time (identifies it across re-creation)
	closed    bool
	fatal     error
	msg       Message
	warns     warnlimit.Limiter
	// resyncs are the workers a Resync replays (resync.go); the live consumer skips
	// their messages meanwhile. replaying is set while Resync applies one.
	resyncs   map[string]*resyncing
	replaying bool
	// resyncHook, when set (tests), runs between two batches of a Resync, unlocked.
	resyncHook func()

	last atomic.Uint64
	cc   jetstream.ConsumeContext
}

// NewReplica returns a Replica on nc; Start starts it.
func NewReplica(nc *nats.Conn, cfg ReplicaConfig) *Replica {
	cfg.Stream = cfg.Stream.withDefaults()
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.MaxWorkers <= 0 {
		cfg.MaxWorkers = DefaultMaxWorkers
	}
	if cfg.MaxSeqGap == 0 {
		cfg.MaxSeqGap = DefaultMaxSeqGap
	}
	return &Replica{nc: nc, cfg: cfg, workerSeq: map[string]workerState{}, workers: map[string]*ReplicaWorker{}, models: map[string]string{},
		resyncs: map[string]*resyncing{}}
}

// workerState is where a worker stands in the stream: the sequence of its last event
// applied and, while that event was split and not all its parts are applied, the
// next part's offset; removed says its last event removed it (its entry goes first when
// MaxWorkers is reached).
type workerState struct {
	seq     uint64
	at      uint64 // the stream sequence of the message that carried seq; 0: unknown
	next    uint32
	removed bool
}

// warn logs a skipped message's warning, rate-limited.
func (r *Replica) warn(msg string, args ...any) {
	ok, suppressed := r.warns.Allow(time.Now())
	if !ok {
		return
	}
	if suppressed > 0 {
		args = append(args, "suppressed", suppressed)
	}
	r.cfg.Logger.Warn(msg, args...)
}

// waitStream returns the replica's stream, waiting for it while it does not exist yet
// (a replica started before its relay created it) until ctx ends; other errors return
// at once.
func (r *Replica) waitStream(ctx context.Context, js jetstream.JetStream) (jetstream.Stream, error) {
	wait := 50 * time.Millisecond
	for logged := false; ; {
		stream, err := js.Stream(ctx, r.cfg.Stream.Name)
		if !errors.Is(err, jetstream.ErrStreamNotFound) {
			return stream, err
		}
		if !logged {
			r.cfg.Logger.Info("waiting for the stream to exist (a relay creates it)", "stream", r.cfg.Stream.Name)
			logged = true
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("%w (waited for it: %w)", err, ctx.Err())
		case <-time.After(wait):
		}
		wait = min(2*wait, 2*time.Second)
	}
}

// Start builds the index and starts consuming. With snapshotPath set and the file
// present, the index is restored from it and the stream consumed from the position it
// records; a snapshot that is truncated, corrupted, from another stream, from a replica
// of other Models, or older than the stream's oldest message is refused
// (Stats().SnapshotErr says why) and the stream is replayed from its start instead. A missing file is not an error. snapshotPath may
// also name an object in a JetStream object store (ObjectScheme + "BUCKET/NAME"). A
// stream that does not exist yet is waited for until ctx ends (a replica may start
// before its relay creates the stream).
func (r *Replica) Start(ctx context.Context, snapshotPath string) error {
	js, err := jetstream.New(r.nc)
	if err != nil {
		return err
	}
	stream, err := r.waitStream(ctx, js)
	if err != nil {
		return fmt.Errorf("fabric: stream %s: %w", r.cfg.Stream.Name, err)
	}
	info, err := stream.Info(ctx)
	if err != nil {
		return fmt.Errorf("fabric: stream %s: %w", r.cfg.Stream.Name, err)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.eng != nil || r.closed {
		return errors.New("fabric: Replica.Start called twice")
	}
	r.created = info.Created
	if snapshotPath != "" {
		if _, _, isObject, err := objectLocation(snapshotPath); err == nil && !isObject {
			if n, err := atomicfile.RemoveStale(snapshotPath); n > 0 || err != nil {
				r.cfg.Logger.Info("snapshot: removed the temporary files of an interrupted write", "files", n, "err", err)
			}
		}
		var snap *snapshot
		bucket, name, isObject, err := objectLocation(snapshotPath)
		switch {
		case err != nil:
			return err
		case isObject:
			var data []byte
			if data, err = getObject(ctx, js, bucket, name, r.cfg.MaxSnapshotBytes); err == nil {
				snap, err = decodeSnapshot(data, r.cfg.Engine)
			}
		default:
			snap, err = readSnapshot(snapshotPath, r.cfg.Engine, r.cfg.MaxSnapshotBytes)
		}
		switch {
		case errors.Is(err, os.ErrNotExist):
		case err == nil && !snap.created.Equal(info.Created):
			snap.eng.Close()
			err = fmt.Errorf("%w: written for another stream (created %v, stream created %v)", ErrSnapshot, snap.created, info.Created)
		case err == nil && !slices.Equal(snap.models, modelSet(r.cfg.Models)):
			snap.eng.Close()
			err = fmt.Errorf("%w: written by a replica of models %q, this one follows %q", ErrSnapshot, snap.models, modelSet(r.cfg.Models))
		case err == nil && snap.last+1 < info.State.FirstSeq:
			snap.eng.Close()
			err = fmt.Errorf("%w: resumes at %d, the stream's oldest message is %d", ErrSnapshot, snap.last+1, info.State.FirstSeq)
		case err == nil:
			r.eng, r.workerSeq, r.stats.Restored = snap.eng, snap.workers, true
			for w, st := range snap.workers {
				r.workers[w] = &ReplicaWorker{Worker: w, Model: snap.workerModels[w], Seq: st.seq, Gone: st.removed}
			}
			r.stats.LastApplied = snap.last
			r.last.Store(snap.last)
		}
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			r.stats.SnapshotErr = err
			r.cfg.Logger.Warn("snapshot refused; replaying the stream", "path", snapshotPath, "err", err)
		}
	}
	if r.eng == nil {
		if r.eng, err = engine.New(r.cfg.Engine); err != nil {
			return err
		}
	}
	if !r.stats.Restored && info.State.FirstSeq > 1 {
		r.cfg.Logger.Warn("stream retention dropped its first messages: replay is incomplete", "first_seq", info.State.FirstSeq)
	}
	occ := jetstream.OrderedConsumerConfig{
		DeliverPolicy: jetstream.DeliverByStartSequencePolicy,
		OptStartSeq:   r.last.Load() + 1,
	}
	for _, m := range modelSet(r.cfg.Models) { // a model twice would overlap its filter
		occ.FilterSubjects = append(occ.FilterSubjects, r.cfg.Stream.SubjectPrefix+"."+Token(m)+".>")
	}
	cons, err := js.OrderedConsumer(ctx, r.cfg.Stream.Name, occ)
	if err != nil {
		return fmt.Errorf("fabric: consumer: %w", err)
	}
	cc, err := cons.Consume(r.handle, jetstream.ConsumeErrHandler(func(_ jetstream.ConsumeContext, err error) {
		r.cfg.Logger.Debug("consumer", "err", err)
	}), jetstream.PullHeartbeat(time.Second), jetstream.PullExpiry(5*time.Second))
	if err != nil {
		return fmt.Errorf("fabric: consume: %w", err)
	}
	r.cc = cc
	return nil
}

func (r *Replica) handle(msg jetstream.Msg) {
	meta, err := msg.Metadata()
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed || r.fatal != nil {
		return
	}
	if err != nil {
		r.cfg.Logger.Warn("message without metadata", "err", err)
		return
	}
	seq := meta.Sequence.Stream
	if seq <= r.stats.LastApplied {
		return // redelivered after a consumer reset
	}
	now := time.Now()
	r.stats.Pending, r.stats.LastAt, r.stats.Lag = meta.NumPending, now, now.Sub(meta.Timestamp)
	r.apply(seq, msg.Subject(), msg.Data(), now, r.stats.Lag)
}

// apply applies the message at stream sequence seq, published to subject, at now, lag
// after the stream stored it. r.mu is held.
func (r *Replica) apply(seq uint64, subject string, data []byte, now time.Time, lag time.Duration) {
	defer func() {
		r.stats.LastApplied = seq
		r.last.Store(seq)
	}()
	r.applyMsg(seq, subject, data, now, lag)
}

// applyMsg is apply without moving the replica's position (Resync replays messages
// behind it). r.mu is held.
func (r *Replica) applyMsg(seq uint64, subject string, data []byte, now time.Time, lag time.Duration) {
	m := &r.msg
	if err := DecodeMessage(data, m); err != nil {
		r.stats.Malformed++
		r.warn("undecodable message skipped", "seq", seq, "err", err)
		return
	}
	ev := &m.Event
	model, why := r.checkSubject(subject, ev)
	if why != "" {
		r.stats.Foreign++
		r.warn("message foreign to its subject skipped", "seq", seq, "subject", subject, "why", why)
		return
	}
	if st := r.resyncs[ev.Worker]; st != nil && !r.replaying {
		st.skipped = seq // Resync applies it in its turn
		return
	}
	verdict := r.admit(seq, m)
	if verdict == admitRefused {
		return
	}
	w := r.workers[ev.Worker]
	if w == nil {
		w = &ReplicaWorker{Worker: ev.Worker}
		r.workers[ev.Worker] = w
	}
	w.Model, w.LastAt, w.Lag = model, now, lag
	switch verdict {
	case admitDuplicate:
		w.Duplicates++
		return
	case admitGap:
		w.Gaps++
	}
	if m.WorkerSeq != 0 {
		w.Seq = m.WorkerSeq
	}
	ev.Cursor = seq
	err := r.eng.Apply(ev)
	r.stats.Applied++
	w.count(ev.Kind, err)
	switch {
	case err == nil:
	case engine.IsRejection(err):
		r.stats.Rejected++
	default:
		r.fatal = err
		r.cfg.Logger.Error("index failed; replica stopped", "err", err)
	}
}

// What admit says of a message.
type admitVerdict uint8

const (
	admitApply     admitVerdict = iota
	admitGap                    // apply it; a message is missing before it
	admitDuplicate              // skip it: applied already
	admitRefused                // skip it: past MaxSeqGap or MaxWorkers
)

// admit checks message m, at stream sequence seq, against its worker's state, records
// it and counts what it skips. A part sent again, cut elsewhere, is trimmed to what the
// replica lacks. r.mu is held.
func (r *Replica) admit(seq uint64, m *Message) admitVerdict {
	w := m.Event.Worker
	st, known := r.workerSeq[w]
	if !known && !r.makeRoom() {
		r.stats.TooManyWorkers++
		r.warn("message of a new worker skipped: the replica follows MaxWorkers workers", "seq", seq, "max_workers", r.cfg.MaxWorkers)
		return admitRefused
	}
	verdict := admitApply
	if ws := m.WorkerSeq; ws != 0 {
		limit := seq // a worker's first message: its events are numbered from 1
		if st.seq != 0 {
			hop := r.cfg.MaxSeqGap
			if st.at != 0 && seq > st.at {
				hop = min(hop, seq-st.at) // one stream message per event since the last
			}
			limit = st.seq + min(hop, ^uint64(0)-st.seq)
		}
		end := m.Offset + uint32(items(&m.Event)) // a whole event: Offset 0
		switch {
		case ws < st.seq || ws == st.seq && (st.next == 0 || end <= st.next):
			r.stats.Duplicates++
			return admitDuplicate
		case ws > limit:
			r.stats.SeqRefused++
			r.warn("message with a worker sequence too far ahead skipped", "seq", seq, "worker_seq", ws, "last", st.seq, "max_seq_gap", r.cfg.MaxSeqGap)
			return admitRefused
		case ws == st.seq && m.Offset < st.next:
			trimPart(m, st.next-m.Offset) // sent again, cut elsewhere: the rest is new
		case ws == st.seq && m.Offset > st.next, ws > st.seq && st.seq != 0 && (ws > st.seq+1 || st.next != 0 || m.Offset != 0):
			r.stats.Gaps++ // a part or an event is missing between this one and the last
			verdict = admitGap
		}
		st.seq, st.at, st.next = ws, seq, 0
		if m.Total != 0 && end < m.Total {
			st.next = end
		}
	}
	st.removed = m.Event.Kind == engine.EventRemoveWorker
	r.workerSeq[w] = st
	return verdict
}

// trimPart drops the first k items of part m, which a replica already applied: a
// store's next block then hangs under the last one dropped.
func trimPart(m *Message, k uint32) {
	ev := &m.Event
	if ev.Kind == engine.EventStored {
		ev.Parent, ev.HasParent = ev.Blocks[k-1].Seq, true
		ev.Blocks = ev.Blocks[k:]
	} else {
		ev.Seqs = ev.Seqs[k:]
	}
	m.Offset += k
}

// makeRoom reports whether a new worker may be followed: under MaxWorkers, or after
// forgetting a removed one. r.mu is held.
func (r *Replica) makeRoom() bool {
	if len(r.workerSeq) < r.cfg.MaxWorkers {
		return true
	}
	for w, st := range r.workerSeq {
		if st.removed {
			delete(r.workerSeq, w)
			delete(r.workers, w)
			return true
		}
	}
	return false
}

// count counts an applied event of kind that the index answered with err.
func (w *ReplicaWorker) count(kind engine.EventKind, err error) {
	if err != nil {
		if engine.IsRejection(err) {
			w.Rejected++
		}
		return
	}
	switch kind {
	case engine.EventStored:
		w.Stored++
	case engine.EventRemoved:
		w.Removed++
	case engine.EventCleared:
		w.Cleared++
	case engine.EventCopied:
		w.Copied++
	}
	w.Gone = kind == engine.EventRemoveWorker
}

// checkSubject returns the model of subject (prefix.<model>.<worker>, see Subject) and
// says why ev does not belong to it, or "" when it does: its worker is the subject's
// and its namespace is one of the subject's model's. r.mu is held.
func (r *Replica) checkSubject(subject string, ev *engine.Event) (model, why string) {
	rest, ok := strings.CutPrefix(subject, r.cfg.Stream.SubjectPrefix+".")
	mtok, wtok, ok2 := strings.Cut(rest, ".")
	if !ok || !ok2 {
		return "", "not a subject of the stream's prefix"
	}
	if !tokenIs(wtok, ev.Worker) {
		return "", "the subject names another worker"
	}
	model, ok = r.models[mtok]
	if !ok {
		name, err := untoken(mtok)
		if err != nil {
			return "", "the subject's model is not a token"
		}
		if len(r.models) >= maxModelTokens {
			clear(r.models)
		}
		model = name
		r.models[mtok] = model
	}
	if ev.Kind == engine.EventStored && !namespace.In(model, ev.Namespace) { // only stores have one
		return model, "the namespace is not one of the subject's model's"
	}
	return model, ""
}

// maxModelTokens bounds the replica's memo of decoded model tokens.
const maxModelTokens = 256

// Engine returns the index (nil before Start). Queries may run at any time.
func (r *Replica) Engine() *engine.Engine {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.eng
}

// LastApplied returns the stream sequence of the last message applied.
func (r *Replica) LastApplied() uint64 { return r.last.Load() }

// Err returns the index failure that stopped the replica, if any.
func (r *Replica) Err() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.fatal
}

// Stats returns the replica's counters.
func (r *Replica) Stats() ReplicaStats {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.stats
}

// Workers returns every worker the replica has seen a message of (or restored from its
// snapshot), by name.
func (r *Replica) Workers() []ReplicaWorker {
	r.mu.Lock()
	out := make([]ReplicaWorker, 0, len(r.workers))
	for _, w := range r.workers {
		out = append(out, *w)
	}
	r.mu.Unlock()
	slices.SortFunc(out, func(a, b ReplicaWorker) int { return strings.Compare(a.Worker, b.Worker) })
	return out
}

// WaitFor waits until the replica has applied stream sequence seq, ctx ends or the
// replica fails.
func (r *Replica) WaitFor(ctx context.Context, seq uint64) error {
	wait := time.Millisecond
	for r.last.Load() < seq {
		if err := r.Err(); err != nil {
			return err
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("fabric: waiting for %d (at %d): %w", seq, r.last.Load(), ctx.Err())
		case <-t.C:
		}
		wait = min(2*wait, 50*time.Millisecond)
	}
	return nil
}

// Snapshot writes a consistent snapshot of the replica to path (atomically: temp
// file, fsync, rename), or to a JetStream object store when path starts with
// ObjectScheme (the bucket is created if needed): the index, the stream position it
// reflects and each worker's sequence. Messages wait while it is written.
func (r *Replica) Snapshot(path string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.eng == nil || r.closed {
		return errors.New("fabric: snapshot of a replica not running")
	}
	if len(r.resyncs) > 0 {
		// A worker being replayed is behind the replica's position: a snapshot now
		// would restore it short.
		return errors.New("fabric: snapshot refused while a worker is resynced; take it after")
	}
	wm := make(map[string]string, len(r.workers))
	for name, w := range r.workers {
		wm[name] = w.Model
	}
	snap := &snapshot{eng: r.eng, last: r.stats.LastApplied, created: r.created, workers: r.workerSeq, workerModels: wm, models: modelSet(r.cfg.Models)}
	bucket, name, isObject, err := objectLocation(path)
	if err != nil {
		return err
	}
	if !isObject {
		return writeSnapshot(path, snap)
	}
	data, err := encodeSnapshot(snap)
	if err != nil {
		return err
	}
	js, err := jetstream.New(r.nc)
	if err != nil {
		return err
	}
	return putObject(js, bucket, name, data)
}

// Close stops consuming and closes the index. It does not close the connection.
func (r *Replica) Close() error {
	if r.cc != nil {
		r.cc.Stop()
		<-r.cc.Closed()
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return nil
	}
	r.closed = true
	if r.eng != nil {
		return r.eng.Close()
	}
	return nil
}
