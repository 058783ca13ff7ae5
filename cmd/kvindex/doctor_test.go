package main

import (
	"bytes"
	"context"
	"net"
	"strings"
	"testing"

	"github.com/kvindex/kvindex/internal/fakevllm"
	"github.com/kvindex/kvindex/subscriber/pubtest"
	"github.com/kvindex/kvindex/vllmhash"
)

// kvindex doctor against the Python test publisher on loopback: everything is published
// before the doctor starts, so it arrives through the catch-up replay right after the
// connection, whatever the timing; --for only bounds the run.

func startPub(t *testing.T) *pubtest.Publisher {
	t.Helper()
	pubtest.Require(t)
	p, err := pubtest.Start(pubtest.Options{Encoding: "array", Bind: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}

func doctor(t *testing.T, args ...string) (int, string) {
	t.Helper()
	var out, errb bytes.Buffer
	code := doctorMain(context.Background(), args, &out, &errb)
	t.Logf("kvindex doctor %s\n%s%s(exit %d)", strings.Join(args, " "), out.String(), errb.String(), code)
	return code, out.String()
}

func engineSpec(p *pubtest.Publisher, worker, extra string) string {
	return "endpoint=" + p.Ranks[0].Endpoint + ",replay=" + p.Ranks[0].ReplayEndpoint + ",worker=" + worker + ",model=llama,block_size=16" + extra
}

func blockTokens(n, salt int) []uint32 {
	t := make([]uint32, n)
	for i := range t {
		t[i] = uint32(1000*salt + i)
	}
	return t
}

func TestDoctorHealthy(t *testing.T) {
	p := startPub(t)
	toks := blockTokens(48, 1)
	d := vllmhash.Chain("0", nil, toks, 16, nil)
	root := pubtest.Event{Type: "BlockStored", BlockHashes: []uint64{d[0].Low64(), d[1].Low64()}, TokenIDs: toks[:32], BlockSize: 16, Medium: "GPU"}
	parent := d[1].Low64()
	child := pubtest.Event{Type: "BlockStored", BlockHashes: []uint64{d[2].Low64()}, Parent: &parent, TokenIDs: toks[32:], BlockSize: 16, Medium: "GPU"}
	for _, e := range []pubtest.Event{root, child} {
		if _, err := p.Publish(0, true, e); err != nil {
			t.Fatal(err)
		}
	}
	code, out := doctor(t, "--engine", engineSpec(p, "pod-a", ",hash_seed=0,hash_algo=sha256_cbor"), "--for", "3s")
	for _, want := range []string{"problems  none", "2 stored", "3 matched, 0 mismatched", "0 with problems"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q", want)
		}
	}
	if code != 0 {
		t.Fatalf("exit %d, want 0", code)
	}
}

func TestDoctorMisconfigured(t *testing.T) {
	p := startPub(t)
	// The engine runs --block-size 32 (kvindex is told 16), another PYTHONHASHSEED than
	// the one configured, and kvindex joined it mid-stream (stores under unknown parents).
	toks := blockTokens(32, 2)
	wrongSize := pubtest.Event{Type: "BlockStored", BlockHashes: []uint64{vllmhash.Chain("1", nil, toks, 32, nil)[0].Low64()}, TokenIDs: toks, BlockSize: 32, Medium: "GPU"}
	other := vllmhash.Chain("1", nil, toks, 16, nil)
	wrongSeed := pubtest.Event{Type: "BlockStored", BlockHashes: []uint64{other[0].Low64(), other[1].Low64()}, TokenIDs: toks, BlockSize: 16, Medium: "GPU"}
	unknown := uint64(0xdead)
	orphan := pubtest.Event{Type: "BlockStored", BlockHashes: []uint64{77}, Parent: &unknown, TokenIDs: toks[:16], BlockSize: 16, Medium: "GPU"}
	for _, e := range []pubtest.Event{wrongSize, wrongSeed, orphan} {
		if _, err := p.Publish(0, true, e); err != nil {
			t.Fatal(err)
		}
	}
	// A second engine that publishes nothing (KV events never enabled on it).
	quiet := startPub(t)
	code, out := doctor(t, "--engine", engineSpec(p, "pod-b", ",hash_seed=0,hash_algo=sha256_cbor"), "--engine", engineSpec(quiet, "pod-c", ""), "--for", "3s")
	for _, want := range []string{ProblemLine("block_size_mismatch"), "block_size 32, configured 16", ProblemLine("hash_mismatch"),
		ProblemLine("parent_not_found"), ProblemLine("no_events"), "fix: ", "2 with problems"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q", want)
		}
	}
	if code != 1 {
		t.Fatalf("exit %d, want 1", code)
	}
}

// ProblemLine is how a problem code starts its line in the doctor's output.
func ProblemLine(code string) string { return code + ": " }

// TestDoctorUnobservable: an engine without an endpoint (served from predictions) is
// one doctor cannot check: it is reported as a problem and the exit status says so,
// instead of a pass after --for.
func TestDoctorUnobservable(t *testing.T) {
	code, out := doctor(t, "--engine", "worker=pod-p,model=llama", "--for", "10ms")
	if code != 1 || !strings.Contains(out, "engine pod-p") || !strings.Contains(out, "unobservable: no endpoint") ||
		!strings.Contains(out, "1 engine(s) checked for 10ms: 1 with problems") {
		t.Fatalf("exit %d, want 1 and the unobservable problem:\n%s", code, out)
	}
}

func TestDoctorUsage(t *testing.T) {
	for _, args := range [][]string{{}, {"--for", "0s", "--engine", "endpoint=tcp://127.0.0.1:1"}, {"extra"}, {"--engine", "bogus"}} {
		var out, errb bytes.Buffer
		if code := doctorMain(context.Background(), args, &out, &errb); code != 2 {
			t.Errorf("%q: exit %d, want 2 (%s)", args, code, errb.String())
		}
	}
	var out, errb bytes.Buffer
	if code := doctorMain(context.Background(), []string{"-h"}, &out, &errb); code != 0 {
		t.Errorf("-h: exit %d, want 0", code)
	}
}

// TestDoctorReportsFrameRefusal: a peer whose frame declares more than
// --max-message-bytes is refused by the frame guard; doctor says so, why, and what to
// raise (it reported the engine as unreachable, or as nothing, before).
func TestDoctorReportsFrameRefusal(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := make(chan struct{}, 64)
	served := make(chan struct{})
	go func() {
		defer close(served)
		fakevllm.ServeHostile(l, append(fakevllm.Ready("PUB"), fakevllm.LongHeader(0x00, 1<<30)...), closed)
	}()
	defer func() { l.Close(); <-served }()
	code, out := doctor(t, "--engine", "endpoint=tcp://"+l.Addr().String()+",worker=big,model=m", "--for", "1s", "--max-message-bytes", "1048576")
	if code != 1 || !strings.Contains(out, "peer_refused") || !strings.Contains(out, "-byte cap") || !strings.Contains(out, "max_message_bytes") {
		t.Fatalf("exit %d:\n%s", code, out)
	}
}
