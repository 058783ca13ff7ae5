package server

import (
	"bytes"
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"slices"
	"time"

	"github.com/kvindex/kvindex/engine"
	"github.com/kvindex/kvindex/hash"
	"github.com/kvindex/kvindex/subscriber"
)

// ErrConfig wraps every configuration error.
var ErrConfig = errors.New("server: invalid config")

// Defaults of the Config fields.
const (
	DefaultListen         = "127.0.0.1:8080"
	DefaultBlockSize      = 16
	DefaultPolicy         = PolicyScorer // the policy `kvindex sim` recommends (docs/routing.md)
	DefaultMaxBodyBytes   = 1 << 20
	MaxMaxBodyBytes       = 64 << 20
	DefaultMaxMatches     = 1024
	MaxMaxMatches         = 1 << 20
	DefaultMaxQueryBlocks = 1 << 16
	DefaultQueryTimeout   = 2 * time.Second
	DefaultDrainTimeout   = 10 * time.Second
	MaxDPRanks            = 1024
	// DefaultMaxConcurrentReplays is Config.MaxConcurrentReplays' default: enough to
	// keep a few engines' catch-ups in flight per core, few enough that a fleet-wide
	// storm does not open a connection per engine at once.
	DefaultMaxConcurrentReplays = 32
)

// Duration is a time.Duration written in JSON as a Go duration string ("1.5s", "200ms").
type Duration time.Duration

// UnmarshalJSON reads a duration string.
func (d *Duration) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return fmt.Errorf("duration must be a string such as \"5s\": %s", b)
	}
	v, err := time.ParseDuration(s)
	if err != nil {
		return err
	}
	*d = Duration(v)
	return nil
}

// MarshalJSON writes a duration string.
func (d Duration) MarshalJSON() ([]byte, error) { return json.Marshal(time.Duration(d).String()) }

