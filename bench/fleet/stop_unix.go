//go:build unix

package fleet

import (
	"os"
	"syscall"
)

// The signals --stall-server sends serve (stop it, then let it go on), and that a closing
// child gets first so that a stopped serve can take its SIGTERM.
var (
	stopSignal os.Signal = syscall.SIGSTOP
	contSignal os.Signal = syscall.SIGCONT
)
