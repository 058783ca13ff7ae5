package fabric

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/kvindex/kvindex/engine"
	"github.com/kvindex/kvindex/internal/namespace"
)

// DefaultStream is the name of the event stream.
const DefaultStream = "KVINDEX"

// DefaultDuplicates is the stream's deduplication window.
const DefaultDuplicates = 2 * time.Minute

// StreamConfig describes the event stream. Zero fields take their defaults.
type StreamConfig struct {
	// Name of the stream. Default DefaultStream.
	Name string
	// SubjectPrefix of the subjects; the stream holds SubjectPrefix.>. Default
	// DefaultSubjectPrefix.
	SubjectPrefix string
	// Memory keeps the stream in memory instead of files (tests).
	Memory bool
	// Duplicates is the deduplication window for message ids. Default
	// DefaultDuplicates.
	Duplicates time.Duration
	// MaxAge and MaxBytes bound the stream's retention (0: unbounded). A replica that
	// restarts from a snapshot older than the oldest message left must replay fully.
	MaxAge   time.Duration
	MaxBytes int64
	// Replicas is the stream's replication factor in a NATS cluster. Default 1.
	Replicas int
}

func (c StreamConfig) withDefaults() StreamConfig {
	if c.Name == "" {
		c.Name = DefaultStream
	}
	if c.SubjectPrefix == "" {
		c.SubjectPrefix = DefaultSubjectPrefix
	}
	if c.Duplicates == 0 {
		c.Duplicates = DefaultDuplicates
	}
	if c.Replicas == 0 {
		c.Replicas = 1
	}
	return c
}

// EnsureStream creates the stream if missing (or updates its limits) and returns it.
func EnsureStream(ctx context.Context, js jetstream.JetStream, c StreamConfig) (jetstream.Stream, error) {
	c = c.withDefaults()
	sc := jetstream.StreamConfig{
		Name:       c.Name,
		Subjects:   []string{c.SubjectPrefix + ".>"},
		Storage:    jetstream.FileStorage,
		Duplicates: c.Duplicates,
		MaxAge:     c.MaxAge,
		MaxBytes:   c.MaxBytes,
		Replicas:   c.Replicas,
		Retention:  jetstream.LimitsPolicy,
		Discard:    jetstream.DiscardOld,
	}
	if c.MaxBytes == 0 {
		sc.MaxBytes = -1
	}
	if c.Memory {
		sc.Storage = jetstream.MemoryStorage
	}
	s, err := js.CreateOrUpdateStream(ctx, sc)
	if err != nil {
		return nil, fmt.Errorf("fabric: stream %s: %w", c.Name, err)
	}
	return s, nil
}

// PublisherConfig configures a Publisher.
type PublisherConfig struct {
	Stream StreamConfig
	// NoResume turns off the per-worker resume check (the stream is asked for each
	// worker's last sequence on its first event); duplicates are then only caught by
	// the stream's deduplication window. Tests use it to exercise that window.
	NoResume bool
	// AttemptTimeout bounds one publish attempt. Default 2s. A failed attempt is
	// retried (the message id makes retries idempotent) until the context ends.
	AttemptTimeout time.Duration
	// Logger receives retries. Default: discard.
	Logger *slog.Logger
	// MaxMessageBytes bounds one message (its headers included) below the server's
	// max_payload, which is the default and the most it may be: an event that does not
	// fit is split into parts that do (Message.Total), and one that cannot be split to
	// fit (its names alone are too long) is refused with ErrTooLarge.
	MaxMessageBytes int
}

// ErrTooLarge refuses an event whose message cannot fit the server's max_payload even
// split: its worker or namespace name alone is too long.
var ErrTooLarge = errors.New("fabric: event too large for a message")

