package subscriber

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/kvindex/kvindex/engine"
	"github.com/kvindex/kvindex/hash"
	"github.com/kvindex/kvindex/internal/namespace"
	"github.com/kvindex/kvindex/kvevents"
)

// Errors. Callers branch on them with errors.Is.
var (
	// ErrConfig wraps every Config validation failure.
	ErrConfig = errors.New("subscriber: invalid config")
	// ErrRunning is returned by Run when the Subscriber is already running or has run.
	ErrRunning = errors.New("subscriber: Run called twice")
)

// Index is what a Subscriber applies events to. *engine.Engine implements it. Apply must
// be safe for concurrent use (several subscribers share one index); a Subscriber calls it
// from its own goroutine only, in the order its worker emitted the events.
type Index interface {
	Apply(ev *engine.Event) error
}

// MaxBoundConns bounds the connections a bound socket (Config.Bind) holds at once: the
// endpoint serves one publisher, and each connection may hold one capped frame.
const MaxBoundConns = 8

// MinInterval is the shortest reconnect backoff, replay timeout, resync interval and
// tail check a Config may set: shorter ones only spin.
const MinInterval = time.Millisecond

// Defaults of the Config fields; see Config.
const (
	DefaultReplayTimeout    = 5 * time.Second
	DefaultReconnectMin     = 100 * time.Millisecond
	DefaultReconnectMax     = 5 * time.Second
	DefaultGrace            = 60 * time.Second
	DefaultResyncInterval   = 30 * time.Second
	DefaultTailCheck        = 5 * time.Second
	DefaultMaxReplayBatches = 1 << 20
	// DefaultMaxMessageBytes is the default per-message cap: the 16 MiB payload limit of
	// the decoder (kvevents.Limits.MaxPayloadBytes), which a message's topic and
	// sequence frames barely add to. A 1M-token prefill at block size 16 stores about
	// 62,500 blocks, a few MB of msgpack: a real batch stays well under it.
	DefaultMaxMessageBytes = 16 << 20
	// MaxMaxMessageBytes bounds Config.MaxMessageBytes.
	MaxMaxMessageBytes = 1 << 30
	// MinMaxMessageBytes is the smallest Config.MaxMessageBytes accepted.
	MinMaxMessageBytes = 4 << 10
	// MaxTierEntries bounds Config.Tiers and Config.Media; MaxMediumLen the length of
	// a medium named in either.
	MaxTierEntries = 64
	MaxMediumLen   = 64
)

// DefaultTiers returns the tier of each medium name vLLM and SGLang publish (a new map
// each call):
//
//	device: "" (no medium: engines before tiers), "GPU"
//	host:   "CPU" (vLLM's offloading connector), "CPU_TIER1", "CPU_PINNED" (SGLang)
//	disk:   "STORAGE" (vLLM 0.27+), "FS", "OBJ" (vLLM 0.26), "DISK" (vLLM, SGLang),
//	        "CPU_TIER2", "EXTERNAL" (SGLang's storage tiers)
//
// Every one of them is indexed by default: a worker's match then counts its host and
// disk copies in Score (Match.Tiers says which tier each block is on) and routers weigh
// them (Match.Weighted). A fleet whose engines do not offload publishes device media
// only and sees no change; Config.Media {"", "GPU"} keeps the device-only index.
func DefaultTiers() map[string]engine.Tier {
	return map[string]engine.Tier{
		"": engine.TierDevice, "GPU": engine.TierDevice,
		"CPU": engine.TierHost, "CPU_TIER1": engine.TierHost, "CPU_PINNED": engine.TierHost,
		"STORAGE": engine.TierDisk, "FS": engine.TierDisk, "OBJ": engine.TierDisk, "DISK": engine.TierDisk,
		"CPU_TIER2": engine.TierDisk, "EXTERNAL": engine.TierDisk,
	}
}

// mediaTiers resolves Tiers and Media into the tier of each accepted medium, and
// whether a medium without a tier is accepted (on the device tier: Media "*").
func (c *Config) mediaTiers() (map[string]engine.Tier, bool, error) {
	if len(c.Tiers) > MaxTierEntries || len(c.Media) > MaxTierEntries {
		return nil, false, fmt.Errorf("more than %d entries in Tiers (%d) or Media (%d)", MaxTierEntries, len(c.Tiers), len(c.Media))
	}
	all := DefaultTiers()
	for m, t := range c.Tiers {
		switch {
		case len(m) > MaxMediumLen:
			return nil, false, fmt.Errorf("medium %.16q... in Tiers is longer than %d bytes", m, MaxMediumLen)
		case m == "*":
			return nil, false, errors.New(`"*" in Tiers is not a medium (Media "*" accepts every medium)`)
		case t >= engine.NumTiers:
			return nil, false, fmt.Errorf("unknown tier %d for medium %q in Tiers", t, m)
		}
		all[m] = t
	}
	if len(c.Media) == 0 {
		return all, false, nil
	}
	out, star := map[string]engine.Tier{}, false
	for _, m := range c.Media {
		if m == "*" {
			star = true
			continue
		}
		t, ok := all[m]
		if !ok {
			if len(m) > MaxMediumLen {
				m = m[:MaxMediumLen] + "..."
			}
			return nil, false, fmt.Errorf("medium %q in Media has no tier (give it one in Tiers)", m)
		}
		out[m] = t
	}
	if star {
		return all, true, nil
	}
	return out, false, nil
}

