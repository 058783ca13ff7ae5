package server

import (
	"testing"

	"github.com/kvindex/kvindex/subscriber"
)

// TestSubWaiting: the readiness rule per subscriber. Synced: not waited for. Not synced
// yet: waited for. Removed after the grace period: not waited for if it connected
// once (the engine is gone), waited for, with its last error, if it never did.
func TestSubWaiting(t *testing.T) {
	for _, tc := range []struct {
		st   subscriber.Status
		want string
		wait bool
	}{
		{subscriber.Status{Worker: "w", Synced: true, State: subscriber.StateLive}, "", false},
		{subscriber.Status{Worker: "w", Synced: true, State: subscriber.StateDisconnected, Connects: 1}, "", false},
		{subscriber.Status{Worker: "w", State: subscriber.StateConnecting}, "w", true},
		{subscriber.Status{Worker: "w", State: subscriber.StateDisconnected, Connects: 1}, "w", true},
		{subscriber.Status{Worker: "w", State: subscriber.StateRemoved, Connects: 2}, "", false},
		{subscriber.Status{Worker: "w", State: subscriber.StateRemoved, LastError: "dial tcp: connection refused"},
			"w (never connected: dial tcp: connection refused)", true},
	} {
		if got, wait := subWaiting(tc.st); got != tc.want || wait != tc.wait {
			t.Errorf("%+v: %q %v, want %q %v", tc.st, got, wait, tc.want, tc.wait)
		}
	}
}
