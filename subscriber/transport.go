package subscriber

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log"
	"strings"
	"time"

	"github.com/go-zeromq/zmq4"

	"github.com/kvindex/kvindex/kvevents"
)

// Transport errors.
var (
	// errBadReply: a replay reply of a shape neither vLLM version sends.
	errBadReply = errors.New("subscriber: malformed replay reply")
	// errReplayLimit: a replay returned more than Config.MaxReplayBatches replies.
	errReplayLimit = errors.New("subscriber: replay exceeded MaxReplayBatches")
)

// quiet is zmq4's logger: it would otherwise print to stderr.
var quiet = log.New(io.Discard, "", 0)

// openSub returns a SUB socket dialled to (or listening on) the endpoint through the
// ZMTP guard g, subscribed to topic. It makes one attempt: the caller owns the backoff.
func openSub(ctx context.Context, endpoint, topic string, bind bool, dialTimeout time.Duration, g *guard) (zmq4.Socket, error) {
	ep, release, err := guardedEndpoint(endpoint, g)
	if err != nil {
		return nil, err
	}
	defer release()
	s := zmq4.NewSub(ctx, zmq4.WithLogger(quiet), zmq4.WithDialerMaxRetries(0),
		zmq4.WithDialerTimeout(dialTimeout), zmq4.WithAutomaticReconnect(false))
	if err := s.SetOption(zmq4.OptionSubscribe, topic); err != nil {
		closeDrain(s)
		return nil, err
	}
	if bind {
		err = s.Listen(ep)
	} else {
		err = s.Dial(ep)
	}
	if err != nil {
		closeDrain(s)
		return nil, unguardErr(err, ep, endpoint)
	}
	return s, nil
}

// guardedErr is an error of zmq4's that names a guarded endpoint, shown with the
// user's endpoint instead.
type guardedErr struct {
	err       error
	ep, shown string
}

func (e guardedErr) Error() string { return strings.ReplaceAll(e.err.Error(), e.ep, e.shown) }
func (e guardedErr) Unwrap() error { return e.err }

func unguardErr(err error, ep, endpoint string) error {
	if err == nil {
		return nil
	}
	return guardedErr{err, ep, endpoint}
}

// closeDrain closes a zmq4 socket and empties its receive queue. zmq4 delivers received
// messages through a 10-slot channel fed by one goroutine per connection; a goroutine
// that found the channel full when the socket closed would wait on it forever. After
// Close, Recv returns either a queued message or the context error, picked at random
// when both are ready, so reading until the error comes several times in a row empties
// the queue (and lets every connection goroutine see the closed socket and exit). The
// caller must be the only one calling Recv.
func closeDrain(s zmq4.Socket) {
	_ = s.Close()
	errs := 0
	for i := 0; i < 256 && errs < 24; i++ {
		if _, err := s.Recv(); err != nil {
			errs++
		} else {
			errs = 0
		}
	}
}

// parseReply splits one replay reply as a DEALER receives it into its sequence and
// payload frames. The two shapes (package documentation, "Wire protocol"), after the
// empty delimiter:
//
//	[seq, payload]          vLLM before PR #45177, SGLang
//	[topic, seq, payload]   vLLM v0.26.0 and later
//
// A missing delimiter is tolerated.
func parseReply(frames [][]byte) (seq, payload []byte, err error) {
	if len(frames) > 0 && len(frames[0]) == 0 {
		frames = frames[1:]
	}
	switch len(frames) {
	case 2:
		return frames[0], frames[1], nil
	case 3:
		return frames[1], frames[2], nil
	}
	return nil, nil, fmt.Errorf("%w: %d frames", errBadReply, len(frames))
}

// replayFunc streams the batches a replay endpoint still buffers from sequence from on,
// calling fn for each in order until fn returns false or the end marker comes. It
// returns nil when the end marker came or fn stopped it.
type replayFunc func(ctx context.Context, from uint64, fn func(seq uint64, payload []byte) bool) error

// zmqReplay is the replayFunc over a DEALER socket: one fresh socket per request, sending
// [b"", start_seq] (8-byte big-endian) as vLLM's ROUTER expects from a DEALER. The wait
// for each reply is bounded by Config.ReplayTimeout, counted once the replay holds a
// Config.Replays slot.
func (s *Subscriber) zmqReplay(ctx context.Context, from uint64, fn func(seq uint64, payload []byte) bool) error {
	if l := s.cfg.Replays; l != nil {
		// Before the timer: waiting for a slot is this process's delay, not the engine's.
		if err := l.acquire(ctx); err != nil {
			return err
		}
		defer l.release()
	}
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	idle := time.AfterFunc(s.cfg.ReplayTimeout, cancel)
	defer idle.Stop()
	d := zmq4.NewDealer(rctx, zmq4.WithLogger(quiet), zmq4.WithDialerMaxRetries(0),
		zmq4.WithDialerTimeout(s.cfg.ReplayTimeout), zmq4.WithTimeout(s.cfg.ReplayTimeout))
	defer closeDrain(d)
	ep, release, err := guardedEndpoint(s.cfg.ReplayEndpoint, s.dealerGuard)
	if err != nil {
		return err
	}
	err = d.Dial(ep)
	release()
	if err != nil {
		return unguardErr(err, ep, s.cfg.ReplayEndpoint)
	}
	var start [8]byte
	binary.BigEndian.PutUint64(start[:], from)
	if err := d.Send(zmq4.NewMsgFrom([]byte{}, start[:])); err != nil {
		return err
	}
	for n := 0; ; n++ {
		msg, err := d.Recv()
		if err != nil {
			if rctx.Err() != nil && ctx.Err() == nil {
				return fmt.Errorf("subscriber: replay from %d: no reply within %v", from, s.cfg.ReplayTimeout)
			}
			return err
		}
		idle.Reset(s.cfg.ReplayTimeout)
		seqFrame, payload, err := parseReply(msg.Frames)
		if err != nil {
			return err
		}
		seq, end, err := kvevents.ParseSeq(seqFrame)
		if err != nil {
			s.local.UnsupportedSeq++
			return err
		}
		if end {
			return nil
		}
		if n >= s.cfg.MaxReplayBatches {
			return errReplayLimit
		}
		if !fn(seq, payload) {
			return nil
		}
	}
}
