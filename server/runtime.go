package server

import (
	"fmt"
	"net"
	"path/filepath"
	"strings"
)

// What the admin role may make serve do at runtime. The engines API (POST /v1/engines)
// and the Mooncake API's /register make serve listen on an address or dial one; with
// the configuration's engines the operator chose those addresses, at runtime a client
// does. So an engine added at runtime (sources api and mooncake) is checked against
// RuntimeEnginesConfig before anything is planned for it: a bind to a non-loopback
// address needs allow_bind and the engine's allowed_peers (else any host that reaches
// the port could publish), an ipc:// endpoint must lie in ipc_dir (else serve creates
// or connects to a socket file anywhere it can write), a dialled host must be in
// dial_allow when that is set, and engines are at most max_engines in all. Every
// engine, whatever its source, has bounded names (maxNameLen, maxEndpointLen): they
// become label values of /metrics and entries of /v1/workers.

// RuntimeEnginesConfig bounds the engines added at runtime by the admin role.
type RuntimeEnginesConfig struct {
	// MaxEngines bounds the engines served at once (every source); an add past it is
	// refused. Default 4096, at most 1<<20.
	MaxEngines int `json:"max_engines,omitempty"`
	// AllowBind lets a runtime engine bind (listen) on an address other than loopback;
	// it must then list allowed_peers. Default false.
	AllowBind bool `json:"allow_bind,omitempty"`
	// IPCDir is the directory ipc:// endpoints of runtime engines must lie in; "" (the
	// default) refuses them.
	IPCDir string `json:"ipc_dir,omitempty"`
	// DialAllow, when set, lists the hosts a runtime engine may be dialled at (its
	// endpoint and replay endpoint): IPs, CIDR prefixes ("10.0.0.0/8") or host names
	// (matched exactly, case-insensitively). Empty: any. At most 1024 entries.
	DialAllow []string `json:"dial_allow,omitempty"`
}

// Defaults and bounds of RuntimeEnginesConfig and of every engine's names.
const (
	DefaultMaxEngines = 4096
	MaxMaxEngines     = 1 << 20
	maxDialAllow      = 1024
	maxNameLen        = 256  // model, worker and topic of an engine
	maxEndpointLen    = 1024 // endpoint and replay endpoint
)

func (r RuntimeEnginesConfig) withDefaults() RuntimeEnginesConfig {
	if r.MaxEngines == 0 {
		r.MaxEngines = DefaultMaxEngines
	}
	return r
}

func (r RuntimeEnginesConfig) validate() error {
	r = r.withDefaults()
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: runtime_engines.%s", ErrConfig, fmt.Sprintf(format, args...))
	}
	switch {
	case r.MaxEngines < 1 || r.MaxEngines > MaxMaxEngines:
		return bad("max_engines %d: want 1..%d", r.MaxEngines, MaxMaxEngines)
	case len(r.DialAllow) > maxDialAllow:
		return bad("dial_allow: %d entries, at most %d", len(r.DialAllow), maxDialAllow)
	case r.IPCDir != "" && !filepath.IsAbs(r.IPCDir):
		return bad("ipc_dir %q: want an absolute path", r.IPCDir)
	}
	for _, a := range r.DialAllow {
		if strings.Contains(a, "/") {
			if _, _, err := net.ParseCIDR(a); err != nil {
				return bad("dial_allow %q: %v", a, err)
			}
		}
	}
	return nil
}

// checkNames bounds an engine's names (every source).
func checkNames(e EngineConfig, where string) error {
	for _, f := range []struct {
		name, v string
		max     int
	}{{"model", e.Model, maxNameLen}, {"worker", e.Worker, maxNameLen}, {"topic", e.Topic, maxNameLen},
		{"endpoint", e.Endpoint, maxEndpointLen}, {"replay_endpoint", e.ReplayEndpoint, maxEndpointLen}} {
		if len(f.v) > f.max {
			return fmt.Errorf("%w: %s.%s: %d bytes, at most %d", ErrConfig, where, f.name, len(f.v), f.max)
		}
	}
	return nil
}

// checkRuntime checks an engine added at runtime against the configuration's
// runtime_engines; n is how many engines are served now.
func (r RuntimeEnginesConfig) checkRuntime(e EngineConfig, n int) error {
	r = r.withDefaults()
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: %s", ErrConfig, fmt.Sprintf(format, args...))
	}
	if n >= r.MaxEngines {
		return bad("%d engines served, runtime_engines.max_engines is %d", n, r.MaxEngines)
	}
	for _, ep := range []string{e.Endpoint, e.ReplayEndpoint} {
		if ep == "" {
			continue
		}
		scheme, rest, _ := strings.Cut(ep, "://")
		switch scheme {
		case "ipc":
			if !r.inIPCDir(rest) {
				return bad("endpoint %q: ipc:// endpoints added at runtime must lie in runtime_engines.ipc_dir (%q)", ep, r.IPCDir)
			}
			continue
		case "tcp":
		default:
			return bad("endpoint %q: want tcp:// or ipc://", ep)
		}
		host, _, err := net.SplitHostPort(rest)
		if err != nil {
			return bad("endpoint %q: %v", ep, err)
		}
		if e.Bind && ep == e.Endpoint {
			if !loopbackHost(host) && (!r.AllowBind || len(e.AllowedPeers) == 0) {
				return bad("endpoint %q: binding a non-loopback address at runtime needs runtime_engines.allow_bind and the engine's allowed_peers", ep)
			}
			continue
		}
		if !r.dialAllowed(host) {
			return bad("endpoint %q: host %q is not in runtime_engines.dial_allow", ep, host)
		}
	}
	return nil
}

// loopbackHost reports whether host is a loopback IP or "localhost".
func loopbackHost(host string) bool {
	if ip := net.ParseIP(host); ip != nil {
		return ip.IsLoopback()
	}
	return strings.EqualFold(host, "localhost")
}

// inIPCDir reports whether the socket path lies in the configured directory.
func (r RuntimeEnginesConfig) inIPCDir(path string) bool {
	if r.IPCDir == "" || !filepath.IsAbs(path) {
		return false
	}
	rel, err := filepath.Rel(filepath.Clean(r.IPCDir), filepath.Clean(path))
	return err == nil && rel != "." && !strings.HasPrefix(rel, "..")
}

// dialAllowed reports whether host may be dialled: any when dial_allow is empty.
func (r RuntimeEnginesConfig) dialAllowed(host string) bool {
	if len(r.DialAllow) == 0 {
		return true
	}
	ip := net.ParseIP(host)
	for _, a := range r.DialAllow {
		switch _, cidr, err := net.ParseCIDR(a); {
		case err == nil:
			if ip != nil && cidr.Contains(ip) {
				return true
			}
		case ip != nil:
			if aip := net.ParseIP(a); aip != nil && aip.Equal(ip) {
				return true
			}
		case strings.EqualFold(a, host):
			return true
		}
	}
	return false
}
