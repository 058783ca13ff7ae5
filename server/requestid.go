package server

import (
	"crypto/rand"
	"encoding/hex"
)

// newRequestID names a pick the caller did not name. The name is unguessable (128
// random bits): with sequential names (kvindex-1, kvindex-2, ...) any client could
// finish another's picks and so move load off the worker the picks went to.
func newRequestID() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails (it panics instead)
	return "kvindex-" + hex.EncodeToString(b[:])
}