// Config is the configuration of kvindex serve, as read from its JSON file. Zero fields
// take their defaults.
type Config struct {
	// Listen is the HTTP API's address. Default 127.0.0.1:8080.
	Listen string `json:"listen,omitempty"`
	// ProbeListen, when set, serves /healthz and /readyz, and nothing else, in plain
	// HTTP on this address too (probes.go): for probes that carry no client
	// certificate when auth.client_ca_file makes the API require one.
	ProbeListen string `json:"probe_listen,omitempty"`
	// Policy is the default routing policy of /v1/match: a load-aware one of package
	// route (pick.go: "llmd-scorer", the default, the policy `kvindex sim`
	// recommends; "dynamo-cost", "llmd-affinity", "llmd-load", "least-loaded"; the old
	// "cost" and "scorer" are aliases), or "longest-prefix", "round-robin",
	// "random".
	Policy string `json:"policy,omitempty"`
	// Routing configures the load-aware policies.
	Routing RoutingConfig `json:"routing,omitempty"`
	// BlockSize is the block size of engines that do not set their own. Default 16.
	BlockSize int `json:"block_size,omitempty"`
	// MaxBodyBytes bounds a request body. Default 1 MiB, at most 64 MiB.
	MaxBodyBytes int64 `json:"max_body_bytes,omitempty"`
	// MaxMatches bounds the matches one /v1/match (or gRPC Match) answers, best first:
	// a request's top_k asks for fewer; matches_total says how many workers matched.
	// Default 1024 (about 110 KB of JSON; 50,000 matching workers were a 5.4 MB
	// answer), at most 1<<20.
	MaxMatches int `json:"max_matches,omitempty"`
	// MaxQueryBlocks bounds the blocks of one query. Default 65536.
	MaxQueryBlocks int `json:"max_query_blocks,omitempty"`
	// QueryTimeout bounds one find-matches call. Default 2s.
	QueryTimeout Duration `json:"query_timeout,omitempty"`
	// DrainTimeout bounds the wait for in-flight requests at shutdown. Default 10s.
	DrainTimeout Duration `json:"drain_timeout,omitempty"`
	// Grace: an engine unreachable this long is removed from the index. Default 60s;
	// negative: never.
	Grace Duration `json:"grace_period,omitempty"`
	// ReplayTimeout, ReconnectMin, ReconnectMax, ResyncInterval: see subscriber.Config.
	ReplayTimeout  Duration `json:"replay_timeout,omitempty"`
	ReconnectMin   Duration `json:"reconnect_min,omitempty"`
	ReconnectMax   Duration `json:"reconnect_max,omitempty"`
	ResyncInterval Duration `json:"resync_interval,omitempty"`
	// TailCheck: a live stream quiet this long after a message gets one catch-up that
	// fetches batches dropped at the end of its burst (subscriber.Config.TailCheck).
	// Default 5s; negative: never.
	TailCheck Duration `json:"tail_check,omitempty"`
	// MaxConcurrentReplays bounds the replays the subscribers run at once (one
	// subscriber.ReplayLimiter for all): after serve stalls every engine's subscriber
	// replays in the same instant. A replay's replay_timeout runs once it has its slot.
	// Default 32; at most subscriber.MaxReplayLimit.
	MaxConcurrentReplays int `json:"max_concurrent_replays,omitempty"`
	// MaxMessageBytes caps one ZeroMQ message from an engine (subscriber.Config
	// MaxMessageBytes): a peer declaring a larger frame is refused before anything is
	// allocated. Default 16 MiB.
	MaxMessageBytes int `json:"max_message_bytes,omitempty"`
	// Auth configures TLS and client authentication (bearer tokens, client
	// certificates) for the HTTP and gRPC APIs (auth.go); required on a non-loopback
	// address unless auth.allow_unauthenticated.
	Auth AuthConfig `json:"auth,omitzero"`
	// Limits bounds what clients of the HTTP and gRPC APIs can make serve hold: the
	// connections, and the request bytes in flight per connection and in all (admit.go).
	Limits LimitsConfig `json:"limits,omitzero"`
	// RuntimeEngines bounds the engines the admin role adds at runtime (runtime.go):
	// their number, binds, ipc:// paths and the hosts dialled.
	RuntimeEngines RuntimeEnginesConfig `json:"runtime_engines,omitzero"`
	// Index configures the engine (zero: engine defaults).
	Index IndexConfig `json:"index,omitzero"`
	// Engines are the publishers to follow. At least one, unless Models or a
	// discovery source is set.
	Engines []EngineConfig `json:"engines"`
	// Discovery finds more engines at runtime (discovery.go): a watched file,
	// Kubernetes pods.
	Discovery DiscoveryConfig `json:"discovery,omitzero"`
	// Models names models served without ZeroMQ engines, with their block sizes: their
	// events reach the index another way (kvindex serve --nats: a JetStream stream).
	Models map[string]int `json:"models,omitempty"`
	// Tokenizers names, by model, the folder of its tokenizer.json,
	// tokenizer_config.json and optional chat_template.jinja: /v1/match (and gRPC Match)
	// then also take the request's text (prompt or messages), and /v1/route an OpenAI
	// request body (text.go). Read once, when serve starts.
	Tokenizers map[string]string `json:"tokenizers,omitempty"`
	// GRPC configures the gRPC API (grpc.go); off unless GRPC.Listen is set.
	GRPC GRPCConfig `json:"grpc,omitzero"`
	// Diagnose sets the thresholds of the silent-miss diagnostics (diagnose.go).
	Diagnose DiagnoseConfig `json:"diagnose,omitzero"`
	// Trust configures the fallback to predictions for workers whose events the
	// index cannot vouch for (trust.go); on unless Trust.Off.
	Trust TrustConfig `json:"trust,omitzero"`
	// Tiers maps media (an event's medium) to the index's storage tiers, "device",
	// "host" or "disk", over the defaults (subscriber.DefaultTiers: "" and "GPU"
	// device; "CPU", "CPU_TIER1", "CPU_PINNED" host; "STORAGE", "FS", "OBJ", "DISK",
	// "CPU_TIER2", "EXTERNAL" disk), for every engine. An engine's media narrows what
	// it accepts. At most 64 entries, names of at most 64 bytes.
	Tiers map[string]string `json:"tiers,omitempty"`
	// TierWeights are the default per-block values of a device, host and disk block in
	// a match's weighted score (engine.Match.Weighted), which orders /v1/match's
	// matches and its longest-prefix pick; a request's tier_weights overrides them.
	// Exactly three numbers in [0, 1]; default [1, 0.75, 0.25] (engine.DefaultWeights).
	TierWeights []float64 `json:"tier_weights,omitempty"`
}

// tierMap parses Tiers (the subscribers bound its size and names).
func (c Config) tierMap() (map[string]engine.Tier, error) {
	if len(c.Tiers) > subscriber.MaxTierEntries {
		return nil, fmt.Errorf("%w: tiers has %d entries (at most %d)", ErrConfig, len(c.Tiers), subscriber.MaxTierEntries)
	}
	if len(c.Tiers) == 0 {
		return nil, nil
	}
	out := make(map[string]engine.Tier, len(c.Tiers))
	for m, name := range c.Tiers {
		if len(m) > subscriber.MaxMediumLen {
			return nil, fmt.Errorf("%w: tiers: medium %.16q... is longer than %d bytes", ErrConfig, m, subscriber.MaxMediumLen)
		}
		t, err := engine.ParseTier(name)
		if err != nil {
			return nil, fmt.Errorf("%w: tiers[%q]: unknown tier %q (want device, host or disk)", ErrConfig, m, name)
		}
		out[m] = t
	}
	return out, nil
}

