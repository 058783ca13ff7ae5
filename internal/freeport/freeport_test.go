package freeport

import (
	"net"
	"sync"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestDistinct: many concurrent callers never get the same address, and each
// address can be bound (nothing holds it).
func TestDistinct(t *testing.T) {
	const callers, each = 8, 32
	got := make(chan string, callers*each)
	var wg sync.WaitGroup
	for range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range each {
				got <- Addr(t)
			}
		}()
	}
	wg.Wait()
	close(got)
	seen := map[string]bool{}
	for a := range got {
		if seen[a] {
			t.Fatalf("%s given twice", a)
		}
		seen[a] = true
	}
	a := Addr(t)
	l, err := net.Listen("tcp", a)
	if err != nil {
		t.Fatalf("the address given is not free: %v", err)
	}
	l.Close()
	if e := Endpoint(t); len(e) < len("tcp://") || e[:6] != "tcp://" || e[6:] == a {
		t.Fatalf("endpoint %q", e)
	}
}
