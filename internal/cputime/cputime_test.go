package cputime

import (
	"runtime"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestProcessAdvances: on the platforms that tell, the process CPU time never goes
// back, and work on this goroutine moves it on.
func TestProcessAdvances(t *testing.T) {
	c0, ok := Process()
	if !ok {
		if runtime.GOOS == "linux" {
			t.Fatal("no process CPU time on Linux")
		}
		t.Skip("this platform does not tell")
	}
	x := uint64(1)
	prev := c0
	deadline := time.Now().Add(10 * time.Second)
	for i := 0; ; i++ {
		if time.Now().After(deadline) {
			t.Fatalf("process CPU time stayed at %v through 10 s of work", c0)
		}
		for j := 0; j < 1000; j++ {
			x = x*6364136223846793005 + 1442695040888963407
		}
		c, _ := Process()
		if c < prev {
			t.Fatalf("process CPU time went back: %v after %v", c, prev)
		}
		if prev = c; c > c0 {
			break
		}
	}
	if x == 0 {
		t.Log(x) // (keeps the loop)
	}
}
