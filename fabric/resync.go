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
// RemoveWorker), and the worker's messages from the stream's start are applied again,
// in stream order, with the replica's duplicate and gap checks started afresh, reading
// the worker's subjects with a consumer of its own. For a worker whose digest differs
// from another replica's (kvindex doctor --compare).
//
// The replica's lock is held one batch (256 messages) at a time, not for the whole
// replay: the other workers' messages keep applying between batches. Meanwhile the
// live consumer skips the worker's own messages (recording the last it skipped), and
// the replay applies them in their turn; it ends, under the lock, once it has applied
// every message of the worker up to the replica's position: at a message past the
// position (the live consumer applies that one and the rest), or when the stream has
// no more and the last one skipped is replayed. So a query sees the worker emptied and
// refilled but never a message applied twice or out of order. One Resync of a worker
// at a time (ErrResync otherwise); Snapshot is refused while one runs.
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
	st, err := r.beginResync(worker)
	if err != nil || st == nil {
		return res, err
	}
	defer r.endResync(worker, st)
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
	defer func() { // an ordered consumer is ephemeral: it would go after its inactivity threshold
		_ = js.DeleteConsumer(context.WithoutCancel(ctx), r.cfg.Stream.Name, cons.CachedInfo().Name)
	}()
	ci, err := cons.Info(ctx)
	if err != nil {
		return res, fmt.Errorf("%w: consumer: %w", ErrResync, err)
	}
	if ci.NumPending == 0 && r.handBack(st, true) {
		return res, nil // the worker has no message in the stream
	}
	for {
		done, err := r.resyncBatch(ctx, cons, st, &res)
		if err != nil || done {
			return res, err
		}
		if r.resyncHook != nil {
			r.resyncHook()
		}
	}
}

// resyncing is one Resync's progress (guarded by r.mu): the stream sequence of the
// worker's last message the live consumer skipped, and of the last one replayed.
type resyncing struct {
	worker            string
	skipped, replayed uint64
}

// beginResync empties the worker and marks it resynced (nil when the replica has
// applied nothing yet: there is nothing to replay).
func (r *Replica) beginResync(worker string) (*resyncing, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	switch {
	case r.closed:
		return nil, fmt.Errorf("%w: the replica is closed", ErrResync)
	case r.eng == nil:
		return nil, fmt.Errorf("%w: the replica has not started", ErrResync)
	case r.fatal != nil:
		return nil, fmt.Errorf("%w: %w", ErrResync, r.fatal)
	case r.resyncs[worker] != nil:
		return nil, fmt.Errorf("%w: worker %q is being resynced", ErrResync, worker)
	}
	if err := r.eng.RemoveWorker(worker); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrResync, err)
	}
	delete(r.workerSeq, worker)
	delete(r.workers, worker)
	if r.stats.LastApplied == 0 {
		return nil, nil
	}
	st := &resyncing{worker: worker}
	r.resyncs[worker] = st
	return st, nil
}

// endResync hands the worker back to the live consumer if the replay did not (a
// failed replay: the worker holds what it applied; Resync again to repair it).
func (r *Replica) endResync(worker string, st *resyncing) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.resyncs[worker] == st {
		delete(r.resyncs, worker)
	}
}

// resyncBatch fetches one batch of Resync's replay and applies each message as it
// arrives, under the replica's lock for that message only; done says the replay has
// caught up with the live consumer, which has then taken the worker back (in the same
// critical section: no message falls between them).
func (r *Replica) resyncBatch(ctx context.Context, cons jetstream.Consumer, st *resyncing, res *ResyncResult) (done bool, err error) {
	fctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	batch, err := cons.Fetch(256, jetstream.FetchContext(fctx))
	if err != nil {
		return false, fmt.Errorf("%w: fetch: %w", ErrResync, err)
	}
	got := 0
	for msg := range batch.Messages() {
		got++
		if done, err := r.replayOne(msg, st, res); err != nil || done {
			return done, err
		}
	}
	if err := batch.Error(); err != nil && got == 0 {
		if errors.Is(err, context.DeadlineExceeded) && r.handBack(st, true) {
			return true, nil // nothing more in the stream, and nothing skipped since
		}
		return false, fmt.Errorf("%w: fetch: %w", ErrResync, err)
	}
	return false, nil
}

// replayOne applies one message of the replay under the replica's lock.
func (r *Replica) replayOne(msg jetstream.Msg, st *resyncing, res *ResyncResult) (done bool, err error) {
	meta, err := msg.Metadata()
	if err != nil {
		return false, fmt.Errorf("%w: message without metadata: %w", ErrResync, err)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return false, fmt.Errorf("%w: the replica is closed", ErrResync)
	}
	seq := meta.Sequence.Stream
	if seq > r.stats.LastApplied {
		// Past the replica's position: the live consumer applies it and the rest.
		return r.handBackLocked(st, false), nil
	}
	res.Messages++
	before := r.stats.Applied
	now := time.Now()
	r.replaying = true
	r.applyMsg(seq, msg.Subject(), msg.Data(), now, now.Sub(meta.Timestamp))
	r.replaying = false
	res.Applied += r.stats.Applied - before
	st.replayed = seq
	if r.fatal != nil {
		return false, fmt.Errorf("%w: %w", ErrResync, r.fatal)
	}
	return meta.NumPending == 0 && r.handBackLocked(st, true), nil
}

// handBack is handBackLocked under the lock.
func (r *Replica) handBack(st *resyncing, checkSkipped bool) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.handBackLocked(st, checkSkipped)
}

// handBackLocked gives the worker back to the live consumer, unless checkSkipped and
// it skipped a message the replay has not applied yet (the replay goes on to it).
func (r *Replica) handBackLocked(st *resyncing, checkSkipped bool) bool {
	if checkSkipped && st.replayed < st.skipped {
		return false
	}
	if r.resyncs[st.worker] == st {
		delete(r.resyncs, st.worker)
	}
	return true
}
