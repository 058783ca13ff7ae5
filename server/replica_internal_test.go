package server

import (
	"reflect"
	"testing"

	"github.com/kvindex/kvindex/fabric"
)

// TestEveryStreamDropCounted: every count of fabric.ReplicaStats of a message the
// replica consumed (applied, or skipped for any reason) is one result of
// kvindex_stream_messages_total, so no skip goes unseen in /metrics: each counter set
// alone shows in exactly one result. A counter added to ReplicaStats fails the test
// until it is exported or named here as another series.
func TestEveryStreamDropCounted(t *testing.T) {
	notMessages := map[string]string{
		"LastApplied": "kvindex_stream_last_applied_sequence",
		"Pending":     "kvindex_stream_pending_messages",
		"Gaps":        "kvindex_stream_gaps_total (a gap's message is applied)",
	}
	typ := reflect.TypeFor[fabric.ReplicaStats]()
	counted := 0
	for i := range typ.NumField() {
		f := typ.Field(i)
		if f.Type.Kind() != reflect.Uint64 || notMessages[f.Name] != "" {
			continue
		}
		var st fabric.ReplicaStats
		v := reflect.ValueOf(&st).Elem()
		v.Field(i).SetUint(1)
		if f.Name == "Rejected" {
			st.Applied = 1 // a rejected message is one of the applied ones
		}
		var shown []string
		for _, r := range streamResults {
			if n := r.n(&st); n == 1 {
				shown = append(shown, r.result)
			} else if n != 0 {
				t.Fatalf("%s = 1: result %s is %d", f.Name, r.result, n)
			}
		}
		if len(shown) != 1 {
			t.Errorf("ReplicaStats.%s shows in results %q of kvindex_stream_messages_total, want exactly one", f.Name, shown)
		}
		counted++
	}
	if counted != len(streamResults) {
		t.Fatalf("%d message counters in ReplicaStats, %d results exported", counted, len(streamResults))
	}
}
