package server

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// Access control. The HTTP and gRPC APIs may serve TLS (auth.tls_cert_file,
// auth.tls_key_file) and authenticate their clients by a bearer token (auth.token_file:
// "Authorization: Bearer TOKEN" over HTTP, the same "authorization" metadata over gRPC)
// or by a client certificate (auth.client_ca_file: mutual TLS), or both. Off by
// default, so that a server on loopback works as it always has; but a server whose HTTP
// or gRPC address is not a loopback one refuses to start unless it authenticates its
// clients or auth.allow_unauthenticated says to serve anyone who can reach the port
// (behind a proxy that does, say). /healthz, /readyz and the gRPC health service stay
// open (probes carry no credentials); everything else, /metrics included, needs them.
// A refused call is 401 (UNAUTHENTICATED) and counted in kvindex_auth_failures_total.
// Tokens are compared in constant time (as SHA-256 digests, so their lengths do not show
// either).

// AuthConfig configures TLS and client authentication for the HTTP and gRPC APIs.
type AuthConfig struct {
	// TLSCertFile and TLSKeyFile are the server's certificate chain and key (PEM):
	// both APIs then serve TLS only. Both or neither.
	TLSCertFile string `json:"tls_cert_file,omitempty"`
	TLSKeyFile  string `json:"tls_key_file,omitempty"`
	// ClientCAFile (PEM) makes the APIs require a client certificate signed by one of
	// its CAs (mutual TLS); it needs TLS.
	ClientCAFile string `json:"client_ca_file,omitempty"`
	// TokenFile holds the accepted bearer tokens, one a line (blank lines and lines
	// starting with '#' ignored; at most 1,024 tokens, each 16 to 4,096 bytes). Sent
	// without TLS, a token travels in clear: give TLS too unless the network is trusted.
	TokenFile string `json:"token_file,omitempty"`
	// AllowUnauthenticated lets a server listening on a non-loopback address start
	// without authenticating its clients.
	AllowUnauthenticated bool `json:"allow_unauthenticated,omitempty"`
}

// Bounds of a token file.
const (
	maxTokens     = 1024
	minTokenBytes = 16
	maxTokenBytes = 4096
)

// ErrUnauthenticatedListen refuses to serve clients nobody authenticates on an
// address others can reach.
var ErrUnauthenticatedListen = errors.New("server: refusing to serve unauthenticated on a non-loopback address (set auth.token_file or auth.client_ca_file, or auth.allow_unauthenticated)")

// validate checks the files are given in usable combinations (their content is read by
// New).
func (a AuthConfig) validate() error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: auth.%s", ErrConfig, fmt.Sprintf(format, args...))
	}
	switch {
	case (a.TLSCertFile == "") != (a.TLSKeyFile == ""):
		return bad("tls_cert_file and tls_key_file go together")
	case a.ClientCAFile != "" && a.TLSCertFile == "":
		return bad("client_ca_file needs tls_cert_file and tls_key_file")
	}
	return nil
}

// authenticates reports whether clients are authenticated (a token or a certificate).
func (a AuthConfig) authenticates() bool { return a.TokenFile != "" || a.ClientCAFile != "" }

// access is the server's loaded access control: TLS configuration and token digests.
type access struct {
	tls      *tls.Config // nil: plaintext
	tokens   [][sha256.Size]byte
	failures *prometheus.CounterVec // api
}

// newAccess reads the auth configuration's files.
func newAccess(a AuthConfig) (*access, error) {
	acc := &access{failures: prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "kvindex_auth_failures_total",
		Help: "Calls refused for missing or wrong credentials, by API (http, grpc).",
	}, []string{"api"})}
	if a.TLSCertFile != "" {
		cert, err := tls.LoadX509KeyPair(a.TLSCertFile, a.TLSKeyFile)
		if err != nil {
			return nil, fmt.Errorf("%w: auth: %v", ErrConfig, err)
		}
		acc.tls = &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
		if a.ClientCAFile != "" {
			pem, err := os.ReadFile(a.ClientCAFile)
			if err != nil {
				return nil, fmt.Errorf("%w: auth.client_ca_file: %v", ErrConfig, err)
			}
			pool := x509.NewCertPool()
			if !pool.AppendCertsFromPEM(pem) {
				return nil, fmt.Errorf("%w: auth.client_ca_file %s: no PEM certificate", ErrConfig, a.ClientCAFile)
			}
			acc.tls.ClientCAs, acc.tls.ClientAuth = pool, tls.RequireAndVerifyClientCert
		}
	}
	if a.TokenFile != "" {
		toks, err := readTokens(a.TokenFile)
		if err != nil {
			return nil, fmt.Errorf("%w: auth.token_file: %v", ErrConfig, err)
		}
		for _, t := range toks {
			acc.tokens = append(acc.tokens, sha256.Sum256([]byte(t)))
		}
	}
	return acc, nil
}