// weights returns TierWeights as engine.Weights (the default when unset), or an error
// naming the field.
func (c Config) weights() (engine.Weights, error) {
	return parseWeights(c.TierWeights, "tier_weights")
}

// parseWeights checks a list of tier weights (config or request): none is the default,
// else exactly one number in [0, 1] per tier.
func parseWeights(w []float64, field string) (engine.Weights, error) {
	if w == nil {
		return engine.DefaultWeights, nil
	}
	if len(w) != engine.NumTiers {
		return engine.Weights{}, fmt.Errorf("%s has %d numbers, want %d (device, host, disk)", field, len(w), engine.NumTiers)
	}
	out := engine.Weights(w)
	for t, x := range out {
		if !(x >= 0 && x <= 1) { // NaN fails both
			return engine.Weights{}, fmt.Errorf("%s[%d] (%s) is %v, want a number in [0, 1]", field, t, engine.Tier(t), x)
		}
	}
	return out, out.Validate() // agrees; kept so the engine's rule stays the one rule
}

// DiagnoseConfig sets the silent-miss diagnostics' thresholds; zero fields take the
// defaults (subscriber.DiagnoseConfig for the per-worker ones).
type DiagnoseConfig struct {
	// NoEventsAfter: a worker synced this long without an event is reported. Default 2m;
	// negative: never.
	NoEventsAfter Duration `json:"no_events_after,omitempty"`
	// IdleAfter: a worker picked by /v1/match more than this after its last event is
	// reported. Default 5m; negative: never.
	IdleAfter Duration `json:"idle_after,omitempty"`
	// Window: rates are measured over the last one to two windows. Default 1m.
	Window Duration `json:"window,omitempty"`
	// ParentMissRate: the fraction of a worker's stores rejected for an unknown parent
	// above which it is reported. Default 0.05.
	ParentMissRate float64 `json:"parent_miss_rate,omitempty"`
	// UnmatchedRate: the fraction of a model's queries that match nothing while its
	// workers hold blocks above which the model is reported. Default 0.95.
	UnmatchedRate float64 `json:"unmatched_rate,omitempty"`
	// MinSamples: the fewest stores (or queries) a rate is judged on. Default 8 (20
	// for queries).
	MinSamples int `json:"min_samples,omitempty"`
	// LogInterval: an ongoing problem is logged again at most this often. Default 5m.
	LogInterval Duration `json:"log_interval,omitempty"`
}

func (d DiagnoseConfig) subscriber() subscriber.DiagnoseConfig {
	return subscriber.DiagnoseConfig{
		NoEventsAfter: time.Duration(d.NoEventsAfter), IdleAfter: time.Duration(d.IdleAfter),
		Window: time.Duration(d.Window), ParentMissRate: d.ParentMissRate, MinSamples: d.MinSamples,
	}
}

// HashCheckConfig turns on the check of an engine's own block hashes: vLLM with
// PYTHONHASHSEED set and prefix_caching_hash_algo "sha256" or "sha256_cbor" (see package
// vllmhash).
type HashCheckConfig struct {
	// Seed is the engine's PYTHONHASHSEED.
	Seed string `json:"seed"`
	// Algo is the engine's prefix_caching_hash_algo: "sha256" (default) or "sha256_cbor".
	Algo string `json:"algo,omitempty"`
	// SampleEvery checks one chain in N (default 1: all).
	SampleEvery int `json:"sample_every,omitempty"`
}

