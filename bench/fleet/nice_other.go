//go:build !linux

package fleet

// lowerPriority is a no-op where threads cannot be reniced one by one.
func lowerPriority(int) error { return nil }
