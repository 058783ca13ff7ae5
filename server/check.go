package server

import "fmt"

// Check runs the checks New and Start make before serving, without building or
// starting anything (no index, no subscriber, no NATS connection, no snapshot read or
// written): the configuration (Validate and the engines' plan), the options, the
// snapshot path (its directory exists and is writable, and it is not itself a
// directory), the TLS and token files (read and parsed), and that an address that
// authenticates nobody is a loopback one (auth.allow_unauthenticated). It returns the
// effective configuration: cfg with every default filled in. `kvindex serve --check`
// prints it; binding the addresses is left to the caller (an address can be free now
// and taken at start).
func Check(cfg Config, opts Options) (Config, error) {
	if _, err := cfg.plan(); err != nil {
		return Config{}, err
	}
	if err := opts.check(); err != nil {
		return Config{}, err
	}
	if err := checkSnapshotDir(opts.Snapshot.Path); err != nil {
		return Config{}, fmt.Errorf("%w: %v", ErrConfig, err)
	}
	eff := cfg.withDefaults()
	if _, err := newAccess(eff.Auth); err != nil {
		return Config{}, err
	}
	for _, addr := range []string{eff.Listen, eff.GRPC.Listen} {
		if err := checkListen(eff.Auth, addr); err != nil {
			return Config{}, err
		}
	}
	return eff, nil
}
