// Package fabric carries the index's events between routers through a NATS JetStream
// stream, so that a fleet of router replicas follows every engine without each of them
// subscribing to every engine, and a restarted replica catches up from a snapshot and
// the stream.
//
//	engines --ZeroMQ--> relay (Publisher) --JetStream stream--> replicas (Replica)
//
// A relay normalises each engine event (Message: the engine.Event and the worker's
// sequence number) and publishes it to subject <prefix>.<model>.<worker> (names
// hex-escaped by Token) with message id <worker>:<seq> (MsgID). Publishing is
// idempotent twice over: the stream drops a message id it saw within its Duplicates
// window, and a Publisher asks the stream for each worker's last sequence before that
// worker's first event and skips what the stream already holds, whatever the window.
//
// A stored event's namespace is one of its model's (subscriber.Namespace(model, ns),
// the namespace a query for the model names): Publish refuses any other, and a replica
// skips, counting it in ReplicaStats.Foreign, a message whose subject names another
// worker than the message or a model whose namespaces do not hold the message's.
//
// An event larger than a message may be (the server's max_payload, headers included)
// travels in parts, each a valid event that says which of the event's items it carries
// (Message.Offset, Total); an event that cannot fit even split (its names alone) is
// refused with ErrTooLarge and counted, and a relay goes on with the next one.
//
// Stream messages are input from whoever may publish on the stream's subjects: a
// replica bounds what they make it hold. A worker's sequence may run at most MaxSeqGap
// past its last (its first at most its stream sequence), the workers it follows are at
// most MaxWorkers, and the namespaces are the engine's bounded table; every skipped
// message is counted in ReplicaStats and warned about at a bounded rate.
//
// A replica consumes the stream with an ordered consumer from a start sequence and
// applies each message with engine.Event.Cursor set to its stream sequence. All
// workers interleave in one stream, so the replica's resume point is the stream
// sequence of the last message applied (LastApplied); it also keeps each worker's
// last sequence and skips a message whose sequence it has already applied, so that
// no event is applied twice. Snapshot writes the index (engine.WriteSnapshot), the
// resume point, each worker's sequence and model and the models the replica follows
// in one checksummed file (format version 3; version 2, without the workers' models,
// is read too); Start restores from it and consumes from the next message, or replays
// the whole stream when the file is refused (ErrSnapshot: truncated, corrupted,
// written for another stream or another set of models, or older than the stream's
// retention).
//
// Every replica applies the same messages in the same order, so replicas converge to
// identical state (byte-identical engine snapshots).
//
// What a replica shows: Stats (stream position, messages pending behind it, the last
// message's lag behind the stream) and Workers (each worker's model, last sequence,
// events by kind, lag, and whether its relay removed it), read under the replica's
// lock; kvindex serve --nats lists them in /v1/workers and /metrics. Both are bounded
// by the workers the stream names, as the worker sequences are.
package fabric