// PublisherStats counts what a Publisher did.
type PublisherStats struct {
	// Published counts messages the stream stored; Duplicates those it acknowledged as
	// duplicates of stored ones (dedup window); Skipped those not sent at all because the
	// stream already held the worker's sequence; Retries failed attempts.
	Published, Duplicates, Skipped, Retries uint64
	// Split counts events published in parts (each part counts in Published);
	// Refused events refused whole: too large (ErrTooLarge) or malformed (ErrMalformed).
	Split, Refused uint64
}

// Publisher publishes normalised engine events to the stream (the relay side). It is
// safe for concurrent use; events of one worker must be published in order, from one
// goroutine at a time.
type Publisher struct {
	nc     *nats.Conn
	js     jetstream.JetStream
	stream jetstream.Stream
	cfg    PublisherConfig

	mu   sync.Mutex
	last map[string]uint64 // subject -> highest worker sequence the stream holds
	// lastSrc: subject -> source position of the worker's last event (IndexAdapter).
	lastSrc map[string]uint64
	stats   PublisherStats
	bufs    sync.Pool
}

// NewPublisher ensures the stream exists and returns a Publisher on nc.
func NewPublisher(ctx context.Context, nc *nats.Conn, cfg PublisherConfig) (*Publisher, error) {
	cfg.Stream = cfg.Stream.withDefaults()
	if cfg.AttemptTimeout == 0 {
		cfg.AttemptTimeout = 2 * time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, err
	}
	p := &Publisher{nc: nc, js: js, cfg: cfg, last: map[string]uint64{}, lastSrc: map[string]uint64{}}
	err = p.retry(ctx, func(actx context.Context) error {
		s, err := EnsureStream(actx, js, cfg.Stream)
		p.stream = s
		return err
	})
	if err != nil {
		return nil, err
	}
	return p, nil
}

// Stats returns the publisher's counters.
func (p *Publisher) Stats() PublisherStats {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.stats
}

// retry runs f with a per-attempt timeout until it succeeds, fails permanently or ctx
// ends.
func (p *Publisher) retry(ctx context.Context, f func(context.Context) error) error {
	wait := 10 * time.Millisecond
	for {
		actx, cancel := context.WithTimeout(ctx, p.cfg.AttemptTimeout)
		err := f(actx)
		cancel()
		if err == nil {
			return nil
		}
		if ctx.Err() != nil {
			return fmt.Errorf("fabric: publish: %w (last error: %v)", ctx.Err(), err)
		}
		if errors.Is(err, nats.ErrConnectionClosed) || errors.Is(err, ErrMalformed) || errors.Is(err, nats.ErrMaxPayload) {
			return err
		}
		p.mu.Lock()
		p.stats.Retries++
		p.mu.Unlock()
		p.cfg.Logger.Debug("publish attempt failed; retrying", "err", err, "wait", wait)
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("fabric: publish: %w (last error: %v)", ctx.Err(), err)
		case <-t.C:
		}
		wait = min(2*wait, time.Second)
	}
}

// lastSeq returns the highest sequence of subj the stream holds, asking it once.
func (p *Publisher) lastSeq(ctx context.Context, subj string) (uint64, error) {
	p.mu.Lock()
	v, ok := p.last[subj]
	p.mu.Unlock()
	if ok || p.cfg.NoResume {
		return v, nil
	}
	err := p.retry(ctx, func(actx context.Context) error {
		raw, err := p.stream.GetLastMsgForSubject(actx, subj)
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			v = 0
			return nil
		}
		if err != nil {
			return err
		}
		var m Message
		if err := DecodeMessage(raw.Data, &m); err != nil {
			return fmt.Errorf("last message of %s: %w", subj, err)
		}
		v = m.WorkerSeq
		if m.Total != 0 && int(m.Offset)+items(&m.Event) < int(m.Total) {
			v-- // a relay stopped inside a split event: send it again (replicas skip what they hold)
		}
		if src, err := strconv.ParseUint(raw.Header.Get(sourceHeader), 10, 64); err == nil {
			p.mu.Lock()
			if _, ok := p.lastSrc[subj]; !ok {
				p.lastSrc[subj] = src
			}
			p.mu.Unlock()
		}
		return nil
	})
	if err != nil {
		return 0, err
	}
	p.mu.Lock()
	if cur, ok := p.last[subj]; !ok || cur < v {
		p.last[subj] = v
	}
	v = p.last[subj]
	p.mu.Unlock()
	return v, nil
}

