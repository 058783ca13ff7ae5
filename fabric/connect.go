package fabric

import (
	"errors"
	"fmt"
	"os"
	"strings"

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
