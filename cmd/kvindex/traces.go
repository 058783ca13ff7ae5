package main

import (
	"errors"
	"fmt"
	"io/fs"
)

// traceURL is where the Mooncake FAST'25 conversation trace the README's figures use can
// be fetched (pinned to a commit; the file has not changed since its release).
const traceURL = "https://raw.githubusercontent.com/kvcache-ai/Mooncake/3b5a594133958449a1feaf1c9e0fc1b553e34a28/FAST25-release/traces/conversation_trace.jsonl"

// traceNotFound says where to get a trace when a --trace file does not exist, and
// returns any other error unchanged.
func traceNotFound(err error) error {
	if !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	return fmt.Errorf("%w (the public Mooncake FAST'25 traces are in github.com/kvcache-ai/Mooncake, FAST25-release/traces/: curl -LO %s; README, \"Where the traces come from\")", err, traceURL)
}
