package server

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"strings"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/kvindex/kvindex/server/internal/guard"
)

// Access control. The HTTP and gRPC APIs may serve TLS (auth.tls_cert_file,
// auth.tls_key_file) and authenticate their clients by a bearer token (auth.token_file:
// "Authorization: Bearer TOKEN" over HTTP, the same "authorization" metadata over gRPC)
// or by a client certificate (auth.client_ca_file: mutual TLS), or both. Off by
// default, so that a server on loopback works as it always has; but a server whose HTTP
// or gRPC address is not a loopback one refuses to start unless it authenticates its
// clients or auth.allow_unauthenticated says to serve anyone who can reach the port
// (behind a proxy that does, say). /healthz, /readyz and the gRPC health service need
// no token (probes carry none); everything else, /metrics included, needs them. With
// mutual TLS no request gets past the handshake without a client certificate, probes'
// included: Config.ProbeListen serves the two probes on a plain listener of their own
// (probes.go). With authentication on, the admin role's endpoints (adminPath) need an
// admin token (auth.admin_token_file); without one configured they are closed.
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
	// AdminTokenFile holds the admin role's bearer tokens (the token file's format):
	// the engines API (/v1/engines), /register, /unregister and a worker's resync need
	// one when clients are authenticated (token_file or client_ca_file); without it
	// they are refused (403) to every client. An admin token is a query token too.
	AdminTokenFile string `json:"admin_token_file,omitempty"`
	// AllowUnauthenticated lets a server listening on a non-loopback address start
	// without authenticating its clients.
	AllowUnauthenticated bool `json:"allow_unauthenticated,omitempty"`
}

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
	case a.AdminTokenFile != "" && !a.authenticates():
		return bad("admin_token_file needs token_file or client_ca_file (the query role's credentials)")
	}
	return nil
}

// authenticates reports whether clients are authenticated (a token or a certificate).
func (a AuthConfig) authenticates() bool { return a.TokenFile != "" || a.ClientCAFile != "" }

// access is the server's loaded access control: TLS configuration and token digests.
type access struct {
	tls *tls.Config // nil: plaintext
	on  bool        // clients are authenticated (AuthConfig.authenticates)
	// The token files' tokens, swapped whole by reload (a SIGHUP re-reads the files):
	// nil when the file is not configured; admin nil: no admin token (see adminPath).
	tokens, admin atomic.Pointer[guard.Tokens]
	files         AuthConfig             // the files read
	failures      *prometheus.CounterVec // api
}

// newAccess reads the auth configuration's files.
func newAccess(a AuthConfig) (*access, error) {
	acc := &access{on: a.authenticates(), failures: prometheus.NewCounterVec(prometheus.CounterOpts{
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
	acc.files = a
	if err := acc.reload(); err != nil {
		return nil, err
	}
	return acc, nil
}

// reload reads the token files again and swaps in their tokens, both or neither: a
// file that no longer reads leaves the tokens as they were.
func (acc *access) reload() error {
	var toks, admin *guard.Tokens
	var err error
	if f := acc.files.TokenFile; f != "" {
		if toks, err = guard.ReadTokens(f); err != nil {
			return fmt.Errorf("%w: auth.token_file: %w", ErrConfig, err)
		}
	}
	if f := acc.files.AdminTokenFile; f != "" {
		if admin, err = guard.ReadTokens(f); err != nil {
			return fmt.Errorf("%w: auth.admin_token_file: %w", ErrConfig, err)
		}
	}
	acc.tokens.Store(toks)
	acc.admin.Store(admin)
	return nil
}

// openPath reports whether an HTTP path is served without credentials.
func openPath(p string) bool { return p == "/healthz" || p == "/readyz" }

// adminPath reports whether an HTTP request is the admin role's: the engines API, the
// Mooncake registration endpoints and a worker's resync.
func adminPath(p string) bool {
	return p == "/v1/engines" || strings.HasPrefix(p, "/v1/engines/") || p == "/register" || p == "/unregister" ||
		strings.HasPrefix(p, "/v1/workers/") && strings.HasSuffix(p, "/resync")
}

// httpHandler checks every request's credentials but the probes', and then marks its
// connection authenticated (marked). A client certificate was checked by the TLS
// handshake already. With authentication on, the admin role's requests need an admin
// token (403 without one, whatever query credentials they carry).
func (acc *access) httpHandler(h http.Handler, marked func(*http.Request)) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if openPath(r.URL.Path) {
			if !acc.on {
				marked(r)
			}
			h.ServeHTTP(w, r)
			return
		}
		cred := r.Header.Get("Authorization")
		toks, admins := acc.tokens.Load(), acc.admin.Load()
		admin := admins.Bearer(cred)
		if toks != nil && !admin && !toks.Bearer(cred) {
			acc.failures.WithLabelValues("http").Inc()
			w.Header().Set("WWW-Authenticate", `Bearer realm="kvindex"`)
			writeError(w, http.StatusUnauthorized, "unauthenticated", "missing or wrong bearer token")
			return
		}
		marked(r)
		if acc.on {
			r = r.WithContext(withOwner(r.Context(), acc.httpOwner(r, cred)))
		}
		if acc.on && !admin && adminPath(r.URL.Path) {
			acc.failures.WithLabelValues("http").Inc()
			msg := "this endpoint is the admin role's: send an admin token (auth.admin_token_file)"
			if admins == nil {
				msg = "this endpoint is the admin role's and no admin token is configured (auth.admin_token_file)"
			}
			writeError(w, http.StatusForbidden, "forbidden", "%s", msg)
			return
		}
		h.ServeHTTP(w, r)
	})
}

// grpcCheck checks a gRPC call's credentials from its header (the transport's tap,
// before anything is reserved for it).
func (acc *access) grpcCheck(md metadata.MD) error {
	toks, admins := acc.tokens.Load(), acc.admin.Load()
	if toks == nil {
		return nil
	}
	for _, v := range md.Get("authorization") {
		if toks.Bearer(v) || admins.Bearer(v) {
			return nil
		}
	}
	acc.failures.WithLabelValues("grpc").Inc()
	return status.Error(codes.Unauthenticated, "missing or wrong bearer token")
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
