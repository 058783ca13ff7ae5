package subscriber

import (
	"strconv"
	"strings"
	"time"

	"github.com/kvindex/kvindex/kvevents"
)

// State is where a Subscriber stands with its publisher and how far the index can vouch
// for its worker.
type State uint8

// The states. Live and Stale are the synced states.
const (
	// StateConnecting: no connection yet (or Run not started).
	StateConnecting State = iota
	// StateSyncing: connected, the first catch-up replay is running.
	StateSyncing
	// StateLive: connected; the index holds exactly the worker's blocks as of the last
	// applied sequence.
	StateLive
	// StateStale: connected, but part of the worker's history could not be had (a gap
	// whose range was no longer buffered, a batch that could not be decoded, history
	// before the subscriber started): the worker was cleared and the index holds only
	// blocks stored since, a subset of what the engine holds. It becomes live again when
	// the engine clears its cache, restarts, or a replay from sequence 0 rebuilds it.
	StateStale
	// StateDisconnected: the publisher is unreachable; the worker's blocks are kept
	// until Config.Grace passes.
	StateDisconnected
	// StateRemoved: the publisher stayed unreachable for Config.Grace; the worker was
	// removed from the index. A reconnection syncs it from scratch.
	StateRemoved
	// StateStopped: Run has returned.
	StateStopped

	numStates
)

var stateNames = [numStates]string{"connecting", "syncing", "live", "stale", "disconnected", "removed", "stopped"}

func (s State) String() string {
	if s < numStates {
		return stateNames[s]
	}
	return "State(" + strconv.Itoa(int(s)) + ")"
}

// States returns every state, in order.
func States() []State {
	out := make([]State, numStates)
	for i := range out {
		out[i] = State(i)
	}
	return out
}

// MarshalText renders the state's name.
func (s State) MarshalText() ([]byte, error) { return []byte(s.String()), nil }

// Reason says why a subscriber dropped an event, a batch or a message. Decoder
// rejections are counted separately (Status.DecoderRejected, by kvevents.Reason).
type Reason uint8

// The reasons.
const (
	// ReasonMalformedBatch: the payload could not be decoded at all.
	ReasonMalformedBatch Reason = iota
	// ReasonParentNotFound: the index rejected a stored event whose parent the worker
	// does not hold.
	ReasonParentNotFound
	// ReasonInvalidEvent: the index rejected an event as invalid (same seq twice, ...).
	ReasonInvalidEvent
	// ReasonUnknownType: an event with a type tag the decoder does not know.
	ReasonUnknownType
	// ReasonMedium: an event for a medium that maps to no tier (Config.Tiers,
	// DefaultTiers) or that Config.Media leaves out.
	ReasonMedium
	// ReasonExtraKeys: a stored event with extra_keys, with Config.SkipExtraKeys set.
	ReasonExtraKeys
	// ReasonRankMismatch: a batch whose data-parallel rank is not Config.DPRank (every
	// event of it).
	ReasonRankMismatch
	// ReasonKVGroup: an event of a KV-cache group Config.Groups does not index (a
	// sliding-window or Mamba group of a hybrid model); Status.Diag.SkippedGroups says
	// which.
	ReasonKVGroup
	// ReasonHashOnly: a stored event without token ids (engine hashes only) on the device
	// tier: its blocks' content is unknown and no other tier holds them to copy from, so
	// it is not indexed (a hash-only store on a host or disk tier is a copy; see Tiers).
	ReasonHashOnly

	NumReasons
)

var reasonNames = [NumReasons]string{
	"malformed_batch", "parent_not_found", "invalid_event", "unknown_type", "medium",
	"extra_keys", "rank_mismatch", "kv_group", "hash_only",
}

func (r Reason) String() string {
	if r < NumReasons {
		return reasonNames[r]
	}
	return "Reason(" + strconv.Itoa(int(r)) + ")"
}

// DecoderReasonName is a kvevents.Reason as a metric label: "token_count_mismatch", ...
func DecoderReasonName(r kvevents.Reason) string {
	return strings.ReplaceAll(r.String(), " ", "_")
}