// IndexConfig is the engine's configuration (see engine.Config).
type IndexConfig struct {
	Shards    int `json:"shards,omitempty"`
	JumpSize  int `json:"jump_size,omitempty"`
	QueueSize int `json:"queue_size,omitempty"`
	// PredictionTTL is the lifetime of a prediction that gives no ttl_ms (POST
	// /v1/routed, "record" on /v1/match). Default 2s.
	PredictionTTL Duration `json:"prediction_ttl,omitempty"`
	// PredictionsPerWorker and PredictedBlocks bound the predictions (engine.Config).
	PredictionsPerWorker int `json:"predictions_per_worker,omitempty"`
	PredictedBlocks      int `json:"predicted_blocks,omitempty"`
	// NamespaceBytes bounds the namespace table (engine.Config.NamespaceBytes):
	// LoRA adapters and cache salts the index names. Default 64 MiB.
	NamespaceBytes int64 `json:"namespace_bytes,omitempty"`
	// Locked runs the index behind one lock instead of shard goroutines
	// (engine.Config.LockedIndex, which says when to choose it): the fastest queries on
	// a machine of a few cores with a modest event rate. Shards must be 0 or 1 with it.
	Locked bool `json:"locked,omitempty"`
	// SpecChain makes the index name positions by SPEC's public XXH3 prefix chain
	// instead of its own keyed one (engine.Config.SpecChain): snapshots then carry no
	// key and are byte-identical across replicas fed the same events; deep queries
	// hash about five times slower. A restored snapshot keeps the chain it was written
	// with.
	SpecChain bool `json:"spec_chain,omitempty"`
}

// Engine returns the engine configuration.
func (c IndexConfig) Engine() engine.Config {
	return engine.Config{Shards: c.Shards, LockedIndex: c.Locked, JumpSize: c.JumpSize, QueueSize: c.QueueSize,
		PredictionTTL: time.Duration(c.PredictionTTL), PredictionsPerWorker: c.PredictionsPerWorker,
		PredictedBlocks: c.PredictedBlocks, SpecChain: c.SpecChain, NamespaceBytes: c.NamespaceBytes}
}

// EngineConfig describes one engine: its endpoints, identity and model.
type EngineConfig struct {
	// Endpoint is the engine's PUB endpoint (rank 0), e.g. "tcp://10.0.0.7:5557". ""
	// (with Worker set) is an engine that publishes no events: it is served from
	// predictions alone (POST /v1/routed, "record" on /v1/match), "approximate" routing.
	Endpoint string `json:"endpoint"`
	// ReplayEndpoint is its ROUTER replay endpoint (rank 0); "" for none.
	ReplayEndpoint string `json:"replay_endpoint,omitempty"`
	// Worker is the worker id; default the endpoint. With DPRanks, rank r is
	// Worker + "#dp<r>".
	Worker string `json:"worker,omitempty"`
	// Model is the served model's name; queries name it. Engines of one model must
	// share a block size.
	Model string `json:"model,omitempty"`
	// BlockSize in tokens; default Config.BlockSize.
	BlockSize int `json:"block_size,omitempty"`
	// DPRanks is the number of data-parallel ranks (0: one publisher, no "#dp" suffix).
	// Rank r (from DPRankStart) publishes on the endpoint's port + r, as vLLM does.
	DPRanks     int `json:"dp_ranks,omitempty"`
	DPRankStart int `json:"dp_rank_start,omitempty"`
	// DPRank, when set, makes the engine one data-parallel rank of Worker's instance
	// publishing on an endpoint of its own (the Mooncake API's /register is one call
	// per rank): its worker id is Worker#dp<rank> and it publishes on Endpoint itself,
	// where dp_ranks derives rank r's endpoint from rank 0's. Not with dp_ranks.
	DPRank *int `json:"dp_rank,omitempty"`
	// Topic is the SUB prefix filter ("" for all).
	Topic string `json:"topic,omitempty"`
	// Bind listens on Endpoint for an engine that connects (vLLM connects when its
	// endpoint names a host rather than '*').
	Bind bool `json:"bind,omitempty"`
	// AllowedPeers, with bind, are the only addresses (IPs, CIDR prefixes) that may
	// connect (subscriber.Config.AllowedPeers); empty: any.
	AllowedPeers []string `json:"allowed_peers,omitempty"`
	// Media, when set, lists the only media accepted, each of which must have a tier
	// (Config.Tiers or its defaults); "*" accepts every medium, those without a tier on
	// the device tier. Default: every medium with a tier. ["", "GPU"] indexes device
	// blocks only.
	Media []string `json:"media,omitempty"`
	// SkipExtraKeys drops stored events with extra_keys (multimodal inputs).
	SkipExtraKeys bool `json:"skip_extra_keys,omitempty"`
	// KVGroupKinds lists the KV-cache spec kinds indexed for hybrid models (default
	// full_attention and mla_attention); KVGroups lists group indices instead. Set them
	// alike on every engine of a model. See subscriber.GroupFilter.
	KVGroupKinds []string `json:"kv_group_kinds,omitempty"`
	KVGroups     []int    `json:"kv_groups,omitempty"`
	// KVHybrid indexes every KV-cache group of a hybrid model under its kind's reuse
	// rule (full attention: every block before the cut; sliding window: the window's
	// last tokens before it; Mamba: a state exactly at it), the groups learned from the
	// events (subscriber.GroupFilter.Hybrid). KVGroupSpecs declares them instead, in
	// group_idx order, and implies KVHybrid: a worker restored from a snapshot keeps
	// its blocks only under a declared spec. Neither goes with KVGroupKinds or
	// KVGroups, which select groups instead.
	KVHybrid     bool          `json:"kv_hybrid,omitempty"`
	KVGroupSpecs []KVGroupSpec `json:"kv_group_specs,omitempty"`
	// HashCheck, when set, recomputes the engine's block hashes.
	HashCheck *HashCheckConfig `json:"hash_check,omitempty"`
}