// readTokens reads a token file.
func readTokens(path string) ([]string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var out []string
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(make([]byte, 0, 64<<10), maxTokenBytes+2)
	for sc.Scan() {
		t := strings.TrimSpace(sc.Text())
		if t == "" || strings.HasPrefix(t, "#") {
			continue
		}
		switch {
		case len(t) < minTokenBytes || len(t) > maxTokenBytes:
			return nil, fmt.Errorf("%s: a token of %d bytes (want %d to %d)", path, len(t), minTokenBytes, maxTokenBytes)
		case len(out) == maxTokens:
			return nil, fmt.Errorf("%s: more than %d tokens", path, maxTokens)
		}
		out = append(out, t)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("%s: %v", path, err)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%s: no token", path)
	}
	return out, nil
}

// tokenOK reports whether the bearer credential v ("Bearer TOKEN") names a token.
func (acc *access) tokenOK(v string) bool {
	tok, ok := strings.CutPrefix(v, "Bearer ")
	if !ok {
		return false
	}
	d := sha256.Sum256([]byte(tok))
	found := 0
	for i := range acc.tokens {
		found |= subtle.ConstantTimeCompare(d[:], acc.tokens[i][:])
	}
	return found == 1
}

// openPath reports whether an HTTP path is served without credentials.
func openPath(p string) bool { return p == "/healthz" || p == "/readyz" }

// httpHandler checks every request's credentials but the probes'. A client certificate
// was checked by the TLS handshake already.
func (acc *access) httpHandler(h http.Handler) http.Handler {
	if len(acc.tokens) == 0 {
		return h
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !openPath(r.URL.Path) && !acc.tokenOK(r.Header.Get("Authorization")) {
			acc.failures.WithLabelValues("http").Inc()
			w.Header().Set("WWW-Authenticate", `Bearer realm="kvindex"`)
			writeError(w, http.StatusUnauthorized, "unauthenticated", "missing or wrong bearer token")
			return
		}
		h.ServeHTTP(w, r)
	})
}

// grpcUnary checks every call's credentials but the health service's.
func (acc *access) grpcUnary(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
	if len(acc.tokens) > 0 && !strings.HasPrefix(info.FullMethod, "/grpc.health.v1.Health/") {
		md, _ := metadata.FromIncomingContext(ctx)
		ok := false
		for _, v := range md.Get("authorization") {
			ok = ok || acc.tokenOK(v)
		}
		if !ok {
			acc.failures.WithLabelValues("grpc").Inc()
			return nil, status.Error(codes.Unauthenticated, "missing or wrong bearer token")
		}
	}
	return h(ctx, req)
}

// checkListener is checkListen for a listener the caller gave: only a TCP one is checked
// (an in-memory or Unix socket one is not reachable over the network).
func checkListener(a AuthConfig, ln net.Listener) error {
	if ln == nil {
		return nil
	}
	switch ln.Addr().Network() {
	case "tcp", "tcp4", "tcp6":
		return checkListen(a, ln.Addr().String())
	}
	return nil
}

// checkListen refuses an address (HOST:PORT) that is not loopback when nobody is
// authenticated. A host name counts as loopback only if it is "localhost".
func checkListen(a AuthConfig, addr string) error {
	if a.authenticates() || a.AllowUnauthenticated || addr == "" {
		return nil
	}
	host := addr
	if h, _, err := net.SplitHostPort(addr); err == nil {
		host = h
	}
	if ip := net.ParseIP(host); ip != nil && ip.IsLoopback() || host == "localhost" {
		return nil
	}
	return fmt.Errorf("%w: %s", ErrUnauthenticatedListen, addr)
}
