//go:build unix

package fleet

import (
	"fmt"
	"os"
	"syscall"
)

// ensureFDs raises this process's RLIMIT_NOFILE soft limit to what the run needs (at
// most the hard limit) and fails, naming the numbers, when even the hard limit is too
// low. The Go runtime already raises the soft limit to the hard one at start on Linux
// (since Go 1.19), and a serve child does the same for itself; this makes the limit
// explicit and the failure clear instead of a listener failing with EMFILE midway.
func ensureFDs(cfg Config) error {
	need := uint64(fdsNeeded(cfg))
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		return nil // unknown: let the listeners tell
	}
	if uint64(lim.Cur) >= need {
		return nil
	}
	if uint64(lim.Max) < need {
		return fmt.Errorf("fleet: %d engines need about %d file descriptors; RLIMIT_NOFILE's hard limit is %d (raise it: ulimit -Hn, or LimitNOFILE= in systemd)", cfg.Fleet.Engines, need, lim.Max)
	}
	lim.Cur = lim.Max
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		return fmt.Errorf("fleet: raise RLIMIT_NOFILE to %d: %w", need, err)
	}
	return nil
}

func selfPID() int { return os.Getpid() }