// KVGroupSpec is one KV-cache group of a hybrid model (EngineConfig.KVGroupSpecs).
type KVGroupSpec struct {
	// Kind is "full" (full or MLA attention), "sliding_window" or "mamba".
	Kind string `json:"kind"`
	// BlockSize is the group's block size in tokens, a multiple of the engine's
	// block_size.
	BlockSize int `json:"block_size"`
	// Window is a sliding-window group's window in tokens.
	Window int `json:"window,omitempty"`
}

// groups returns the specs as the index declares them.
func kvGroups(specs []KVGroupSpec) ([]engine.Group, error) {
	var out []engine.Group
	for i, g := range specs {
		k, err := engine.ParseGroupKind(g.Kind)
		if err != nil {
			return nil, fmt.Errorf("kv_group_specs[%d]: %w", i, err)
		}
		out = append(out, engine.Group{Kind: k, BlockSize: g.BlockSize, Window: g.Window})
	}
	return out, nil
}

// DecodeConfig reads a JSON configuration strictly (unknown fields, keys given twice in
// one object and trailing data are errors) without validating it.
func DecodeConfig(r io.Reader) (Config, error) {
	var c Config
	b, err := io.ReadAll(io.LimitReader(r, maxConfigBytes+1))
	if err != nil {
		return Config{}, fmt.Errorf("%w: %v", ErrConfig, err)
	}
	if len(b) > maxConfigBytes {
		return Config{}, fmt.Errorf("%w: more than %d bytes", ErrConfig, maxConfigBytes)
	}
	if err := checkDuplicateKeys(b); err != nil {
		return Config{}, fmt.Errorf("%w: %v", ErrConfig, err)
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&c); err != nil {
		return Config{}, fmt.Errorf("%w: %v", ErrConfig, err)
	}
	if dec.More() {
		return Config{}, fmt.Errorf("%w: trailing data after the JSON object", ErrConfig)
	}
	return c, nil
}

// maxConfigBytes bounds a configuration file (a fleet of 10,000 engines is ~3 MB).
const maxConfigBytes = 64 << 20

// ParseConfig is DecodeConfig, then Validate.
func ParseConfig(r io.Reader) (Config, error) {
	c, err := DecodeConfig(r)
	if err != nil {
		return Config{}, err
	}
	return c, c.Validate()
}

// ReadConfig decodes a JSON configuration file (see DecodeConfig) without validating it.
func ReadConfig(path string) (Config, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return Config{}, fmt.Errorf("%w: %w", ErrConfig, err)
	}
	c, err := DecodeConfig(bytes.NewReader(b))
	if err != nil {
		return Config{}, fmt.Errorf("%s: %w", path, err)
	}
	return c, nil
}

// LoadConfig reads and validates a JSON configuration file.
func LoadConfig(path string) (Config, error) {
	c, err := ReadConfig(path)
	if err != nil {
		return Config{}, err
	}
	if err := c.Validate(); err != nil {
		return Config{}, fmt.Errorf("%s: %w", path, err)
	}
	return c, nil
}

func (c Config) withDefaults() Config {
	if c.Listen == "" {
		c.Listen = DefaultListen
	}
	if c.Policy == "" {
		c.Policy = DefaultPolicy
	}
	if c.BlockSize == 0 {
		c.BlockSize = DefaultBlockSize
	}
	if c.MaxBodyBytes == 0 {
		c.MaxBodyBytes = DefaultMaxBodyBytes
	}
	if c.MaxQueryBlocks == 0 {
		c.MaxQueryBlocks = DefaultMaxQueryBlocks
	}
	if c.MaxMatches == 0 {
		c.MaxMatches = DefaultMaxMatches
	}
	if c.QueryTimeout == 0 {
		c.QueryTimeout = Duration(DefaultQueryTimeout)
	}
	if c.DrainTimeout == 0 {
		c.DrainTimeout = Duration(DefaultDrainTimeout)
	}
	c.Engines = slices.Clone(c.Engines)
	for i := range c.Engines {
		if c.Engines[i].BlockSize == 0 {
			c.Engines[i].BlockSize = c.BlockSize
		}
	}
	return c
}