// Config configures one Subscriber: one engine publisher (one endpoint, one
// data-parallel rank). Zero fields take their defaults; New never modifies the caller's
// Config.
type Config struct {
	// Endpoint is the engine's PUB endpoint for this rank, e.g. "tcp://10.0.0.7:5557"
	// (already offset for the rank, see OffsetEndpoint). Required; tcp:// or ipc://.
	Endpoint string
	// ReplayEndpoint is the engine's ROUTER replay endpoint for this rank. Empty: no
	// replay, so every gap leaves the worker stale.
	ReplayEndpoint string
	// Bind makes the SUB socket listen on Endpoint instead of dialling it: vLLM's
	// publisher connects (rather than binds) when its endpoint names a host without '*'.
	// A bound endpoint must serve exactly one publisher: sequence numbers of two
	// publishers on one socket cannot be told apart.
	Bind bool
	// AllowedPeers, with Bind, lists the IP addresses and CIDR prefixes ("10.0.3.7",
	// "10.0.0.0/16") allowed to connect; another peer is closed on accept and counted
	// in Status.PeersRefused. Empty: any peer, so anyone who reaches the port can
	// inject or clear the worker's blocks. ZMTP's CURVE encryption and authentication is
	// not available (go-zeromq/zmq4 implements the NULL and PLAIN mechanisms only):
	// where the network is not trusted, use dial mode (the engine binds, and only the
	// routers may reach its port) or a tunnel.
	AllowedPeers []string
	// Topic is the SUB prefix filter; "" receives every topic (vLLM's default topic).
	Topic string
	// Worker is the worker id the events are applied under. Required.
	Worker string
	// Model names the model this engine serves. Events are applied in namespace
	// Namespace(Model, event namespace), so different models never match each other.
	Model string
	// DPRank is the data-parallel rank this publisher serves; a batch that carries
	// another rank is skipped (counted as ReasonRankMismatch). Batches without a rank
	// are accepted. Default 0.
	DPRank int
	// BlockSize, when not 0, is the only block size accepted in stored events (the
	// router's content hashes only match blocks cut at its own size). Default 0 (any).
	BlockSize int
	// Tiers maps media (an event's medium, "" when absent) to the tier their blocks are
	// indexed on, over DefaultTiers: an entry here adds a medium or changes its tier,
	// the other defaults stay. At most MaxTierEntries entries, names of at most
	// MaxMediumLen bytes.
	Tiers map[string]engine.Tier
	// Media, when set, lists the only media accepted ("*" accepts every medium); each
	// listed medium must have a tier (Tiers or DefaultTiers). With "*", a medium that
	// has no tier is indexed on the device tier, as every accepted medium was before
	// tiers existed. Default: every medium that has a tier. {"", "GPU"} indexes
	// device blocks only (the default before tiers). Events of other media are
	// dropped (ReasonMedium).
	Media []string
	// SkipExtraKeys drops stored events whose extra_keys carry a non-nil entry
	// (multimodal inputs, ...), for routers that never send extra keys. Default false:
	// such blocks are indexed with their extra keys in their content hashes (package
	// kvevents), so only queries giving the same keys match them.
	SkipExtraKeys bool
	// Index receives the events. Required.
	Index Index
	// ReplayTimeout bounds a replay: dialling, and the wait for each reply. Default 5s.
	ReplayTimeout time.Duration
	// ReconnectMin and ReconnectMax bound the exponential backoff (with ±20% jitter)
	// between connection attempts. Defaults 100ms and 5s.
	ReconnectMin, ReconnectMax time.Duration
	// Grace is how long an engine may stay unreachable before its worker is removed from
	// the index. Default 60s; negative: never removed.
	Grace time.Duration
	// ResyncInterval is how often a stale worker tries to rebuild its state from a replay
	// starting at sequence 0. Default 30s; negative: never.
	ResyncInterval time.Duration
	// TailCheck is how long the live stream must be quiet, after a live message,
	// before one catch-up checks that nothing was dropped at the end of the burst (a
	// gap otherwise shows only when the engine publishes again). Needs a replay
	// endpoint. Default 5s; negative: never.
	TailCheck time.Duration
	// MaxReplayBatches bounds the replies one replay may return. Default 1<<20.
	MaxReplayBatches int
	// Replays, when set, bounds the replays running at once across every Subscriber
	// sharing it; a replay's ReplayTimeout runs once it holds a slot. Default nil: no
	// bound (kvindex serve shares one limiter among its subscribers).
	Replays *ReplayLimiter
	// MaxMessageBytes caps one ZeroMQ message (the sum of its frames) on every socket
	// the subscriber opens, checked against each frame header before any allocation:
	// a peer that declares more is refused and its connection closed (ErrPeerRefused,
	// Status.PeersRefused). Default DefaultMaxMessageBytes (16 MiB); between
	// MinMaxMessageBytes and MaxMaxMessageBytes.
	MaxMessageBytes int
	// Limits bound what one payload may make the decoder do (see kvevents.Limits).
	Limits kvevents.Limits
	// Logger receives connection, gap and restart events. Default: discard.
	Logger *slog.Logger
	// Groups selects the KV-cache groups indexed (hybrid models); default full
	// attention. See GroupFilter.
	Groups GroupFilter
	// HashCheck recomputes the engine's block hashes (vLLM "sha256" or "sha256_cbor").
	// Default off.
	HashCheck HashCheck
	// Diagnose sets the thresholds of the silent-miss diagnostics (Problems).
	Diagnose DiagnoseConfig
	// Resume, when set, starts the subscriber at this checkpoint instead of from
	// nothing: the index already holds the worker's blocks as of it (restored from a
	// snapshot of an index this worker's subscriber fed: CheckpointAt of the worker's
	// engine.Position).
	Resume *Checkpoint
}

