package fabric

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
)

// NATSAuth is how a relay or a replica authenticates to NATS and secures the connection.
// Every secret comes from a file (a command line shows in ps): a .creds file (a user JWT
// and its nkey seed, from nsc or a NATS operator), a bare nkey seed, a user name with a
// password file, or a token file; at most one of them. TLS (CAFile, and CertFile with
// KeyFile for a client certificate) goes with any. The zero value connects as before:
// no credentials, the URL's scheme decides TLS.
type NATSAuth struct {
	CredsFile    string
	NKeyFile     string
	User         string
	PasswordFile string
	TokenFile    string
	CAFile       string
	CertFile     string
	KeyFile      string
}

// maxSecretBytes bounds a password or token file.
const maxSecretBytes = 4096

// Options returns the nats.Options that apply a, or an error naming what is wrong.
func (a NATSAuth) Options() ([]nats.Option, error) {
	n := 0
	for _, set := range []bool{a.CredsFile != "", a.NKeyFile != "", a.User != "" || a.PasswordFile != "", a.TokenFile != ""} {
		if set {
			n++
		}
	}
	switch {
	case n > 1:
		return nil, errors.New("fabric: NATS credentials: give one of a creds file, an nkey seed file, a user and password file, a token file")
	case (a.User == "") != (a.PasswordFile == ""):
		return nil, errors.New("fabric: NATS credentials: a user and its password file go together")
	case (a.CertFile == "") != (a.KeyFile == ""):
		return nil, errors.New("fabric: NATS TLS: a client certificate and its key go together")
	}
	var opts []nats.Option
	switch {
	case a.CredsFile != "":
		if _, err := os.Stat(a.CredsFile); err != nil {
			return nil, fmt.Errorf("fabric: NATS creds file: %w", err)
		}
		opts = append(opts, nats.UserCredentials(a.CredsFile))
	case a.NKeyFile != "":
		o, err := nats.NkeyOptionFromSeed(a.NKeyFile)
		if err != nil {
			return nil, fmt.Errorf("fabric: NATS nkey seed file: %w", err)
		}
		opts = append(opts, o)
	case a.User != "":
		pw, err := readSecret(a.PasswordFile)
		if err != nil {
			return nil, err
		}
		opts = append(opts, nats.UserInfo(a.User, pw))
	case a.TokenFile != "":
		tok, err := readSecret(a.TokenFile)
		if err != nil {
			return nil, err
		}
		opts = append(opts, nats.Token(tok))
	}
	if a.CAFile != "" {
		opts = append(opts, nats.RootCAs(a.CAFile))
	}
	if a.CertFile != "" {
		opts = append(opts, nats.ClientCert(a.CertFile, a.KeyFile))
	}
	return opts, nil
}

// readSecret reads a one-line secret file (a trailing newline is not part of it).
func readSecret(path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("fabric: NATS secret: %w", err)
	}
	s := strings.TrimRight(string(b), "\r\n")
	if s == "" || len(s) > maxSecretBytes || strings.ContainsAny(s, "\r\n") {
		return "", fmt.Errorf("fabric: NATS secret %s: want one line of 1 to %d bytes", path, maxSecretBytes)
	}
	return s, nil
}

// DefaultConnectTimeout bounds how long Dial keeps trying by default: long enough for
// a NATS server started beside the process, short enough that a wrong URL is reported
// at once rather than waited on.
const DefaultConnectTimeout = 10 * time.Second

// Dial connects to the NATS server at url as name (the client name the server's
// monitoring shows), trying until it answers or timeout (0: DefaultConnectTimeout)
// passes, backing off from 100 ms to 2 s between attempts. The connection returned
// reconnects by itself for as long as the process runs; opts (NATSAuth.Options) come
// after the defaults. A server that is down at start is a configuration error far more
// often than a transient one, so the error names the URL, the attempts and the last
// reason, and the caller exits instead of waiting silently. It is the one place kvindex
// dials NATS (the relay and serve's replica feed both call it).
func Dial(ctx context.Context, url, name string, timeout time.Duration, log *slog.Logger, opts ...nats.Option) (*nats.Conn, error) {
	if timeout <= 0 {
		timeout = DefaultConnectTimeout
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	start := time.Now()
	deadline := start.Add(timeout)
	wait := 100 * time.Millisecond
	for attempt := 1; ; attempt++ {
		dial := min(2*time.Second, max(time.Until(deadline), 100*time.Millisecond))
		nc, err := nats.Connect(url, append([]nats.Option{nats.Name(name), nats.Timeout(dial), nats.MaxReconnects(-1),
			nats.ReconnectWait(250 * time.Millisecond)}, opts...)...)
		if err == nil {
			return nc, nil
		}
		if time.Now().Add(wait).After(deadline) || ctx.Err() != nil {
			return nil, fmt.Errorf("fabric: no NATS server at %s after %d attempts in %v: %w", url, attempt, time.Since(start).Round(time.Millisecond), err)
		}
		log.Warn("NATS not reachable; retrying", "url", url, "attempt", attempt, "err", err, "wait", wait)
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
		case <-t.C:
		}
		wait = min(2*wait, 2*time.Second)
	}
}

// ConnState names a connection's state for health endpoints ("connected",
// "reconnecting", "connecting", "closed", "draining", "disconnected").
func ConnState(nc *nats.Conn) string {
	switch nc.Status() {
	case nats.CONNECTED:
		return "connected"
	case nats.RECONNECTING:
		return "reconnecting"
	case nats.CONNECTING:
		return "connecting"
	case nats.CLOSED:
		return "closed"
	case nats.DRAINING_PUBS, nats.DRAINING_SUBS:
		return "draining"
	}
	return "disconnected"
}