// Validate checks the configuration; every message names the field at fault.
func (c Config) Validate() error {
	_, err := c.plan()
	return err
}

// publisher is one subscriber to run: an engine's rank. An approximate one (an engine
// without an endpoint) runs no subscriber; only its Worker, Model and BlockSize are set.
type publisher struct {
	engine int // index in Config.Engines
	cfg    subscriber.Config
	approx bool
	// instance is the engine's worker (or endpoint) without a rank suffix: the
	// instance the Mooncake API folds its ranks into; ranked says the worker id
	// carries cfg.DPRank.
	instance string
	ranked   bool
}

// SubscriberConfigs validates the configuration and returns one subscriber configuration
// per engine rank, exactly as the server would run them, with a placeholder Index for
// the caller to replace (kvindex relay points them at a NATS publisher).
func (c Config) SubscriberConfigs() ([]subscriber.Config, error) {
	pubs, err := c.plan()
	if err != nil {
		return nil, err
	}
	out := make([]subscriber.Config, 0, len(pubs))
	for _, p := range pubs {
		if !p.approx {
			out = append(out, p.cfg)
		}
	}
	return out, nil
}

// plan validates the configuration and expands engines into publishers (one per rank).
func (c Config) plan() ([]publisher, error) {
	p, err := c.planner()
	if err != nil {
		return nil, err
	}
	if len(c.Engines) == 0 && len(c.Models) == 0 && c.Discovery == (DiscoveryConfig{}) {
		return nil, fmt.Errorf("%w: engines: at least one engine (or a models entry, or a discovery source) is required", ErrConfig)
	}
	var out []publisher
	for i, e := range p.c.Engines {
		pubs, err := p.engine(e, i, fmt.Sprintf("engines[%d]", i))
		if err != nil {
			return nil, err
		}
		out = append(out, pubs...)
	}
	return out, nil
}

// planner expands engines into publishers against one configuration's global settings,
// remembering what the engines planned so far claimed (worker ids, endpoints, each
// model's block size): plan runs it over the configured engines, and the server over
// every engine it runs plus one to add (engines.go).
type planner struct {
	c         Config // with defaults
	tiers     map[string]engine.Tier
	workers   map[string]string // worker id -> the engine that claimed it ("engines[2]")
	endpoints map[string]string // endpoint -> the engine that claimed it
	modelBS   map[string]int
}

// planner validates the configuration's global settings (everything but the engines)
// and returns a planner with nothing claimed yet.
func (c Config) planner() (*planner, error) {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: %s", ErrConfig, fmt.Sprintf(format, args...))
	}
	c = c.withDefaults()
	if _, _, err := net.SplitHostPort(c.Listen); err != nil {
		return nil, bad("listen %q: %v", c.Listen, err)
	}
	if _, _, err := net.SplitHostPort(c.ProbeListen); c.ProbeListen != "" && err != nil {
		return nil, bad("probe_listen %q: %v", c.ProbeListen, err)
	}
	if _, ok := canonicalPolicy(c.Policy); !ok {
		return nil, bad("policy %q: want one of %v", c.Policy, Policies())
	}
	if _, err := newRouting(c.Routing, nil); err != nil {
		return nil, bad("%v", err)
	}
	if err := hash.CheckBlockSize(c.BlockSize); err != nil {
		return nil, bad("block_size: %v", err)
	}
	switch {
	case c.MaxBodyBytes < 64 || c.MaxBodyBytes > MaxMaxBodyBytes:
		return nil, bad("max_body_bytes %d: want 64..%d", c.MaxBodyBytes, MaxMaxBodyBytes)
	case c.MaxMatches < 1 || c.MaxMatches > MaxMaxMatches:
		return nil, bad("max_matches %d: want 1..%d", c.MaxMatches, MaxMaxMatches)
	case c.MaxQueryBlocks < 1 || c.MaxQueryBlocks >= engine.MaxDepth:
		return nil, bad("max_query_blocks %d out of range", c.MaxQueryBlocks)
	case c.QueryTimeout < 0 || c.DrainTimeout < 0 || c.ReplayTimeout < 0 || c.ReconnectMin < 0 || c.ReconnectMax < 0:
		return nil, bad("durations must not be negative (grace_period and resync_interval excepted)")
	case c.MaxConcurrentReplays < 0 || c.MaxConcurrentReplays > subscriber.MaxReplayLimit:
		return nil, bad("max_concurrent_replays %d: want 0 (default %d) to %d", c.MaxConcurrentReplays, DefaultMaxConcurrentReplays, subscriber.MaxReplayLimit)
	}
	if d := c.Diagnose; d.UnmatchedRate < 0 || d.UnmatchedRate > 1 || d.LogInterval < 0 {
		return nil, bad("diagnose: unmatched_rate outside [0, 1] or negative log_interval")
	}
	if err := c.Index.Engine().Validate(); err != nil {
		return nil, bad("index: %v", err)
	}
	if err := c.GRPC.validate(); err != nil {
		return nil, err
	}
	if err := c.Trust.validate(); err != nil {
		return nil, err
	}
	largest := c.MaxBodyBytes
	if c.GRPC.Listen != "" {
		largest = max(largest, int64(c.GRPC.withDefaults().MaxMessageBytes))
	}
	if err := c.RuntimeEngines.validate(); err != nil {
		return nil, err
	}
	if err := c.Limits.validate(largest); err != nil {
		return nil, err
	}
	if err := c.Auth.validate(); err != nil {
		return nil, err
	}
	if err := c.Discovery.validate(); err != nil {
		return nil, err
	}
	tiers, err := c.tierMap()
	if err != nil {
		return nil, err
	}
	if _, err := c.weights(); err != nil {
		return nil, bad("%v", err)
	}
	for name, bs := range c.Models {
		if err := hash.CheckBlockSize(bs); err != nil {
			return nil, bad("models[%q]: %v", name, err)
		}
	}
	for name, dir := range c.Tokenizers {
		if dir == "" {
			return nil, bad("tokenizers[%q]: a model folder is required", name)
		}
	}
	return &planner{c: c, tiers: tiers, workers: map[string]string{}, endpoints: map[string]string{},
		modelBS: map[string]int{}}, nil
}

