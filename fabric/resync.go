package fabric

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// ResyncResult is what Replica.Resync did.
type ResyncResult struct {
	// Messages is how many of the worker's messages the replay read (up to the
	// replica's position); Applied how many of them it applied.
	Messages, Applied uint64
	// Complete says the stream still holds its first message (always true of a
	// Resync that succeeded: a trimmed stream is refused with ErrStreamTrimmed).
	Complete bool
}

// ErrResync wraps a failed Resync; the worker's index state is then what the replay
// had applied when it failed (Resync again to retry), or untouched when the failure is
// ErrStreamTrimmed.
var ErrResync = errors.New("fabric: resync")

// ErrStreamTrimmed refuses a Resync on a stream whose retention has dropped its first
// messages: the worker's first events may be among them. Nothing is changed.
var ErrStreamTrimmed = errors.New("the stream's retention dropped its first messages")

// Resync rebuilds one worker from the stream: the index forgets it (engine
// RemoveWorker), and the worker's messages from the stream's start up to the replica's
// position are applied again, in stream order, with the replica's duplicate and gap
// checks started afresh. Messages past the position arrive as usual afterwards. The
// replica applies nothing else meanwhile (Resync holds its lock, reading the worker's
// subjects with a consumer of its own), so a query sees the worker emptied and refilled
// but never a message applied twice. For a worker whose digest differs from another
// replica's (kvindex doctor --compare).
func (r *Replica) Resync(ctx context.Context, worker string) (ResyncResult, error) {
	var res ResyncResult
	js, err := jetstream.New(r.nc)
	if err != nil {
		return res, fmt.Errorf("%w: %w", ErrResync, err)
	}
	stream, err := js.Stream(ctx, r.cfg.Stream.Name)
	if err != nil {
		return res, fmt.Errorf("%w: stream %s: %w", ErrResync, r.cfg.Stream.Name, err)
	}
	info, err := stream.Info(ctx)
	if err != nil {
		return res, fmt.Errorf("%w: stream %s: %w", ErrResync, r.cfg.Stream.Name, err)
	}
	res.Complete = info.State.FirstSeq <= 1
	if !res.Complete {
		// The worker's first events may be gone: a replay would lose what the replica
		// holds of them (from a snapshot, say) rather than repair it.
		return res, fmt.Errorf("%w: %w (its first message is %d)", ErrResync, ErrStreamTrimmed, info.State.FirstSeq)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	switch {
	case r.closed:
		return res, fmt.Errorf("%w: the replica is closed", ErrResync)
	case r.eng == nil:
		return res, fmt.Errorf("%w: the replica has not started", ErrResync)
	case r.fatal != nil:
		return res, fmt.Errorf("%w: %w", ErrResync, r.fatal)
	}
	if err := r.eng.RemoveWorker(worker); err != nil {
		return res, fmt.Errorf("%w: %w", ErrResync, err)
	}
	delete(r.workerSeq, worker)
	delete(r.workers, worker)
	target := r.stats.LastApplied
	if target == 0 {
		return res, nil
	}
	occ := jetstream.OrderedConsumerConfig{DeliverPolicy: jetstream.DeliverAllPolicy}
	if models := modelSet(r.cfg.Models); len(models) > 0 {
		for _, m := range models {
			occ.FilterSubjects = append(occ.FilterSubjects, Subject(r.cfg.Stream.SubjectPrefix, m, worker))
		}
	} else {
		occ.FilterSubjects = []string{r.cfg.Stream.SubjectPrefix + ".*." + Token(worker)}
	}
	cons, err := js.OrderedConsumer(ctx, r.cfg.Stream.Name, occ)
	if err != nil {
		return res, fmt.Errorf("%w: consumer: %w", ErrResync, err)
	}
	ci, err := cons.Info(ctx)
	if err != nil {
		return res, fmt.Errorf("%w: consumer: %w", ErrResync, err)
	}
	defer func() { // an ordered consumer is ephemeral: it would go after its inactivity threshold
		_ = js.DeleteConsumer(context.WithoutCancel(ctx), r.cfg.Stream.Name, cons.CachedInfo().Name)
	}()
	pending := ci.NumPending
	for pending > 0 {
		done, err := r.resyncBatch(ctx, cons, target, &res, &pending)
		if err != nil || done {
			return res, err
		}
	}
	return res, nil
}

// resyncBatch fetches and applies one batch of Resync's replay; done says it reached
// the replica's position (target). r.mu is held.
func (r *Replica) resyncBatch(ctx context.Context, cons jetstream.Consumer, target uint64, res *ResyncResult, pending *uint64) (done bool, err error) {
	fctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	batch, err := cons.Fetch(256, jetstream.FetchContext(fctx))
	if err != nil {
		return false, fmt.Errorf("%w: fetch: %w", ErrResync, err)
	}
	got := 0
	for msg := range batch.Messages() {
		got++
		meta, err := msg.Metadata()
		if err != nil {
			return false, fmt.Errorf("%w: message without metadata: %w", ErrResync, err)
		}
		*pending = meta.NumPending
		seq := meta.Sequence.Stream
		if seq > target {
			return true, nil // past the replica's position: the live consumer applies it
		}
		res.Messages++
		before := r.stats.Applied
		now := time.Now()
		r.applyMsg(seq, msg.Subject(), msg.Data(), now, now.Sub(meta.Timestamp))
		res.Applied += r.stats.Applied - before
		if r.fatal != nil {
			return false, fmt.Errorf("%w: %w", ErrResync, r.fatal)
		}
		if seq == target {
			return true, nil
		}
	}
	if err := batch.Error(); err != nil {
		return false, fmt.Errorf("%w: fetch: %w", ErrResync, err)
	}
	if got == 0 {
		return false, fmt.Errorf("%w: the stream delivered none of the %d messages pending", ErrResync, *pending)
	}
	return false, nil
}
