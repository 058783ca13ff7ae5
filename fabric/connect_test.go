package fabric

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"

	"github.com/kvindex/kvindex/internal/natstest"
)

// authServer starts a NATS server (JetStream on) with o's authentication and returns
// its port.
func authServer(t *testing.T, o natstest.Options) int {
	t.Helper()
	o.JetStream = true
	return natstest.Start(t, o).Port()
}

func writeFile(t *testing.T, dir, name, content string) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// selfSigned writes a CA-signed certificate for 127.0.0.1 and returns the CA, cert and
// key file paths.
func selfSigned(t *testing.T, dir string) (ca, cert, key string) {
	t.Helper()
	caKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	caT := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "ca"}, IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign, NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour)}
	caDER, _ := x509.CreateCertificate(rand.Reader, caT, caT, &caKey.PublicKey, caKey)
	caCert, _ := x509.ParseCertificate(caDER)
	k, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	lt := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "127.0.0.1"}, IPAddresses: []net.IP{net.ParseIP("127.0.0.1")},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}, NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour)}
	der, _ := x509.CreateCertificate(rand.Reader, lt, caCert, &k.PublicKey, caKey)
	kb, _ := x509.MarshalECPrivateKey(k)
	pemOf := func(typ string, b []byte) string { return string(pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: b})) }
	return writeFile(t, dir, "ca.pem", pemOf("CERTIFICATE", caDER)), writeFile(t, dir, "cert.pem", pemOf("CERTIFICATE", der)),
		writeFile(t, dir, "key.pem", pemOf("EC PRIVATE KEY", kb))
}

// TestNATSAuth: a publisher and a replica reach a server that requires a user and
// password, a token, an nkey, or TLS, with credentials from files; without them the
// server refuses the connection. Secrets never come from the command line.
func TestNATSAuth(t *testing.T) {
	dir := t.TempDir()
	user, _ := nkeys.CreateUser()
	seed, _ := user.Seed()
	pub, _ := user.PublicKey()
	ca, cert, key := selfSigned(t, dir)
	for _, c := range []struct {
		name   string
		scheme string
		server natstest.Options
		auth   NATSAuth
	}{
		{"user", "nats", natstest.Options{User: "relay", Password: "s3cret-pass"},
			NATSAuth{User: "relay", PasswordFile: writeFile(t, dir, "pw", "s3cret-pass\n")}},
		{"token", "nats", natstest.Options{Token: "a-nats-token"},
			NATSAuth{TokenFile: writeFile(t, dir, "tok", "a-nats-token\n")}},
		{"nkey", "nats", natstest.Options{NKeys: []string{pub}},
			NATSAuth{NKeyFile: writeFile(t, dir, "seed", string(seed))}},
		{"tls", "tls", natstest.Options{TLSCert: cert, TLSKey: key}, NATSAuth{CAFile: ca}},
	} {
		t.Run(c.name, func(t *testing.T) {
			url := fmt.Sprintf("%s://127.0.0.1:%d", c.scheme, authServer(t, c.server))
			if nc, err := nats.Connect(url, nats.Timeout(2*time.Second)); err == nil {
				nc.Close()
				t.Fatal("connected without credentials")
			}
			opts, err := c.auth.Options()
			if err != nil {
				t.Fatal(err)
			}
			nc, err := nats.Connect(url, append(opts, nats.Timeout(5*time.Second))...)
			if err != nil {
				t.Fatalf("with credentials: %v", err)
			}
			defer nc.Close()
			ctx := testCtx(t)
			p := newPublisher(t, ctx, nc, PublisherConfig{Stream: StreamConfig{Memory: true}})
			h := randomHistory(40, 200)
			if _, err := PublishOps(ctx, p, testModel, h.ops); err != nil {
				t.Fatal(err)
			}
			r := newReplica(t, ctx, nc, ReplicaConfig{}, "")
			waitApplied(t, ctx, r, streamLast(t, ctx, nc, DefaultStream))
			checkModel(t, r.Engine(), h, h.model(len(h.ops)))
		})
	}
	for _, bad := range []NATSAuth{
		{User: "u"}, {PasswordFile: "p"}, {TokenFile: "t", NKeyFile: "n"}, {CertFile: "c"},
		{TokenFile: filepath.Join(dir, "missing")}, {TokenFile: writeFile(t, dir, "two", "a\nb\n")},
	} {
		if _, err := bad.Options(); err == nil {
			t.Errorf("%+v accepted", bad)
		}
	}
}
