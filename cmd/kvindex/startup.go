package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"

	"github.com/kvindex/kvindex/server"
)

// serve checks at start what it will need later, so that a mistake fails the start
// with its reason rather than never (a subscriber retrying a bind forever): the HTTP
// and gRPC addresses are free (they are bound here and handed to the server), and every
// engine that binds (bind=true) can bind its endpoints. The configuration itself, the
// engines' specs included, is validated before (server.Config.Validate), and server.New
// checks that the snapshot's directory is writable.

// checkServe is serve --check: server.Check (what New and Start check), then the
// addresses bound and released as at start; it prints the effective configuration
// when all pass. It exits as serve would fail: 2 for the configuration, 1 for an
// address in use.
func checkServe(cfg server.Config, opts server.Options, stdout, stderr io.Writer) int {
	eff, err := server.Check(cfg, opts)
	if err != nil {
		fmt.Fprintf(stderr, "kvindex serve: %v\n", err)
		return 2
	}
	httpLn, grpcLn, err := bindEarly(cfg)
	if err != nil {
		fmt.Fprintf(stderr, "kvindex serve: %v\n", err)
		return 1
	}
	httpLn.Close()
	if grpcLn != nil {
		grpcLn.Close()
	}
	enc := json.NewEncoder(stdout)
	enc.SetIndent("", "  ")
	if err := enc.Encode(eff); err != nil {
		fmt.Fprintf(stderr, "kvindex serve: %v\n", err)
		return 1
	}
	return 0
}

// bindEarly checks that every engine that binds can (checkBinds), then binds the
// HTTP and gRPC addresses (listenEarly): serve's start checks of addresses.
func bindEarly(cfg server.Config) (httpLn, grpcLn net.Listener, err error) {
	if err := checkBinds(cfg); err != nil {
		return nil, nil, err
	}
	return listenEarly(cfg)
}

// listenEarly binds the HTTP address and, when configured, the gRPC one.
func listenEarly(cfg server.Config) (httpLn, grpcLn net.Listener, err error) {
	addr := cfg.Listen
	if addr == "" {
		addr = server.DefaultListen
	}
	if httpLn, err = net.Listen("tcp", addr); err != nil {
		return nil, nil, fmt.Errorf("listen %s: %w", addr, err)
	}
	if cfg.GRPC.Listen != "" {
		if grpcLn, err = net.Listen("tcp", cfg.GRPC.Listen); err != nil {
			httpLn.Close()
			return nil, nil, fmt.Errorf("--grpc %s: %w", cfg.GRPC.Listen, err)
		}
	}
	return httpLn, grpcLn, nil
}

// checkBinds binds, and closes at once, the endpoint of every engine rank that binds
// (tcp endpoints; others are left to the subscriber).
func checkBinds(cfg server.Config) error {
	subs, err := cfg.SubscriberConfigs()
	if err != nil {
		return err
	}
	var errs []error
	for _, sc := range subs {
		addr, ok := strings.CutPrefix(sc.Endpoint, "tcp://")
		if !sc.Bind || !ok {
			continue
		}
		l, err := net.Listen("tcp", addr)
		if err != nil {
			errs = append(errs, fmt.Errorf("engine %s binds %s: %w", sc.Worker, sc.Endpoint, err))
			continue
		}
		l.Close()
	}
	return errors.Join(errs...)
}
