package natstest

import (
	"context"
	"os"
	"path/filepath"
	"regexp"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestJetStreamSurvivesRestart: a JetStream server takes a stream and a message, and
// after Restart it listens on the same port with the message still in its store.
func TestJetStreamSurvivesRestart(t *testing.T) {
	s := Start(t, Options{JetStream: true})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	js := jetStream(t, s.URL())
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "S", Subjects: []string{"s.>"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := js.Publish(ctx, "s.a", []byte("kept")); err != nil {
		t.Fatal(err)
	}
	port := s.Port()
	s.Restart()
	if s.Port() != port {
		t.Fatalf("port %d after restart, was %d", s.Port(), port)
	}
	st, err := jetStream(t, s.URL()).Stream(ctx, "S")
	if err != nil {
		t.Fatal(err)
	}
	msg, err := st.GetMsg(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	if string(msg.Data) != "kept" {
		t.Fatalf("message %q after restart", msg.Data)
	}
}

// jetStream connects to url, closed when the test ends.
func jetStream(t *testing.T, url string) jetstream.JetStream {
	t.Helper()
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return js
}

// TestTokenRequired: a server with a token refuses a client without it and takes one
// with it; after Stop nothing listens.
func TestTokenRequired(t *testing.T) {
	s := Start(t, Options{Token: "t0ken"})
	if nc, err := nats.Connect(s.URL(), nats.Timeout(5*time.Second)); err == nil {
		nc.Close()
		t.Fatal("connected without the token")
	}
	nc, err := nats.Connect(s.URL(), nats.Token("t0ken"))
	if err != nil {
		t.Fatal(err)
	}
	nc.Close()
	s.Stop()
	if nc, err := nats.Connect(s.URL(), nats.Timeout(2*time.Second), nats.MaxReconnects(0)); err == nil {
		nc.Close()
		t.Fatal("connected after Stop")
	}
}

// TestOtherVersionRefused: a binary that reports another version is not used.
func TestOtherVersionRefused(t *testing.T) {
	dir := t.TempDir()
	fake := filepath.Join(dir, "nats-server")
	if err := os.WriteFile(fake, []byte("#!/bin/sh\necho 'nats-server: v2.9.10'\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := checkVersion(fake); err == nil {
		t.Fatal("v2.9.10 accepted")
	}
	if err := checkVersion(Binary(t)); err != nil {
		t.Fatalf("the binary found: %v", err)
	}
}

// TestMakefilePinsVersion: the Makefile installs the Version the tests expect.
func TestMakefilePinsVersion(t *testing.T) {
	mk, err := os.ReadFile("../../Makefile")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^NATS_SERVER_VERSION\s*:=\s*(\S+)`).FindSubmatch(mk)
	if m == nil || string(m[1]) != Version {
		t.Fatalf("Makefile NATS_SERVER_VERSION %q, natstest.Version %q", m, Version)
	}
}