// Status is a snapshot of one Subscriber. Counters only grow.
type Status struct {
	Worker         string
	Endpoint       string
	ReplayEndpoint string
	Model          string
	DPRank         int

	State State
	// Synced is true once the first catch-up after connecting completed (or, without a
	// replay endpoint, once connected): the subscriber knows where it stands.
	Synced bool
	// ReplayShort: the last catch-up broke off before its end (a reply cut short, as
	// an engine's ROUTER past its high-water mark cuts it, a timeout, a refused dial):
	// the worker is stale and the catch-up is retried, ReconnectMin doubling to
	// ReconnectMax, until one completes. ShortReplays counts the times it began,
	// ReplayRetries the retries.
	ReplayShort                 bool
	ShortReplays, ReplayRetries uint64
	// Connected reports a live connection (dial mode) or a bound socket whose publisher
	// has not been seen to drop (bind mode).
	Connected bool
	// HasSeq is false until a batch is applied (and again after a restart or removal);
	// LastSeq is the sequence number of the last batch applied.
	HasSeq  bool
	LastSeq uint64

	Messages   uint64 // live messages received
	Batches    uint64 // batches applied (live and replayed)
	Duplicates uint64 // live or replayed batches skipped as already applied
	Stored     uint64 // events applied, by kind
	Removed    uint64
	Cleared    uint64
	// Copied counts hash-only stores on a host or disk tier applied as copies
	// (engine.EventCopied): vLLM's offloading connector names offloaded blocks so.
	Copied uint64

	GapsDetected      uint64 // missing ranges: live gaps, holes in replays, batches missed while away
	GapsRecovered     uint64 // ... filled by replay
	GapsUnrecoverable uint64 // ... not buffered any more: the worker was invalidated
	Invalidations     uint64 // times the worker was cleared and marked stale
	// GroupDeclarations counts the KV-cache group declarations sent to the index
	// (GroupFilter.Hybrid): one for a hybrid model, more if groups appeared late.
	GroupDeclarations uint64
	Replays           uint64 // replay requests sent
	ReplayFailures    uint64 // replays that failed (dial, timeout, bad reply)
	TailChecks        uint64 // catch-ups after the live stream went quiet (Config.TailCheck)
	Restarts          uint64 // publisher restarts detected
	Resyncs           uint64 // stale workers rebuilt from a replay at sequence 0
	Connects          uint64 // successful connections (dial) or publishers seen (bind)
	Disconnects       uint64
	Removals          uint64 // grace expiries: the worker was removed from the index

	UnsupportedSeq uint64 // messages whose sequence frame is not 8 bytes (unmerged 24-byte extensions)
	BadFrames      uint64 // messages with another frame count, an END marker, another topic
	// PeersRefused counts connections the ZMTP guard closed: a frame past
	// Config.MaxMessageBytes, a malformed greeting or handshake, too many connections on
	// a bound socket.
	PeersRefused uint64
	// LastRefusal is why the last refused peer was refused ("" when none was): the
	// frame size past MaxMessageBytes, the handshake, the connection bound.
	LastRefusal string

	Rejected        [NumReasons]uint64
	DecoderRejected [kvevents.NumReasons]uint64

	// LastBatchTime is the ts of the last applied batch (the engine's clock);
	// LastApplied is when it was applied (ours). Lag is LastApplied - LastBatchTime,
	// meaningful only with synchronised clocks.
	LastBatchTime time.Time
	LastApplied   time.Time
	Lag           time.Duration
	// LastMessage is when the last live message arrived; DownSince when the publisher
	// was found unreachable (zero while connected).
	LastMessage time.Time
	DownSince   time.Time
	// LastError describes the last connection or replay failure.
	LastError string

	// Diag holds the silent-miss diagnostics' counters (see Problems).
	Diag Diagnostics
}

// RejectedTotal sums Rejected and DecoderRejected.
func (s *Status) RejectedTotal() uint64 {
	var t uint64
	for _, n := range s.Rejected {
		t += n
	}
	for _, n := range s.DecoderRejected {
		t += n
	}
	return t
}
