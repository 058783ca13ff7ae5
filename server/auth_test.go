package server_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"io"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/kvindex/kvindex/api/kvindexv1"
	kvclient "github.com/kvindex/kvindex/client"
	"github.com/kvindex/kvindex/engine"
	"github.com/kvindex/kvindex/server"
)

// testPKI is a CA and the PEM files of a server and a client certificate it signed.
type testPKI struct {
	dir                       string
	caFile, certFile, keyFile string
	clientCert                tls.Certificate
	pool                      *x509.CertPool
}

func newPKI(t *testing.T) *testPKI {
	t.Helper()
	p := &testPKI{dir: t.TempDir()}
	caKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	ca := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test CA"}, IsCA: true,
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign}
	caDER, err := x509.CreateCertificate(rand.Reader, ca, ca, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	caCert, _ := x509.ParseCertificate(caDER)
	p.pool = x509.NewCertPool()
	p.pool.AddCert(caCert)
	write := func(name, typ string, der []byte) string {
		path := filepath.Join(p.dir, name)
		if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
			t.Fatal(err)
		}
		return path
	}
	p.caFile = write("ca.pem", "CERTIFICATE", caDER)
	leaf := func(serial int64, usage x509.ExtKeyUsage) ([]byte, *ecdsa.PrivateKey) {
		key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		tmpl := &x509.Certificate{SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: "localhost"},
			DNSNames: []string{"localhost"}, IPAddresses: []net.IP{net.ParseIP("127.0.0.1")},
			NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), ExtKeyUsage: []x509.ExtKeyUsage{usage}}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, caCert, &key.PublicKey, caKey)
		if err != nil {
			t.Fatal(err)
		}
		return der, key
	}
	sDER, sKey := leaf(2, x509.ExtKeyUsageServerAuth)
	p.certFile = write("server.pem", "CERTIFICATE", sDER)
	kb, _ := x509.MarshalECPrivateKey(sKey)
	p.keyFile = write("server-key.pem", "EC PRIVATE KEY", kb)
	cDER, cKey := leaf(3, x509.ExtKeyUsageClientAuth)
	p.clientCert = tls.Certificate{Certificate: [][]byte{cDER}, PrivateKey: cKey}
	return p
}

const testToken = "a-bearer-token-of-some-length"

// startAuth starts a server with auth over TLS on loopback, gRPC too.
func startAuth(t *testing.T, auth server.AuthConfig) *server.Server {
	t.Helper()
	index, err := engine.New(engine.Config{Shards: 1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { index.Close() })
	s, err := server.New(server.Config{Listen: "127.0.0.1:0", Models: map[string]int{"m": 4},
		GRPC: server.GRPCConfig{Listen: "127.0.0.1:0"}, Auth: auth}, server.Options{Index: index})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Shutdown(context.Background()) })
	return s
}

// TestBearerTokenOverTLS: with a token file and TLS, HTTP and gRPC serve TLS only and
// refuse calls without the token (401, UNAUTHENTICATED, counted), probes excepted.
func TestBearerTokenOverTLS(t *testing.T) {
	pki := newPKI(t)
	tokens := filepath.Join(pki.dir, "tokens")
	if err := os.WriteFile(tokens, []byte("# comment\n"+testToken+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	s := startAuth(t, server.AuthConfig{TLSCertFile: pki.certFile, TLSKeyFile: pki.keyFile, TokenFile: tokens})
	tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pki.pool}}
	defer tr.CloseIdleConnections()
	hc := &http.Client{Transport: tr, Timeout: 5 * time.Second}
	get := func(path, token string) int {
		t.Helper()
		req, _ := http.NewRequest("GET", "https://"+s.Addr()+path, nil)
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	for _, c := range []struct {
		path, token string
		want        int
	}{
		{"/v1/workers", "", 401}, {"/v1/workers", "wrong-token-of-some-length", 401}, {"/metrics", "", 401},
		{"/v1/workers", testToken, 200}, {"/healthz", "", 200}, {"/readyz", "", 200},
	} {
		if got := get(c.path, c.token); got != c.want {
			t.Errorf("GET %s with token %q: %d, want %d", c.path, c.token, got, c.want)
		}
	}
	if resp, err := (&http.Client{Timeout: 5 * time.Second}).Get("http://" + s.Addr() + "/healthz"); err == nil {
		resp.Body.Close()
		if resp.StatusCode == 200 {
			t.Fatal("plaintext HTTP served beside TLS")
		}
	}

	conn, err := grpc.NewClient(s.GRPCAddr(), grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{RootCAs: pki.pool})))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	idx := kvindexv1.NewIndexClient(conn)
	ctx := context.Background()
	if _, err := idx.Workers(ctx, &kvindexv1.WorkersRequest{}); status.Code(err) != codes.Unauthenticated {
		t.Fatalf("gRPC without a token: %v", err)
	}
	if _, err := idx.Workers(metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+testToken), &kvindexv1.WorkersRequest{}); err != nil {
		t.Fatalf("gRPC with the token: %v", err)
	}
	if _, err := grpc_health_v1.NewHealthClient(conn).Check(ctx, &grpc_health_v1.HealthCheckRequest{}); err != nil {
		t.Fatalf("health without a token: %v", err)
	}
	c := &http.Client{Transport: tr}
	req, _ := http.NewRequest("GET", "https://"+s.Addr()+"/metrics", nil)
	req.Header.Set("Authorization", "Bearer "+testToken)
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	_, _ = io.Copy(&b, resp.Body)
	resp.Body.Close()
	for _, want := range []string{`kvindex_auth_failures_total{api="http"} 3`, `kvindex_auth_failures_total{api="grpc"} 1`} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("metrics lack %s", want)
		}
	}
}