func (c Config) withDefaults() Config {
	def := func(v *time.Duration, d time.Duration) {
		if *v == 0 {
			*v = d
		}
	}
	def(&c.ReplayTimeout, DefaultReplayTimeout)
	def(&c.ReconnectMin, DefaultReconnectMin)
	def(&c.ReconnectMax, DefaultReconnectMax)
	def(&c.Grace, DefaultGrace)
	def(&c.ResyncInterval, DefaultResyncInterval)
	def(&c.TailCheck, DefaultTailCheck)
	if c.MaxReplayBatches == 0 {
		c.MaxReplayBatches = DefaultMaxReplayBatches
	}
	if c.MaxMessageBytes == 0 {
		c.MaxMessageBytes = DefaultMaxMessageBytes
	}
	c.Media = append([]string(nil), c.Media...)
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	c.Groups = c.Groups.withDefaults()
	c.HashCheck = c.HashCheck.withDefaults()
	c.Diagnose = c.Diagnose.withDefaults()
	return c
}

func (c Config) validate() error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: %s", ErrConfig, fmt.Sprintf(format, args...))
	}
	if c.Worker == "" {
		return bad("Worker is empty")
	}
	if c.Index == nil {
		return bad("Index is nil")
	}
	if err := CheckEndpoint(c.Endpoint, !c.Bind); err != nil {
		return bad("Endpoint: %v", err)
	}
	if len(c.AllowedPeers) > 0 {
		if !c.Bind {
			return bad("AllowedPeers needs Bind (a dialled publisher is the one we chose)")
		}
		if _, err := ParsePeers(c.AllowedPeers); err != nil {
			return bad("%v", err)
		}
	}
	if c.ReplayEndpoint != "" {
		if err := CheckEndpoint(c.ReplayEndpoint, true); err != nil {
			return bad("ReplayEndpoint: %v", err)
		}
	}
	if c.BlockSize != 0 {
		if err := hash.CheckBlockSize(c.BlockSize); err != nil {
			return bad("BlockSize: %v", err)
		}
	}
	if c.DPRank < 0 {
		return bad("DPRank %d is negative", c.DPRank)
	}
	switch {
	case c.ReplayTimeout < 0:
		return bad("ReplayTimeout %v is negative", c.ReplayTimeout)
	case c.ReconnectMin < 0 || c.ReconnectMax < 0:
		return bad("ReconnectMin/ReconnectMax must not be negative")
	case c.ReconnectMin > c.ReconnectMax:
		return bad("ReconnectMin %v exceeds ReconnectMax %v", c.ReconnectMin, c.ReconnectMax)
	case c.ReconnectMin < MinInterval:
		// A redial loop at 1 ns kept a core 76% busy against a closed port.
		return bad("ReconnectMin %v is below %v", c.ReconnectMin, MinInterval)
	case c.ReplayTimeout < MinInterval:
		return bad("ReplayTimeout %v is below %v", c.ReplayTimeout, MinInterval)
	case c.ResyncInterval > 0 && c.ResyncInterval < MinInterval, c.TailCheck > 0 && c.TailCheck < MinInterval:
		return bad("ResyncInterval %v / TailCheck %v below %v (0 or negative: the default or never)", c.ResyncInterval, c.TailCheck, MinInterval)
	case c.MaxReplayBatches < 0:
		return bad("MaxReplayBatches %d is negative", c.MaxReplayBatches)
	case c.MaxMessageBytes < MinMaxMessageBytes || c.MaxMessageBytes > MaxMaxMessageBytes:
		return bad("MaxMessageBytes %d is not between %d and %d", c.MaxMessageBytes, MinMaxMessageBytes, MaxMaxMessageBytes)
	}
	if _, _, err := c.mediaTiers(); err != nil {
		return bad("%v", err)
	}
	for _, err := range []error{c.Groups.validate(c.BlockSize), c.HashCheck.validate(), c.Diagnose.validate()} {
		if err != nil {
			return bad("%v", err)
		}
	}
	if _, err := kvevents.New(kvevents.Config{BlockSize: c.BlockSize, Limits: c.Limits}); err != nil {
		return bad("%v", err)
	}
	return nil
}

