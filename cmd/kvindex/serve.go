package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/kvindex/kvindex/fabric"
	"github.com/kvindex/kvindex/server"
	"github.com/nats-io/nats.go"
)

// engineFlags collects repeated --engine specs.
type engineFlags []server.EngineConfig

func (e *engineFlags) String() string { return fmt.Sprint(len(*e)) }

// Set parses "endpoint=tcp://h:5557,replay=tcp://h:5558,worker=pod-0,model=m,block_size=16,dp_ranks=2,topic=t,bind=true";
// "worker=pod-0,model=m" alone is an engine that publishes no events (serve answers for
// it from predictions: POST /v1/routed, "record" on /v1/match).
func (e *engineFlags) Set(spec string) error {
	var c server.EngineConfig
	// hashCheck returns c's block-hash check config, made by the first hash_ key.
	hashCheck := func() *server.HashCheckConfig {
		if c.HashCheck == nil {
			c.HashCheck = &server.HashCheckConfig{}
		}
		return c.HashCheck
	}
	for _, kv := range strings.Split(spec, ",") {
		k, v, ok := strings.Cut(kv, "=")
		if !ok {
			return fmt.Errorf("%q is not key=value", kv)
		}
		var err error
		switch k {
		case "endpoint":
			c.Endpoint = v
		case "replay", "replay_endpoint":
			c.ReplayEndpoint = v
		case "worker":
			c.Worker = v
		case "model":
			c.Model = v
		case "topic":
			c.Topic = v
		case "block_size":
			c.BlockSize, err = strconv.Atoi(v)
		case "dp_ranks":
			c.DPRanks, err = strconv.Atoi(v)
		case "dp_rank_start":
			c.DPRankStart, err = strconv.Atoi(v)
		case "dp_rank":
			var r int
			r, err = strconv.Atoi(v)
			c.DPRank = &r
		case "bind":
			c.Bind, err = strconv.ParseBool(v)
		case "allowed_peers":
			c.AllowedPeers = strings.Split(v, "|")
		case "media":
			c.Media = strings.Split(v, "|")
		case "hash_seed":
			hashCheck().Seed = v
		case "hash_algo":
			hashCheck().Algo = v
		case "hash_sample":
			hashCheck().SampleEvery, err = strconv.Atoi(v)
		case "kv_groups":
			for _, g := range strings.Split(v, "|") {
				n, e := strconv.Atoi(g)
				if e != nil {
					err = e
					break
				}
				c.KVGroups = append(c.KVGroups, n)
			}
		case "kv_group_kinds":
			c.KVGroupKinds = strings.Split(v, "|")
		case "kv_hybrid":
			c.KVHybrid, err = strconv.ParseBool(v)
		case "kv_group_specs":
			c.KVGroupSpecs, err = parseGroupSpecs(v)
		default:
			return fmt.Errorf("unknown key %q (want endpoint, replay, worker, model, block_size, dp_ranks, dp_rank_start, dp_rank, topic, bind, allowed_peers, media, hash_seed, hash_algo, hash_sample, kv_groups, kv_group_kinds, kv_hybrid, kv_group_specs)", k)
		}
		if err != nil {
			return fmt.Errorf("%s: %v", k, err)
		}
	}
	if c.Endpoint == "" && c.Worker == "" {
		return errors.New("endpoint= is required (or worker= and model= alone: an engine without events, served from predictions)")
	}
	*e = append(*e, c)
	return nil
}

// serveMain runs kvindex serve until ctx ends (SIGTERM/SIGINT through untilSignal), then
// drains and returns 0; it returns 2 for a bad command line or configuration (a
// snapshot directory that does not exist included) and 1 for a runtime failure: an
// address in use at start (startup.go), a fatal error while serving, a final snapshot
// that could not be written.
// parseGroupSpecs reads kv_group_specs=KIND:BLOCK_SIZE[:WINDOW]|...: a hybrid model's
// KV-cache groups in group_idx order.
func parseGroupSpecs(v string) ([]server.KVGroupSpec, error) {
	var out []server.KVGroupSpec
	for _, g := range strings.Split(v, "|") {
		f := strings.Split(g, ":")
		if len(f) < 2 || len(f) > 3 {
			return nil, fmt.Errorf("group %q: want KIND:BLOCK_SIZE or sliding_window:BLOCK_SIZE:WINDOW", g)
		}
		spec := server.KVGroupSpec{Kind: f[0]}
		var err error
		if spec.BlockSize, err = strconv.Atoi(f[1]); err != nil {
			return nil, fmt.Errorf("group %q: block size: %v", g, err)
		}
		if len(f) == 3 {
			if spec.Window, err = strconv.Atoi(f[2]); err != nil {
				return nil, fmt.Errorf("group %q: window: %v", g, err)
			}
		}
		out = append(out, spec)
	}
	return out, nil
}

