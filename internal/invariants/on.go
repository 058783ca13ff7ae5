//go:build invariants

package invariants

// Enabled reports whether the invariant checks are compiled in (-tags invariants).
const Enabled = true