// TestMutualTLS: with a client CA, a client without a certificate signed by it gets no
// connection, one with a certificate is served.
func TestMutualTLS(t *testing.T) {
	pki := newPKI(t)
	s := startAuth(t, server.AuthConfig{TLSCertFile: pki.certFile, TLSKeyFile: pki.keyFile, ClientCAFile: pki.caFile})
	try := func(certs []tls.Certificate) error {
		tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pki.pool, Certificates: certs}}
		defer tr.CloseIdleConnections()
		resp, err := (&http.Client{Transport: tr, Timeout: 5 * time.Second}).Get("https://" + s.Addr() + "/v1/workers")
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != 200 {
			return errors.New(resp.Status)
		}
		return nil
	}
	if err := try(nil); err == nil {
		t.Fatal("served without a client certificate")
	}
	if err := try([]tls.Certificate{pki.clientCert}); err != nil {
		t.Fatalf("with a client certificate: %v", err)
	}
	conn, err := grpc.NewClient(s.GRPCAddr(), grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{RootCAs: pki.pool, Certificates: []tls.Certificate{pki.clientCert}})))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := kvindexv1.NewIndexClient(conn).Workers(context.Background(), &kvindexv1.WorkersRequest{}); err != nil {
		t.Fatalf("gRPC with a client certificate: %v", err)
	}
}

// TestRefusesUnauthenticatedNonLoopback: a server on a non-loopback address that
// authenticates nobody refuses to start (before, anyone who could reach the port could
// query, record predictions and change engines), unless allow_unauthenticated says so;
// on loopback nothing changes.
func TestRefusesUnauthenticatedNonLoopback(t *testing.T) {
	for _, c := range []struct {
		cfg  server.Config
		want error
	}{
		{server.Config{Listen: "0.0.0.0:0"}, server.ErrUnauthenticatedListen},
		{server.Config{Listen: "127.0.0.1:0", GRPC: server.GRPCConfig{Listen: "[::]:0"}}, server.ErrUnauthenticatedListen},
		{server.Config{Listen: "0.0.0.0:0", Auth: server.AuthConfig{AllowUnauthenticated: true}}, nil},
		{server.Config{Listen: "127.0.0.1:0", GRPC: server.GRPCConfig{Listen: "localhost:0"}}, nil},
	} {
		c.cfg.Models = map[string]int{"m": 4}
		s, err := server.New(c.cfg, server.Options{})
		if err != nil {
			t.Fatal(err)
		}
		err = s.Start()
		s.Shutdown(context.Background())
		if !errors.Is(err, c.want) {
			t.Errorf("%+v / %+v: Start: %v, want %v", c.cfg.Listen, c.cfg.GRPC.Listen, err, c.want)
		}
	}
	for _, a := range []server.AuthConfig{{TLSCertFile: "x"}, {ClientCAFile: "ca"}, {TokenFile: "/does/not/exist"}} {
		if _, err := server.New(server.Config{Listen: "127.0.0.1:0", Models: map[string]int{"m": 4}, Auth: a}, server.Options{}); !errors.Is(err, server.ErrConfig) {
			t.Errorf("auth %+v: %v, want ErrConfig", a, err)
		}
	}
}

// TestClientBearerToken: package client's BearerToken authenticates a gRPC client.
func TestClientBearerToken(t *testing.T) {
	pki := newPKI(t)
	tokens := filepath.Join(pki.dir, "tokens")
	if err := os.WriteFile(tokens, []byte(testToken+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	s := startAuth(t, server.AuthConfig{TLSCertFile: pki.certFile, TLSKeyFile: pki.keyFile, TokenFile: tokens})
	tlsOpt := grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{RootCAs: pki.pool}))
	for _, c := range []struct {
		opts []grpc.DialOption
		want codes.Code
	}{{[]grpc.DialOption{tlsOpt}, codes.Unauthenticated}, {[]grpc.DialOption{tlsOpt, kvclient.BearerToken(testToken)}, codes.OK}} {
		cl, err := kvclient.Dial(s.GRPCAddr(), c.opts...)
		if err != nil {
			t.Fatal(err)
		}
		_, err = cl.Workers(context.Background())
		cl.Close()
		if status.Code(err) != c.want {
			t.Fatalf("Workers: %v, want %v", err, c.want)
		}
	}
}

// TestProbesUnderMutualTLS (issue 33, row 15): with mutual TLS, /healthz and /readyz were
// unreachable without a client certificate (orchestrators' probes carry none), though
// the docs said they stayed open. Now probe_listen serves them, and nothing else, in
// plain HTTP, while the API still refuses a client without a certificate.
func TestProbesUnderMutualTLS(t *testing.T) {
	pki := newPKI(t)
	index, err := engine.New(engine.Config{Shards: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer index.Close()
	s, _ := startWith(t, server.Config{Listen: "127.0.0.1:0", ProbeListen: "127.0.0.1:0", Models: map[string]int{"m": 4},
		Auth: server.AuthConfig{TLSCertFile: pki.certFile, TLSKeyFile: pki.keyFile, ClientCAFile: pki.caFile}}, server.Options{Index: index})
	tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pki.pool}}
	defer tr.CloseIdleConnections()
	if resp, err := (&http.Client{Transport: tr, Timeout: 5 * time.Second}).Get("https://" + s.Addr() + "/healthz"); err == nil {
		resp.Body.Close()
		t.Fatal("the API served a probe without a client certificate")
	}
	for path, want := range map[string]int{"/healthz": 200, "/readyz": 200, "/v1/workers": 404, "/metrics": 404} {
		resp, err := http.Get("http://" + s.ProbeAddr() + path)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != want {
			t.Errorf("probe listener %s: %d, want %d", path, resp.StatusCode, want)
		}
	}
}
