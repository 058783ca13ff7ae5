package natstest

import (
	"os/exec"
	"syscall"
)

// configure has the kernel kill the server when the test process dies (a test binary
// killed at its -timeout runs no cleanups), so no server outlives its test.
func configure(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
