//go:build !invariants

package invariants

// Owner records which goroutine holds some owner-only state in an invariants build
// (owner_on.go); here it is empty and its methods compile away.
type Owner struct{}

// Acquire does nothing without the invariants tag.
func (*Owner) Acquire() {}

// Release does nothing without the invariants tag.
func (*Owner) Release() {}

// Check does nothing without the invariants tag.
func (*Owner) Check(string) {}

// CheckFree does nothing without the invariants tag.
func (*Owner) CheckFree(string) {}
