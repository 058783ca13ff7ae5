//go:build !unix

package tokoracle

// lockDir is a no-op where flock is missing: concurrent installs each install into
// their own folder and rename it into place.
func lockDir(string) (func(), error) { return func() {}, nil }