// CheckEndpoint reports whether endpoint is a ZeroMQ endpoint this package can use:
// tcp://HOST:PORT or ipc://PATH. An endpoint to dial (dial true) must name a host, not
// '*'.
func CheckEndpoint(endpoint string, dial bool) error {
	scheme, rest, ok := strings.Cut(endpoint, "://")
	if !ok || rest == "" {
		return fmt.Errorf("%q is not SCHEME://ADDRESS", endpoint)
	}
	switch scheme {
	case "ipc":
		return nil
	case "tcp":
		host, port, err := net.SplitHostPort(rest)
		if err != nil {
			return fmt.Errorf("%q: %v", endpoint, err)
		}
		if p, err := strconv.Atoi(port); err != nil || p < 0 || p > 65535 {
			return fmt.Errorf("%q: bad port %q", endpoint, port)
		}
		if dial && (host == "*" || host == "" || host == "0.0.0.0" || host == "::") {
			return fmt.Errorf("%q: a dialled endpoint must name a host, not %q", endpoint, host)
		}
		return nil
	}
	return fmt.Errorf("%q: unsupported transport %q (want tcp or ipc)", endpoint, scheme)
}

// OffsetEndpoint returns the endpoint of data-parallel rank rank, as vLLM's
// offset_endpoint_port does for both the PUB and the replay endpoint: rank 0 is
// unchanged; tcp ports are offset by rank (port 0, an OS-chosen port, stays 0); ipc and
// inproc paths get the suffix "_dp<rank>".
func OffsetEndpoint(endpoint string, rank int) (string, error) {
	if rank == 0 || endpoint == "" {
		return endpoint, nil
	}
	if rank < 0 {
		return "", fmt.Errorf("subscriber: negative rank %d", rank)
	}
	scheme, rest, ok := strings.Cut(endpoint, "://")
	if !ok {
		return "", fmt.Errorf("subscriber: %q is not SCHEME://ADDRESS", endpoint)
	}
	switch scheme {
	case "ipc", "inproc":
		return endpoint + "_dp" + strconv.Itoa(rank), nil
	case "tcp":
		host, port, err := net.SplitHostPort(rest)
		if err != nil {
			return "", fmt.Errorf("subscriber: %q: %v", endpoint, err)
		}
		p, err := strconv.Atoi(port)
		if err != nil || p < 0 || p > 65535 {
			return "", fmt.Errorf("subscriber: %q: bad port", endpoint)
		}
		if p == 0 {
			return endpoint, nil
		}
		if p+rank > 65535 {
			return "", fmt.Errorf("subscriber: %q: port %d + rank %d overflows", endpoint, p, rank)
		}
		return "tcp://" + net.JoinHostPort(host, strconv.Itoa(p+rank)), nil
	}
	return "", fmt.Errorf("subscriber: %q: unsupported transport %q", endpoint, scheme)
}

// WorkerID names the worker of one publisher: base (a configured worker id, or the
// engine's endpoint) alone when the engine has no configured data-parallel ranks
// (ranked false), else base + "#dp<rank>".
func WorkerID(base string, rank int, ranked bool) string {
	if !ranked && rank == 0 {
		return base
	}
	return base + "#dp" + strconv.Itoa(rank)
}

// Namespace is the index namespace of an event with kvevents namespace ns (the LoRA
// adapter / cache salt space, "" for the default) from an engine serving model:
// "model=" + MODEL + ";" + ns, where MODEL has '%', ';' and control bytes written as
// %XX, so different (model, ns) pairs never share a namespace. An empty model gives ns
// unchanged. Queries name their namespace the same way. Every path into the index and
// the fabric (the relay's op-log publisher, the replicas' subject check, the HTTP and
// gRPC queries) names a model's namespace with this one function.
func Namespace(model, ns string) string { return namespace.Of(model, ns) }
