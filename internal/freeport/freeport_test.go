package freeport

import (
	"fmt"
	"net"
	"strings"
	"sync"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestDistinct: callers running in parallel never get the same address, and an
// address given can be bound (nothing holds it).
func TestDistinct(t *testing.T) {
	const callers, each = 8, 32
	var mu sync.Mutex
	seen := map[string]bool{}
	t.Run("callers", func(t *testing.T) {
		for c := range callers {
			t.Run(fmt.Sprint(c), func(t *testing.T) {
				t.Parallel()
				for range each {
					a := Addr(t)
					mu.Lock()
					dup := seen[a]
					seen[a] = true
					mu.Unlock()
					if dup {
						t.Fatalf("%s given twice", a)
					}
				}
			})
		}
	})
	if len(seen) != callers*each {
		t.Fatalf("%d addresses, want %d", len(seen), callers*each)
	}
	a := Addr(t)
	l, err := net.Listen("tcp", a)
	if err != nil {
		t.Fatalf("the address given is not free: %v", err)
	}
	l.Close()
	if rest, ok := strings.CutPrefix(Endpoint(t), "tcp://"); !ok || rest == a || seen[rest] {
		t.Fatalf("endpoint tcp://%s: not a new tcp:// address", rest)
	}
}
