package server

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"
)

// The probe listener (Config.ProbeListen): /healthz and /readyz, and nothing else, on
// an address of their own in plain HTTP. With mutual TLS (auth.client_ca_file) the API
// listener completes no TLS handshake without a client certificate, and the probes of
// an orchestrator (Kubernetes' httpGet) carry none; pointing them at the probe listener
// keeps them working without opening anything else. The two endpoints show the
// server's liveness and readiness (and, on /readyz, the names of the workers it waits
// for), nothing clients send. Connections are bounded as the API's are (admit.go), and
// a probe request has no body to reserve.

// startProbes serves the probe listener when configured.
func (s *Server) startProbes() error {
	if s.cfg.ProbeListen == "" {
		return nil
	}
	ln, err := net.Listen("tcp", s.cfg.ProbeListen)
	if err != nil {
		return fmt.Errorf("server: probe listen %s: %w", s.cfg.ProbeListen, err)
	}
	mux := http.NewServeMux()
	mux.Handle("/healthz", s.instrument("healthz", methods(s.handleHealth, http.MethodGet)))
	mux.Handle("/readyz", s.instrument("readyz", methods(s.handleReady, http.MethodGet)))
	mux.Handle("/", s.instrument("other", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, http.StatusNotFound, "not_found", "the probe listener serves /healthz and /readyz only")
	}))
	s.probeLn = ln
	s.probeSrv = &http.Server{
		Handler:           mux,
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       10 * time.Second,
		WriteTimeout:      10 * time.Second,
		IdleTimeout:       time.Minute,
		MaxHeaderBytes:    8 << 10,
		ErrorLog:          slog.NewLogLogger(s.log.Handler(), slog.LevelWarn),
	}
	bounded := s.admit.limit(ln, "probe")
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		if err := s.probeSrv.Serve(bounded); err != nil && !errors.Is(err, http.ErrServerClosed) {
			s.report(fmt.Errorf("server: probe serve: %w", err))
		}
	}()
	s.log.Info("serving probes", "addr", ln.Addr().String())
	return nil
}

// ProbeAddr returns the probe listener's address once started ("" when none).
func (s *Server) ProbeAddr() string {
	if s.probeLn == nil {
		return ""
	}
	return s.probeLn.Addr().String()
}