// engine validates one engine against the configuration and the engines planned before
// it, claims its worker ids and endpoints, and returns its publishers. i is the
// publishers' engine index; where names the engine in errors. Nothing is claimed when
// it fails.
func (p *planner) engine(e EngineConfig, i int, where string) ([]publisher, error) {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: %s", ErrConfig, fmt.Sprintf(format, args...))
	}
	if err := checkNames(e, where); err != nil {
		return nil, err
	}
	if e.BlockSize == 0 {
		e.BlockSize = p.c.BlockSize
	}
	if err := hash.CheckBlockSize(e.BlockSize); err != nil {
		return nil, bad("%s.block_size: %v", where, err)
	}
	if bs, ok := p.c.Models[e.Model]; ok && bs != e.BlockSize {
		return nil, bad("%s: model %q has block size %d in models", where, e.Model, bs)
	}
	if bs, ok := p.modelBS[e.Model]; ok && bs != e.BlockSize {
		return nil, bad("%s: model %q has block size %d here and %d elsewhere", where, e.Model, e.BlockSize, bs)
	}
	if e.Endpoint == "" {
		pub, err := approxPublisher(e, where, i, p.workers)
		if err != nil {
			return nil, err
		}
		p.modelBS[e.Model] = e.BlockSize
		p.workers[e.Worker] = where
		return []publisher{pub}, nil
	}
	if e.DPRanks < 0 || e.DPRanks > MaxDPRanks || e.DPRankStart < 0 || e.DPRankStart > 65535 {
		return nil, bad("%s: dp_ranks %d / dp_rank_start %d out of range", where, e.DPRanks, e.DPRankStart)
	}
	if e.DPRanks == 0 && e.DPRankStart != 0 {
		return nil, bad("%s: dp_rank_start needs dp_ranks", where)
	}
	base := e.Worker
	if base == "" {
		base = e.Endpoint
	}
	n, ranked := e.DPRanks, e.DPRanks > 0
	if n == 0 {
		n = 1
	}
	own := false // one rank at exactly Endpoint (DPRank)
	if r := e.DPRank; r != nil {
		switch {
		case e.DPRanks != 0 || e.DPRankStart != 0:
			return nil, bad("%s: dp_rank (one rank on its own endpoint) excludes dp_ranks and dp_rank_start", where)
		case *r < 0 || *r > 65535:
			return nil, bad("%s: dp_rank %d out of range", where, *r)
		case e.Worker == "":
			return nil, bad("%s: dp_rank needs a worker (the instance its ranks belong to)", where)
		}
		e.DPRankStart, ranked, own = *r, true, true
	}
	var out []publisher
	seenW, seenE := map[string]bool{}, map[string]bool{}
	for r := e.DPRankStart; r < e.DPRankStart+n; r++ {
		offset := r
		if own {
			offset = 0
		}
		ep, err := subscriber.OffsetEndpoint(e.Endpoint, offset)
		if err != nil {
			return nil, bad("%s.endpoint: %v", where, err)
		}
		rep, err := subscriber.OffsetEndpoint(e.ReplayEndpoint, offset)
		if err != nil {
			return nil, bad("%s.replay_endpoint: %v", where, err)
		}
		w := subscriber.WorkerID(base, r, ranked)
		if j, dup := p.workers[w]; dup || seenW[w] {
			return nil, bad("%s: worker id %q also used by %s", where, w, cmp.Or(j, where))
		}
		if j, dup := p.endpoints[ep]; dup || seenE[ep] {
			return nil, bad("%s: endpoint %q also used by %s", where, ep, cmp.Or(j, where))
		}
		seenW[w], seenE[ep] = true, true
		sc := p.subscriberConfig(e, ep, rep, w, r)
		decl, err := kvGroups(e.KVGroupSpecs)
		if err != nil {
			return nil, fmt.Errorf("%w: %s: %w", ErrConfig, where, err)
		}
		sc.Groups.Declared = decl
		if _, err := subscriber.New(sc); err != nil {
			return nil, fmt.Errorf("%w: %s (rank %d): %w", ErrConfig, where, r, err)
		}
		out = append(out, publisher{engine: i, cfg: sc, instance: base, ranked: ranked})
	}
	p.modelBS[e.Model] = e.BlockSize
	for _, pub := range out {
		p.workers[pub.cfg.Worker] = where
		p.endpoints[pub.cfg.Endpoint] = where
	}
	return out, nil
}

