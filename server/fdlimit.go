package server

// fdLimit is the process's file-descriptor limit (tests replace it).
var fdLimit = fdLimitOS

// fdsNeeded is about how many file descriptors serve holds with subs subscribers,
// bound of them on endpoints of their own, and replays replay connections at once: a
// SUB connection per subscriber, a listener per bound one, the replays, and headroom
// for the HTTP, gRPC and metrics clients, the snapshot and the log.
func fdsNeeded(subs, bound, replays int) int {
	return subs + bound + replays + 256
}

// checkFDs (Start) logs a warning when the file-descriptor limit is below what the engines
// need: past it, dials and accepts fail with EMFILE and engines go unfollowed. The Go
// runtime raises the soft limit to the hard one at start (Linux, Go 1.19+), so the
// hard limit is what counts (ulimit -Hn, systemd's LimitNOFILE=).
func (s *Server) checkFDs() {
	limit, ok := fdLimit()
	if !ok {
		return
	}
	subs, bound := 0, 0
	s.engMu.Lock()
	for _, en := range s.entries {
		subs += len(en.runs)
		if en.spec.Bind {
			bound += len(en.runs)
		}
	}
	s.engMu.Unlock()
	if need := fdsNeeded(subs, bound, s.replays.Stats().Limit); limit < uint64(need) {
		s.log.Warn("file descriptor limit below what the engines need: raise it (ulimit -n, LimitNOFILE=)",
			"limit", limit, "needed", need, "workers", subs, "bound", bound)
	}
}
