//go:build invariants

package invariants

import (
	"bytes"
	"runtime"
	"strconv"
	"sync/atomic"
)

// Owner records which goroutine holds some owner-only state, in an invariants build:
// the owner calls Acquire once it holds the state (a mutex, a token) and Release before
// it lets go; an owner-only method calls Check, which panics unless it runs on the
// goroutine that acquired the state. Without the tag Owner is an empty struct whose
// methods do nothing.
type Owner struct{ g atomic.Int64 }

// Acquire makes the calling goroutine the owner. It panics if another goroutine is
// recorded as the owner: two goroutines hold the state at once.
func (o *Owner) Acquire() {
	g := goid()
	if !o.g.CompareAndSwap(0, g) && o.g.Load() != g {
		prev := o.g.Load()
		panic("invariants: goroutine " + strconv.FormatInt(g, 10) + " acquired state owned by goroutine " + strconv.FormatInt(prev, 10))
	}
}

// Release records that no goroutine owns the state. It panics if the caller is not the
// owner.
func (o *Owner) Release() {
	o.Check("Release")
	o.g.Store(0)
}

// Check panics unless the calling goroutine is the owner; what names the method.
func (o *Owner) Check(what string) {
	if g, own := goid(), o.g.Load(); g != own {
		panic("invariants: " + what + " ran on goroutine " + strconv.FormatInt(g, 10) + ", owner " + strconv.FormatInt(own, 10))
	}
}

// CheckFree panics if some goroutine is recorded as the owner: for readers that share
// the state with each other but never with its owner (the locked index's queries, under
// its read lock, against the event that writes it under the write lock).
func (o *Owner) CheckFree(what string) {
	if own := o.g.Load(); own != 0 {
		panic("invariants: " + what + " ran while goroutine " + strconv.FormatInt(own, 10) + " owns the state")
	}
}

// goid is the calling goroutine's id, read from its stack header ("goroutine N [...").
// Slow (a microsecond), which only invariants builds pay.
func goid() int64 {
	var buf [64]byte
	b := buf[:runtime.Stack(buf[:], false)]
	b = bytes.TrimPrefix(b, []byte("goroutine "))
	if i := bytes.IndexByte(b, ' '); i > 0 {
		b = b[:i]
	}
	g, err := strconv.ParseInt(string(b), 10, 64)
	if err != nil {
		panic("invariants: cannot read the goroutine id: " + err.Error())
	}
	return g
}
