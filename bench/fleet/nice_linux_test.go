package fleet

import (
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
)

// threadNices reads the nice value of every thread of this process.
func threadNices(t *testing.T) []int {
	t.Helper()
	tasks, err := os.ReadDir("/proc/self/task")
	if err != nil {
		t.Fatal(err)
	}
	var out []int
	for _, task := range tasks {
		b, err := os.ReadFile("/proc/self/task/" + task.Name() + "/stat")
		if err != nil {
			continue // exited
		}
		f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
		n, err := strconv.Atoi(f[16]) // field 19 of stat: nice
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, n)
	}
	return out
}

// TestLowerPriority runs itself again as a child process (renicing is one-way for an
// unprivileged process): there lowerPriority(5) must leave every thread 5 nicer than
// the child began.
func TestLowerPriority(t *testing.T) {
	if os.Getenv("FLEET_NICE_CHILD") == "1" {
		base := threadNices(t)[0]
		if err := lowerPriority(5); err != nil {
			t.Fatal(err)
		}
		for _, n := range threadNices(t) {
			if n != min(base+5, 19) {
				t.Fatalf("thread nice %d, want %d", n, min(base+5, 19))
			}
		}
		return
	}
	before, err := syscall.Getpriority(syscall.PRIO_PROCESS, 0)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(os.Args[0], "-test.run", "^TestLowerPriority$", "-test.count", "1")
	cmd.Env = append(os.Environ(), "FLEET_NICE_CHILD=1")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("child: %v\n%s", err, out)
	}
	if after, _ := syscall.Getpriority(syscall.PRIO_PROCESS, 0); after != before {
		t.Fatalf("the test process's own priority changed: %d -> %d", before, after)
	}
	if err := lowerPriority(0); err != nil {
		t.Fatal(err)
	}
}