// Next returns the sequence the next event of worker (under model) should carry: one
// past the highest the stream holds. Relays that have no sequence of their own (a
// ZeroMQ subscriber) number events with it.
func (p *Publisher) Next(ctx context.Context, model, worker string) (uint64, error) {
	v, err := p.lastSeq(ctx, Subject(p.cfg.Stream.SubjectPrefix, model, worker))
	return v + 1, err
}

// Publish publishes ev as the workerSeq-th event of its worker under model; ev's
// stored event's namespace must be one of model's (subscriber.Namespace(model, ns)),
// else Publish returns ErrMalformed (only stores have a namespace). An event
// whose sequence the stream already holds is skipped (a restarted relay re-sending its
// history); a retried or re-sent message carries the same id, so the stream's
// deduplication window drops it. Sequences of one worker must increase; 0 publishes
// an unnumbered event (never skipped, never deduplicated). Publish retries until the
// stream acknowledges or ctx ends.
func (p *Publisher) Publish(ctx context.Context, model string, ev *engine.Event, workerSeq uint64) error {
	if err := p.check(model, ev); err != nil {
		p.mu.Lock()
		p.stats.Refused++
		p.mu.Unlock()
		return err
	}
	subj := Subject(p.cfg.Stream.SubjectPrefix, model, ev.Worker)
	if workerSeq != 0 {
		last, err := p.lastSeq(ctx, subj)
		if err != nil {
			return err
		}
		if workerSeq <= last {
			p.mu.Lock()
			p.stats.Skipped++
			p.mu.Unlock()
			return nil
		}
	}
	bp, _ := p.bufs.Get().(*[]byte)
	if bp == nil {
		bp = new([]byte)
	}
	defer p.bufs.Put(bp)
	m := Message{WorkerSeq: workerSeq, Event: *ev}
	m.Event.Cursor = 0
	*bp = AppendMessage((*bp)[:0], &m)
	header := nats.Header{}
	if ev.Cursor != 0 {
		// The event's position in its source (subscriber.SourceCursor), so that a
		// restarted relay knows which of the engine's replayed events it already sent.
		header.Set(sourceHeader, strconv.FormatUint(ev.Cursor, 10))
	}
	limit := p.maxMessage()
	// The headers count in max_payload: the longest message id is a part's.
	room := limit - headerBytes(header, p.cfg.Stream.Name, partMsgID(ev.Worker, workerSeq, MaxSplitTotal))
	if len(*bp) <= room {
		id := ""
		if workerSeq != 0 {
			id = MsgID(ev.Worker, workerSeq)
		}
		if err := p.send(ctx, &nats.Msg{Subject: subj, Data: *bp, Header: header}, id); err != nil {
			return err
		}
	} else {
		parts, err := splitMessage(&m, room)
		if err != nil {
			p.mu.Lock()
			p.stats.Refused++
			p.mu.Unlock()
			return fmt.Errorf("%w: %d bytes, at most %d a message (max_payload %d): %v", ErrTooLarge, len(*bp), room, limit, err)
		}
		for i := range parts {
			*bp = AppendMessage((*bp)[:0], &parts[i])
			if err := p.send(ctx, &nats.Msg{Subject: subj, Data: *bp, Header: header}, partMsgID(ev.Worker, workerSeq, parts[i].Offset)); err != nil {
				return err
			}
		}
		p.mu.Lock()
		p.stats.Split++
		p.mu.Unlock()
	}
	if workerSeq != 0 && !p.cfg.NoResume {
		p.mu.Lock()
		p.last[subj] = workerSeq
		p.mu.Unlock()
	}
	return nil
}

