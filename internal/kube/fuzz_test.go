package kube

import (
	"bytes"
	"testing"
)

// FuzzWatchStream feeds arbitrary bytes to the watch stream's decoder and applies what
// it decodes, as a hostile API server (or a man in the middle without TLS) could: it
// must fail cleanly, never panic, and never track more than MaxPods pods.
func FuzzWatchStream(f *testing.F) {
	for _, s := range []string{
		`{"type":"ADDED","object":{"metadata":{"name":"a","resourceVersion":"2","annotations":{"k":"v"}},"status":{"phase":"Running","podIP":"10.0.0.1","conditions":[{"type":"Ready","status":"True"}]}}}` + "\n",
		`{"type":"DELETED","object":{"metadata":{"name":"a"}}}` + "\n" + `{"type":"BOOKMARK","object":{"metadata":{"resourceVersion":"9"}}}`,
		`{"type":"ERROR","object":{"code":410}}` + "\n",
		`{"type":"MODIFIED","object":{"metadata":{"name":"b","deletionTimestamp":"x"}}}` + "\n\n\n",
		"{\"type\":\"ADDED\",\"object\":" + string(bytes.Repeat([]byte("["), 100)),
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		w := &Watcher{cfg: Config{MaxObjectBytes: 4096, MaxPods: 8}, pods: map[string]Pod{}}
		events := make(chan watchEvent)
		go func() {
			_ = w.readEvents(bytes.NewReader(data), events)
			close(events)
		}()
		failed := false
		for ev := range events {
			if failed {
				continue // drain
			}
			if _, err := w.apply(&ev); err != nil {
				failed = true
			}
			if len(w.pods) > w.cfg.MaxPods {
				t.Fatalf("%d pods tracked, bound %d", len(w.pods), w.cfg.MaxPods)
			}
		}
	})
}
