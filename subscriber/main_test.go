package subscriber_test

import (
	"testing"

	"go.uber.org/goleak"
)

// zmq4's PUB socket starts a writer goroutine that its Close never stops (v0.17.0:
// pubMWriter.run waits on a condition variable only pubMWriter.Close signals, and
// pubSocket.Close does not call it). Only Example's stand-in engine opens a PUB socket
// in this binary; subscriber code has none.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.IgnoreAnyFunction("github.com/go-zeromq/zmq4.(*pubMWriter).run"))
}