func serveMain(ctx context.Context, args []string, stdout, stderr io.Writer) (code int) {
	fs := newFlags("serve", stderr)
	cfgPath := fs.String("config", "", "JSON configuration file (docs/serve.md, Configuration); flags override it; SIGHUP re-reads it: engines are added, removed and replaced, other changed settings are logged as needing a restart")
	listen := fs.String("listen", "", "HTTP API address (default "+server.DefaultListen+")")
	grpcListen := fs.String("grpc", "", "also serve the gRPC API (api/kvindexv1/kvindex.proto) at this address, e.g. 127.0.0.1:9090")
	policy := fs.String("policy", "", "default routing policy: "+strings.Join(server.Policies(), ", "))
	blockSize := fs.Int("block-size", 0, "block size of engines that set none (default 16)")
	shards := fs.Int("shards", 0, shardsHelp)
	locked := fs.Bool("locked", false, "run the index behind one lock instead of shard goroutines (index.locked; engine.Config.LockedIndex says when to choose it)")
	jump := fs.Int("jump", 0, jumpHelp)
	grace := fs.Duration("grace", 0, graceHelp)
	drain := fs.Duration("drain-timeout", 0, "wait this long for in-flight requests at shutdown (default 10s)")
	maxBody := fs.Int64("max-body", 0, "largest request body in bytes (default 1 MiB)")
	maxMsg := fs.Int("max-message-bytes", 0, maxMessageHelp)
	logLevel := fs.String("log-level", "info", logLevelHelp)
	check := fs.Bool("check", false, "run serve's start checks (the configuration, the snapshot path, TLS and token files, unauthenticated addresses, that the HTTP, gRPC and bound engine addresses are free) without serving, print the effective configuration (defaults filled in) and exit: 0 when serve would start, 2 for a configuration error, 1 for an address in use")
	natsAuth := natsAuthFlags(fs)
	natsURL := fs.String("nats", "", natsHelp+": follow a kvindex relay's stream there instead of (or besides) ZeroMQ engines")
	stream := fs.String("stream", fabric.DefaultStream, "with --nats: "+streamHelp)
	shareLoad := fs.String("share-load-nats", "", "share the load this replica routes (\"pick\": true, /v1/finished) with the other serve replicas on this NATS server (nats://HOST:PORT, usually --nats's), and count theirs (docs/routing.md)")
	modelsFlag := fs.String("models", "", "with --nats: models served from the stream and their block sizes, as NAME=BLOCKSIZE,...")
	peer := fs.String("peer", "", "with --nats: another serve replica of the stream (http://HOST:PORT) whose worker digests this one compares with its own every --peer-interval (kvindex_replica_peer_checks_total, _peer_mismatches_total)")
	peerEvery := fs.Duration("peer-interval", 30*time.Second, "with --peer: how often to compare")
	peerToken := fs.String("peer-token-file", "", "with --peer: send this token file's first token as a bearer token (the peer's auth.token_file)")
	peerCA := fs.String("peer-ca-file", "", "with --peer: trust these CAs (PEM) for the peer's TLS")
	peerResync := fs.Bool("peer-resync", false, "with --peer: rebuild from the stream each worker whose digest differs from the peer's at the same worker sequence in two checks in a row (kvindex_replica_resyncs_total)")
	snapshot := fs.String("snapshot", "", "snapshot file (with --nats also jetstream-object://BUCKET/NAME to share it through NATS): restored at start (a bad one falls back to a full sync), written every --snapshot-interval and at shutdown (its directory must be writable at start; a failed final write exits 1; kvindex_snapshot_writes_total counts them); in ZeroMQ mode each worker's stream position travels in it, and workers resume by replay from there")
	snapEvery := fs.Duration("snapshot-interval", 5*time.Minute, "with --snapshot: how often to write the snapshot")
	tiersFlag := fs.String("tiers", "", "media mapped to storage tiers, over the defaults (\"\" and GPU device; CPU, CPU_TIER1, CPU_PINNED host; STORAGE, FS, OBJ, DISK, CPU_TIER2, EXTERNAL disk), as MEDIUM=TIER,... with TIER device, host or disk (config: tiers)")
	tlsCert := fs.String("tls-cert", "", "serve HTTP and gRPC over TLS with this certificate chain (PEM; with --tls-key; config: auth.tls_cert_file)")
	tlsKey := fs.String("tls-key", "", "the --tls-cert key (PEM; config: auth.tls_key_file)")
	clientCA := fs.String("tls-client-ca", "", "require client certificates signed by these CAs (PEM; mutual TLS; config: auth.client_ca_file)")
	tokenFile := fs.String("auth-token-file", "", "require \"Authorization: Bearer TOKEN\" (gRPC: authorization metadata) with a token of this file, one a line; /healthz and /readyz stay open (config: auth.token_file)")
	allowUnauth := fs.Bool("allow-unauthenticated", false, "serve a non-loopback address without authenticating clients (otherwise serve refuses to start; config: auth.allow_unauthenticated)")
	weightsFlag := fs.String("tier-weights", "", "default weights of a device, host and disk block in /v1/match's weighted score, as D,H,DISK in [0, 1] (default 1,0.75,0.25; config: tier_weights)")
	noTrust := fs.Bool("no-trust-fallback", false, "score every worker from the index, even one whose events the diagnostics say it cannot vouch for (otherwise such a worker is scored from the router's predictions and its matches say trust degraded or approximate; config: trust.off)")
	enginesFile := fs.String("engines-file", "", "also follow the engines listed in this JSON file (an array of config \"engines\" entries), re-read when it changes (config: discovery.file)")
	var engines engineFlags
	fs.Var(&engines, "engine", engineHelp)
	if code, ok := parseFlags(fs, args, stdout); !ok {
		return code
	}
	level, err := parseLogLevel(*logLevel)
	if err != nil {
		fmt.Fprintf(stderr, "kvindex serve: --log-level: %v\n", err)
		return 2
	}
	cfg, code, ok := readConfigFlag("serve", *cfgPath, stderr) // validated below, once flags are merged
	if !ok {
		return code
	}
	// withFlags merges the command line into a configuration read from --config (or
	// empty): at start, and into the file re-read on SIGHUP.
	withFlags := func(cfg *server.Config) error {
		fs.Visit(func(f *flag.Flag) {
			switch f.Name {
			case "listen":
				cfg.Listen = *listen
			case "policy":
				cfg.Policy = *policy
			case "block-size":
				cfg.BlockSize = *blockSize
			case "shards":
				cfg.Index.Shards = *shards
			case "locked":
				cfg.Index.Locked = *locked
			case "jump":
				cfg.Index.JumpSize = *jump
			case "grace":
				cfg.Grace = server.Duration(*grace)
			case "drain-timeout":
				cfg.DrainTimeout = server.Duration(*drain)
			case "max-body":
				cfg.MaxBodyBytes = *maxBody
			case "max-message-bytes":
				cfg.MaxMessageBytes = *maxMsg
			case "grpc":
				cfg.GRPC.Listen = *grpcListen
			case "tls-cert":
				cfg.Auth.TLSCertFile = *tlsCert
			case "tls-key":
				cfg.Auth.TLSKeyFile = *tlsKey
			case "tls-client-ca":
				cfg.Auth.ClientCAFile = *clientCA
			case "auth-token-file":
				cfg.Auth.TokenFile = *tokenFile
			case "allow-unauthenticated":
				cfg.Auth.AllowUnauthenticated = *allowUnauth
			case "no-trust-fallback":
				cfg.Trust.Off = *noTrust
			}
		})
		cfg.Engines = append(cfg.Engines, engines...)
		if *enginesFile != "" {
			cfg.Discovery.File = &server.FileDiscovery{Path: *enginesFile}
		}
		if err := tierFlags(cfg, *tiersFlag, *weightsFlag); err != nil {
			return err
		}
		if *modelsFlag != "" {
			if cfg.Models == nil {
				cfg.Models = map[string]int{}
			}
			for _, kv := range strings.Split(*modelsFlag, ",") {
				name, bs, ok := strings.Cut(kv, "=")
				n, err := strconv.Atoi(bs)
				if !ok || name == "" || err != nil {
					return fmt.Errorf("--models: %q is not NAME=BLOCKSIZE", kv)
				}
				cfg.Models[name] = n
			}
		}
		return nil
	}
	if err := withFlags(&cfg); err != nil {
		fmt.Fprintf(stderr, "kvindex serve: %v\n", err)
		return 2
	}
	streamSet := false
	fs.Visit(func(f *flag.Flag) { streamSet = streamSet || f.Name == "stream" })
	if *natsURL == "" && (*modelsFlag != "" || streamSet || strings.HasPrefix(*snapshot, "jetstream-object://")) {
		fmt.Fprintln(stderr, "kvindex serve: --models, --stream and a jetstream-object:// snapshot need --nats")
		return 2
	}
	if *natsURL == "" && *peer != "" {
		fmt.Fprintln(stderr, "kvindex serve: --peer needs --nats")
		return 2
	}
	if *peerEvery <= 0 {
		fmt.Fprintln(stderr, "kvindex serve: --peer-interval must be positive")
		return 2
	}
	if *natsURL != "" && len(cfg.Models) == 0 {
		fmt.Fprintln(stderr, "kvindex serve: --nats needs --models NAME=BLOCKSIZE (or a models entry in the config)")
		return 2
	}
	if err := cfg.Validate(); err != nil {
		fmt.Fprintf(stderr, "kvindex serve: %v\n", err)
		return 2
	}
	var natsOpts []nats.Option
	if *natsURL != "" || *shareLoad != "" {
		if natsOpts, err = natsAuth.Options(); err != nil {
			fmt.Fprintf(stderr, "kvindex serve: %v\n", err)
			return 2
		}
	}
	snapOpts := server.SnapshotOptions{Path: *snapshot, Interval: *snapEvery}
	var replica *server.ReplicaOptions
	if *natsURL != "" {
		replica = &server.ReplicaOptions{URL: *natsURL, Stream: *stream, NATS: natsOpts, Peer: *peer, PeerInterval: *peerEvery, PeerResync: *peerResync,
			PeerTokenFile: *peerToken, PeerCAFile: *peerCA}
	}
	if *check {
		return checkServe(cfg, server.Options{Snapshot: snapOpts, Replica: replica}, stdout, stderr)
	}
	// What the server will need later, checked now (startup.go; the snapshot's
	// directory is checked by server.New).
	httpLn, grpcLn, err := bindEarly(cfg)
	if err != nil {
		fmt.Fprintf(stderr, "kvindex serve: %v\n", err)
		return 1
	}
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level}))
	opts := server.Options{Logger: log, Listener: httpLn, GRPCListener: grpcLn, Context: ctx, Snapshot: snapOpts, Replica: replica}
	if *shareLoad != "" {
		opts.LoadShare = &server.LoadShareOptions{URL: *shareLoad, NATS: natsOpts}
	}
	s, err := server.New(cfg, opts)
	if err != nil {
		httpLn.Close()
		if grpcLn != nil {
			grpcLn.Close()
		}
		fmt.Fprintf(stderr, "kvindex serve: %v\n", err)
		if errors.Is(err, server.ErrReplica) {
			return 1 // NATS unreachable, or its stream: a runtime failure
		}
		return 2
	}
	drainTimeout := server.DefaultDrainTimeout
	if cfg.DrainTimeout > 0 {
		drainTimeout = time.Duration(cfg.DrainTimeout)
	}
	shutdown := func() error {
		sctx, cancel := context.WithTimeout(context.Background(), drainTimeout)
		defer cancel()
		return s.Shutdown(sctx)
	}
	if err := s.Start(); err != nil {
		fmt.Fprintf(stderr, "kvindex serve: %v\n", err)
		_ = shutdown()
		return 1
	}
	// SIGHUP reloads --config (reload.go); the handler is in place before serve says it
	// listens.
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	fmt.Fprintf(stdout, "kvindex serve: listening on %s (%d engines, %d workers)\n", s.Addr(), len(cfg.Engines), len(s.Subscribers()))
	if a := s.GRPCAddr(); a != "" {
		fmt.Fprintf(stdout, "kvindex serve: gRPC on %s\n", a)
	}
	code = 0
