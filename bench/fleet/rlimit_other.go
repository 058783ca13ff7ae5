//go:build !unix

package fleet

import "os"

func ensureFDs(Config) error { return nil }

func selfPID() int { return os.Getpid() }
