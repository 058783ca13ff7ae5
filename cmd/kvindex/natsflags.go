package main

import (
	"flag"

	"github.com/kvindex/kvindex/fabric"
)

// natsAuthFlags registers relay's and serve's NATS credential and TLS flags: every
// secret from a file, since a command line shows in ps (fabric.NATSAuth).
func natsAuthFlags(fs *flag.FlagSet) *fabric.NATSAuth {
	a := &fabric.NATSAuth{}
	fs.StringVar(&a.CredsFile, "nats-creds", "", "NATS user credentials file (a JWT and its nkey seed, from nsc)")
	fs.StringVar(&a.NKeyFile, "nats-nkey", "", "NATS nkey seed file")
	fs.StringVar(&a.User, "nats-user", "", "NATS user name (with --nats-password-file)")
	fs.StringVar(&a.PasswordFile, "nats-password-file", "", "file holding the --nats-user password")
	fs.StringVar(&a.TokenFile, "nats-token-file", "", "file holding a NATS authentication token")
	fs.StringVar(&a.CAFile, "nats-ca", "", "CA certificates (PEM) that sign the NATS server's (tls:// URLs)")
	fs.StringVar(&a.CertFile, "nats-cert", "", "client certificate (PEM) for a NATS server that verifies clients (with --nats-key)")
	fs.StringVar(&a.KeyFile, "nats-key", "", "the --nats-cert key (PEM)")
	return a
}