// subscriberConfig is rank r's subscriber configuration (its Index a placeholder).
func (p *planner) subscriberConfig(e EngineConfig, ep, rep, worker string, r int) subscriber.Config {
	c := &p.c
	sc := subscriber.Config{
		Endpoint:        ep,
		ReplayEndpoint:  rep,
		Bind:            e.Bind,
		AllowedPeers:    e.AllowedPeers,
		Topic:           e.Topic,
		Worker:          worker,
		Model:           e.Model,
		DPRank:          r,
		BlockSize:       e.BlockSize,
		Media:           e.Media,
		Tiers:           p.tiers,
		SkipExtraKeys:   e.SkipExtraKeys,
		Groups:          subscriber.GroupFilter{Kinds: e.KVGroupKinds, Groups: e.KVGroups, Hybrid: e.KVHybrid},
		Diagnose:        c.Diagnose.subscriber(),
		ReplayTimeout:   time.Duration(c.ReplayTimeout),
		ReconnectMin:    time.Duration(c.ReconnectMin),
		ReconnectMax:    time.Duration(c.ReconnectMax),
		Grace:           time.Duration(c.Grace),
		ResyncInterval:  time.Duration(c.ResyncInterval),
		TailCheck:       time.Duration(c.TailCheck),
		MaxMessageBytes: c.MaxMessageBytes,
		Index:           nopIndex{},
	}
	if hc := e.HashCheck; hc != nil {
		sc.HashCheck = subscriber.HashCheck{Enabled: true, Seed: hc.Seed, Algo: hc.Algo, SampleEvery: hc.SampleEvery}
	}
	return sc
}

// approxPublisher checks an engine without an endpoint: it needs a worker id, and
// nothing that only a subscriber would use.
func approxPublisher(e EngineConfig, where string, i int, workers map[string]string) (publisher, error) {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: %s", ErrConfig, fmt.Sprintf(format, args...))
	}
	switch {
	case e.Worker == "":
		return publisher{}, bad("%s: an engine without an endpoint (served from predictions alone) needs a worker; %s.endpoint is required to follow events", where, where)
	case e.ReplayEndpoint != "" || e.DPRanks != 0 || e.DPRankStart != 0 || e.DPRank != nil || e.Bind || e.Topic != "" || e.HashCheck != nil || e.KVHybrid || len(e.KVGroupSpecs) > 0:
		return publisher{}, bad("%s: replay_endpoint, dp_ranks, dp_rank, bind, topic, hash_check, kv_hybrid and kv_group_specs need an endpoint", where)
	}
	if j, dup := workers[e.Worker]; dup {
		return publisher{}, bad("%s: worker id %q also used by %s", where, e.Worker, j)
	}
	return publisher{engine: i, approx: true, instance: e.Worker, cfg: subscriber.Config{Worker: e.Worker, Model: e.Model, BlockSize: e.BlockSize}}, nil
}

// nopIndex stands in for the engine while a configuration is validated.
type nopIndex struct{}

func (nopIndex) Apply(*engine.Event) error { return nil }
