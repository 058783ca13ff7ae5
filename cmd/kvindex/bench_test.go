package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestBenchPeersBadFlags(t *testing.T) {
	tests := []struct {
		args []string
		want string
	}{
		{[]string{"--peers", t.TempDir()}, "--peers needs --ops"},
		{[]string{"--rounds", "0"}, "--rounds 0"},
		{[]string{"--rounds", "101"}, "--rounds 101"},
	}
	for _, tc := range tests {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			code, out, errs := runCLI(t, append([]string{"bench"}, tc.args...)...)
			if code != 2 || !strings.Contains(errs, tc.want) || out != "" {
				t.Fatalf("exit %d, stdout %q, stderr %q; want exit 2 and %q", code, out, errs, tc.want)
			}
		})
	}
}

// With no peer binary in the folder the table still comes, with our implementations,
// and the missing peers are named.
func TestBenchPeersWithoutPeers(t *testing.T) {
	log := filepath.Join(t.TempDir(), "ops.jsonl")
	ops := `{"op":"stored","worker":"a","blocks":[[1,11],[2,12]]}
{"op":"stored","worker":"b","blocks":[[1,21]]}
{"op":"query","content":[1,2,3],"expect":{"a":2,"b":1},"sizes":{"a":2,"b":1}}
`
	if err := os.WriteFile(log, []byte(ops), 0o644); err != nil {
		t.Fatal(err)
	}
	code, out, errs := runCLI(t, "bench", "--ops", log, "--peers", t.TempDir(), "--impls", "engine,locked",
		"--shards", "1", "--rounds", "2", "--duration", "2ms", "--queriers", "1", "--markdown")
	if code != 0 {
		t.Fatalf("exit %d, stderr:\n%s", code, errs)
	}
	for _, want := range []string{"| engine/shards=1 |", "| locked |", "| 1/1 |", "--rounds 2"} {
		if !strings.Contains(out, want) {
			t.Errorf("stdout lacks %q:\n%s", want, out)
		}
	}
	for _, want := range []string{"peer smg-chain not found", "peer smg-positional not found", "round 2/2: locked"} {
		if !strings.Contains(errs, want) {
			t.Errorf("stderr lacks %q:\n%s", want, errs)
		}
	}
}