// check refuses an event no replica could apply as sent (ErrMalformed).
func (p *Publisher) check(model string, ev *engine.Event) error {
	switch {
	case ev.Worker == "":
		return fmt.Errorf("%w: empty worker", ErrMalformed)
	case ev.Tier >= engine.NumTiers:
		// The flags byte has two tier bits: AppendMessage would keep the low ones and
		// replicas would apply the event on another tier.
		return fmt.Errorf("%w: unknown tier %d", ErrMalformed, ev.Tier)
	case ev.Kind < engine.EventStored || ev.Kind > engine.EventCopied:
		return fmt.Errorf("%w: event kind %d does not travel in the stream", ErrMalformed, ev.Kind)
	case ev.Kind == engine.EventStored && !namespace.In(model, ev.Namespace):
		// Replicas serving model answer from model's namespaces only (and skip such a
		// message as foreign to its subject): published, it could never match.
		return fmt.Errorf("%w: namespace %q is not one of model %q's (subscriber.Namespace)", ErrMalformed, ev.Namespace, model)
	case len(ev.Worker) > MaxNameBytes || len(ev.Namespace) > MaxNameBytes:
		return fmt.Errorf("%w: a name longer than %d bytes", ErrMalformed, MaxNameBytes)
	}
	return nil
}

// maxMessage is the largest message the publisher sends, headers included.
func (p *Publisher) maxMessage() int {
	limit := int(p.nc.MaxPayload())
	if limit <= 0 { // not connected yet: NATS's default
		limit = 1 << 20
	}
	if c := p.cfg.MaxMessageBytes; c > 0 && c < limit {
		limit = c
	}
	return limit
}

// headerBytes is the size of a message's headers on the wire once the publisher has
// added the message id and the expected stream (NATS/1.0 line, "key: value" lines,
// blank line), with room to spare.
func headerBytes(h nats.Header, stream, msgID string) int {
	n := len("NATS/1.0\r\n\r\n") + 64
	for k, vs := range h {
		for _, v := range vs {
			n += len(k) + len(v) + 4
		}
	}
	return n + len(jetstream.MsgIDHeader) + len(msgID) + 4 + len(jetstream.ExpectedStreamHeader) + len(stream) + 4
}

// send publishes one message (with message id id, none when empty), retrying, and
// counts it.
func (p *Publisher) send(ctx context.Context, msg *nats.Msg, id string) error {
	opts := []jetstream.PublishOpt{jetstream.WithExpectStream(p.cfg.Stream.Name)}
	if id != "" {
		opts = append(opts, jetstream.WithMsgID(id))
	}
	var ack *jetstream.PubAck
	err := p.retry(ctx, func(actx context.Context) error {
		a, err := p.js.PublishMsg(actx, msg, opts...)
		ack = a
		return err
	})
	if err != nil {
		return err
	}
	p.mu.Lock()
	if ack.Duplicate {
		p.stats.Duplicates++
	} else {
		p.stats.Published++
	}
	p.mu.Unlock()
	return nil
}

