//go:build !unix

package fleet

import "os"

// No process can be stopped and continued by a signal here: --stall-server is refused
// (Config.validate) and a closing child gets only its termination.
var stopSignal, contSignal os.Signal
