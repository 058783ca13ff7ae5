// Package client is a small Go client of kvindex serve's gRPC API (package
// kvindexv1, api/kvindexv1/kvindex.proto): which workers hold the longest cached prefix
// of a request, the followed workers, and health.
//
// # First use
//
//	c, err := client.Dial("127.0.0.1:9090") // kvindex serve --grpc 127.0.0.1:9090
//	defer c.Close()
//	resp, err := c.MatchTokens(ctx, "llama-3-8b", tokenIDs)
//	// resp.Pick.Worker is where to route; resp.Matches lists every holder, best
//	// first (weighted score, then score), each with its per-tier lengths (Tiers:
//	// device, device or host, any tier) and weighted score.
//
// Match sends a MatchRequest as it is: its TierWeights (device, host, disk, each in
// [0, 1]) override the server's tier weights for that request.
//
// A Client is safe for concurrent use; share one per server. Dial uses plaintext unless
// given options: a server with TLS (serve --tls-cert) takes
// grpc.WithTransportCredentials(credentials.NewTLS(...)), one that checks bearer tokens
// (serve --auth-token-file) BearerToken too:
//
//	c, err := client.Dial("kvindex:9090",
//		grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{RootCAs: pool})),
//		client.BearerToken(token))
package client

import (
	"context"
	"fmt"
	"math"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health/grpc_health_v1"

	"github.com/kvindex/kvindex/api/kvindexv1"
)

// ServiceName is the service whose health is the server's readiness.
const ServiceName = "kvindex.v1.Index"

// Client calls one kvindex server.
type Client struct {
	conn   *grpc.ClientConn // nil when built by New
	index  kvindexv1.IndexClient
	health grpc_health_v1.HealthClient
}

// Dial returns a Client of the server at target ("host:port", or any grpc target).
// Without options it connects in plaintext; it dials lazily, on the first call.
func Dial(target string, opts ...grpc.DialOption) (*Client, error) {
	if len(opts) == 0 {
		opts = []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}
	}
	conn, err := grpc.NewClient(target, opts...)
	if err != nil {
		return nil, fmt.Errorf("client: %w", err)
	}
	c := New(conn)
	c.conn = conn
	return c, nil
}

// BearerToken sends token with every call ("authorization: Bearer TOKEN" metadata, as
// kvindex serve --auth-token-file checks); grpc-go refuses it over a plaintext
// connection, where it would travel in clear.
func BearerToken(token string) grpc.DialOption {
	return grpc.WithPerRPCCredentials(tokenCreds{token: token, secure: true})
}

// BearerTokenInsecure is BearerToken over plaintext too: for loopback or a network that
// is trusted already.
func BearerTokenInsecure(token string) grpc.DialOption {
	return grpc.WithPerRPCCredentials(tokenCreds{token: token})
}

type tokenCreds struct {
	token  string
	secure bool
}

func (c tokenCreds) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	return map[string]string{"authorization": "Bearer " + c.token}, nil
}

func (c tokenCreds) RequireTransportSecurity() bool { return c.secure }

// New returns a Client on a connection the caller owns (Close does not close it).
func New(conn grpc.ClientConnInterface) *Client {
	return &Client{index: kvindexv1.NewIndexClient(conn), health: grpc_health_v1.NewHealthClient(conn)}
}

// Close closes the connection Dial opened.
func (c *Client) Close() error {
	if c.conn == nil {
		return nil
	}
	return c.conn.Close()
}

// Match sends one query as it is.
func (c *Client) Match(ctx context.Context, req *kvindexv1.MatchRequest, opts ...grpc.CallOption) (*kvindexv1.MatchResponse, error) {
	return c.index.Match(ctx, req, opts...)
}

// MatchTokens asks about a request's token ids; the server hashes them at the model's
// block size. model may be "" when the server serves one model.
func (c *Client) MatchTokens(ctx context.Context, model string, tokens []uint32) (*kvindexv1.MatchResponse, error) {
	return c.index.Match(ctx, &kvindexv1.MatchRequest{Model: model, Tokens: tokens})
}

// MatchHashes asks about a request already cut into content hashes (hash.Blocks at the
// model's block size): smaller messages, and the hashing stays on the router.
func (c *Client) MatchHashes(ctx context.Context, model string, content []uint64) (*kvindexv1.MatchResponse, error) {
	return c.index.Match(ctx, &kvindexv1.MatchRequest{Model: model, ContentHashes: content})
}

// Routed records that a request was sent to worker (as POST /v1/routed): the index
// counts the worker as holding the request's blocks until its events confirm or
// contradict it or ttl (0: the server's default) ends.
func (c *Client) Routed(ctx context.Context, model, worker string, content []uint64, ttl time.Duration) (*kvindexv1.RoutedResponse, error) {
	ms := ttl.Milliseconds()
	if ms < 0 || ms > math.MaxUint32 {
		ms = math.MaxUint32 // out of range: sent so the server rejects it, not wrapped into a valid ttl
	}
	return c.index.Routed(ctx, &kvindexv1.RoutedRequest{Model: model, Worker: worker, ContentHashes: content, TtlMs: uint32(ms)})
}

// Finished reports that a request the server picked a worker for (a Match with pick
// and a request id) got its first token (firstToken: its prefill is done) or is done,
// as POST /v1/finished does: the load policies stop counting it against its worker.
// known is false when the server was not tracking the request (already finished,
// expired, or never picked with that id) or, with firstToken, when its prefill was not
// outstanding (a full cache hit, or a first token already reported). An empty or malformed id is
// codes.InvalidArgument.
func (c *Client) Finished(ctx context.Context, requestID string, firstToken bool) (known bool, err error) {
	resp, err := c.index.Finished(ctx, &kvindexv1.FinishedRequest{RequestId: requestID, FirstToken: firstToken})
	if err != nil {
		return false, err
	}
	return resp.GetKnown(), nil
}

// Workers lists the workers the server follows.
func (c *Client) Workers(ctx context.Context) ([]*kvindexv1.Worker, error) {
	resp, err := c.index.Workers(ctx, &kvindexv1.WorkersRequest{})
	if err != nil {
		return nil, err
	}
	return resp.GetWorkers(), nil
}

// Live reports whether the server's index answers (its /healthz).
func (c *Client) Live(ctx context.Context) (bool, error) { return c.serving(ctx, "") }

// Ready reports whether every engine the server follows has synced (its /readyz).
func (c *Client) Ready(ctx context.Context) (bool, error) { return c.serving(ctx, ServiceName) }

func (c *Client) serving(ctx context.Context, service string) (bool, error) {
	resp, err := c.health.Check(ctx, &grpc_health_v1.HealthCheckRequest{Service: service})
	if err != nil {
		return false, err
	}
	return resp.GetStatus() == grpc_health_v1.HealthCheckResponse_SERVING, nil
}
