//go:build !unix

package server

func fdLimitOS() (uint64, bool) { return 0, false }
