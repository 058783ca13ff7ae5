package server

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/kvindex/kvindex/fabric"
	"github.com/kvindex/kvindex/route"
)

// Load sharing (Options.LoadShare): the replicas of serve behind one front share the
// load they route over NATS (fabric.LoadShare), so that each replica's tracker counts
// every replica's requests in flight and the load-aware policies see the whole load,
// not 1/N of it. A replica publishes each pick it tracks ("pick": true, POST
// /v1/routed with a request_id), each first token and each finish (POST /v1/finished,
// gRPC Finished) of its own requests, and folds the others'. Without it each replica
// knows only what it sent.

// LoadShareOptions configures load sharing (Options.LoadShare).
type LoadShareOptions struct {
	// URL is the NATS server ("nats://host:4222"); every replica of the fleet names
	// the same server (or cluster) and Subject.
	URL string
	// Subject is the subject the replicas share (default fabric.DefaultLoadSubject).
	Subject string
	// Replica is this replica's id (default: random).
	Replica string
	// NATS are the connection's options (credentials and TLS: fabric.NATSAuth).
	NATS []nats.Option
}

// loadShare is a server's side of load sharing: its connection and fabric.LoadShare.
type loadShare struct {
	nc    *nats.Conn
	share *fabric.LoadShare
}

// startLoadShare connects and starts sharing tr's load. The others' requests expire
// after ttl (RoutingConfig.InFlightTTL, 0 for its default), as each replica's tracker
// forgets its own, on the server's clock.
func startLoadShare(ctx context.Context, log *slog.Logger, o LoadShareOptions, tr *route.Tracker[string], ttl time.Duration,
	now func() time.Time) (*loadShare, error) {
	if o.URL == "" {
		return nil, fmt.Errorf("%w: Options.LoadShare needs a NATS URL", ErrConfig)
	}
	nc, err := fabric.Dial(ctx, o.URL, "kvindex serve load", 0, log, o.NATS...)
	if err != nil {
		return nil, fmt.Errorf("%w: load share: %w", ErrReplica, err)
	}
	share, err := fabric.NewLoadShare(nc, tr, fabric.LoadShareConfig{Subject: o.Subject, Replica: o.Replica,
		TTL: ttl, Now: now, Logger: log.With("component", "load-share")})
	if err != nil {
		nc.Close()
		return nil, fmt.Errorf("%w: %w", ErrReplica, err)
	}
	return &loadShare{nc: nc, share: share}, nil
}

func (l *loadShare) close() error {
	if l == nil {
		return nil
	}
	err := l.share.Close()
	l.nc.Close()
	return err
}

// routed and finished publish this replica's deltas of the request tracked under key
// (no-ops without sharing), under the key's digest (shareID).
func (l *loadShare) routed(key, worker string, req route.Request, cached int) {
	if l != nil {
		l.share.Routed(shareID(key), worker, req, cached)
	}
}

func (l *loadShare) finished(key string, firstToken bool) {
	switch {
	case l == nil:
	case firstToken:
		l.share.FirstToken(shareID(key))
	default:
		l.share.Finished(shareID(key))
	}
}

// LoadShareStats reports what load sharing did (false without Options.LoadShare).
func (s *Server) LoadShareStats() (fabric.LoadShareStats, bool) {
	if s.routing.share == nil {
		return fabric.LoadShareStats{}, false
	}
	return s.routing.share.share.Stats(), true
}