// splitMessage cuts m into parts whose encodings fit room bytes each: a store's blocks
// in runs (each run's parent the previous run's last block), a removal's or copy's seqs
// in runs. An event that has neither, or whose fixed part alone does not fit, cannot
// be split.
func splitMessage(m *Message, room int) ([]Message, error) {
	ev := &m.Event
	var n, per int
	switch ev.Kind {
	case engine.EventStored:
		n, per = len(ev.Blocks), 16
	case engine.EventRemoved, engine.EventCopied:
		n, per = len(ev.Seqs), 8
	default:
		return nil, errors.New("only stores, removals and copies can be split")
	}
	bare := *m
	bare.Offset, bare.Total = MaxSplitTotal-1, MaxSplitTotal
	bare.Event.Blocks, bare.Event.Seqs = nil, nil
	// The fixed part, with the widest part fields and counts.
	fixed := len(AppendMessage(nil, &bare)) + 2*binary.MaxVarintLen64
	each := (room - fixed) / per
	if each < 1 {
		return nil, fmt.Errorf("its names and header take %d bytes", fixed)
	}
	if n > MaxSplitTotal {
		return nil, fmt.Errorf("%d items (at most %d)", n, MaxSplitTotal)
	}
	parts := make([]Message, (n+each-1)/each)
	for i := range parts {
		lo, hi := i*each, min((i+1)*each, n)
		pm := Message{WorkerSeq: m.WorkerSeq, Offset: uint32(lo), Total: uint32(n), Event: *ev}
		if ev.Kind == engine.EventStored {
			pm.Event.Blocks = ev.Blocks[lo:hi]
			if i > 0 {
				pm.Event.Parent, pm.Event.HasParent = ev.Blocks[lo-1].Seq, true
			}
		} else {
			pm.Event.Seqs = ev.Seqs[lo:hi]
		}
		parts[i] = pm
	}
	return parts, nil
}

// Refusal reports whether a Publish error refuses that one event (ErrTooLarge,
// ErrMalformed): the publisher can go on with the next.
func Refusal(err error) bool { return errors.Is(err, ErrTooLarge) || errors.Is(err, ErrMalformed) }

// sourceHeader carries an event's source position (subscriber.SourceCursor).
const sourceHeader = "Kvindex-Source"

// Index returns a subscriber.Index (anything with Apply(*engine.Event) error) that
// publishes each event applied to it under model, numbered with Next. It lets a
// ZeroMQ subscriber feed the stream instead of a local engine.
//
// Exactly once across relay restarts: each published event carries its source position
// (the event's Cursor, subscriber.SourceCursor) in a header. A restarted relay's
// subscriber replays the engine's buffered history from the start; the adapter learns the
// last source position the stream holds for the worker and skips every event at or
// below it. An event the subscriber makes up (Cursor 0: the clear of a restarted or stale
// worker, the removal of a vanished one) is always published and resets the position,
// because a restarted engine numbers its batches from 0 again. What this cannot tell
// apart: an engine that restarted and published past the old position while no relay
// was running looks like the same engine (vLLM's protocol has no publisher identity).
func (p *Publisher) Index(ctx context.Context, model string) *IndexAdapter {
	return &IndexAdapter{p: p, ctx: ctx, model: model}
}

// IndexAdapter adapts a Publisher to subscriber.Index.
type IndexAdapter struct {
	p     *Publisher
	ctx   context.Context
	model string
}

// Apply publishes ev as its worker's next event, unless the stream already holds it.
func (a *IndexAdapter) Apply(ev *engine.Event) error {
	subj := Subject(a.p.cfg.Stream.SubjectPrefix, a.model, ev.Worker)
	seq, err := a.p.Next(a.ctx, a.model, ev.Worker) // also learns the stream's source position
	if err != nil {
		return err
	}
	if ev.Cursor != 0 {
		a.p.mu.Lock()
		last, ok := a.p.lastSrc[subj]
		a.p.mu.Unlock()
		if ok && ev.Cursor <= last {
			a.p.mu.Lock()
			a.p.stats.Skipped++
			a.p.mu.Unlock()
			return nil
		}
	}
	if err := a.p.Publish(a.ctx, a.model, ev, seq); err != nil {
		if Refusal(err) {
			// One event the stream cannot carry: the subscriber counts it as rejected
			// and goes on (the relay must not stop the fleet's events for it).
			return fmt.Errorf("%w: %w", engine.ErrInvalidEvent, err)
		}
		return err
	}
	a.p.mu.Lock()
	a.p.lastSrc[subj] = ev.Cursor // 0 after a made-up event: the source starts over
	a.p.mu.Unlock()
	return nil
}
