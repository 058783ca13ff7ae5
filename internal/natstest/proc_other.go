//go:build !linux

package natstest

import "os/exec"

// configure does nothing off Linux: there a server outlives a test process that is
// killed, until it is stopped by hand.
func configure(*exec.Cmd) {}
