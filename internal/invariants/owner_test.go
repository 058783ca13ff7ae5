package invariants

import (
	"go.uber.org/goleak"
	"strings"
	"testing"
)

// TestOwner: in an invariants build the owner passes Check, and a Check, Release or
// Acquire from another goroutine panics with what ran where; without the tag nothing
// panics (the methods compile away).
func TestOwner(t *testing.T) {
	var o Owner
	o.Acquire()
	o.Check("owner")
	panicked := func(f func()) (msg string) {
		done := make(chan string)
		go func() {
			defer func() {
				r := recover()
				s, _ := r.(string)
				done <- s
			}()
			f()
		}()
		return <-done
	}
	for name, f := range map[string]func(){
		"Check":   func() { o.Check("reader") },
		"Acquire": o.Acquire,
		"Release": o.Release,
	} {
		msg := panicked(f)
		if Enabled != strings.HasPrefix(msg, "invariants: ") {
			t.Fatalf("%s from a non-owner, Enabled %v: panic %q", name, Enabled, msg)
		}
	}
	if msg := panicked(func() { o.CheckFree("reader") }); Enabled != (msg != "") {
		t.Fatalf("CheckFree while owned, Enabled %v: panic %q", Enabled, msg)
	}
	o.Release()
	if msg := panicked(func() { o.CheckFree("reader") }); msg != "" {
		t.Fatalf("CheckFree after Release: panic %q", msg)
	}
}

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