wait:
	for {
		select {
		case <-ctx.Done():
			log.Info("signal received: draining")
			break wait
		case err := <-s.Errors():
			log.Error("fatal", "err", err)
			code = 1
			break wait
		case <-hup:
			reloadConfig(log, s, *cfgPath, withFlags)
		}
	}
	if err := shutdown(); err != nil {
		fmt.Fprintf(stderr, "kvindex serve: shutdown: %v\n", err)
		code = 1
	}
	fmt.Fprintln(stdout, "kvindex serve: stopped")
	return code
}

// tierFlags merges --tiers (MEDIUM=TIER,...: entries over the config's tiers) and
// --tier-weights (D,H,DISK: replaces the config's) into cfg; Validate checks the values.
func tierFlags(cfg *server.Config, tiers, weights string) error {
	if tiers != "" {
		merged := map[string]string{}
		for m, t := range cfg.Tiers {
			merged[m] = t
		}
		for _, kv := range strings.Split(tiers, ",") {
			m, t, ok := strings.Cut(kv, "=")
			if !ok {
				return fmt.Errorf("--tiers: %q is not MEDIUM=TIER", kv)
			}
			merged[m] = t
		}
		cfg.Tiers = merged
	}
	if weights != "" {
		parts := strings.Split(weights, ",")
		w := make([]float64, len(parts))
		for i, p := range parts {
			v, err := strconv.ParseFloat(strings.TrimSpace(p), 64)
			if err != nil {
				return fmt.Errorf("--tier-weights: %q is not a number: %w", p, err)
			}
			w[i] = v
		}
		cfg.TierWeights = w
	}
	return nil
}
