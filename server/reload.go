package server

import (
	"encoding/json"
	"reflect"
	"strings"
	"time"

	"github.com/kvindex/kvindex/subscriber"
)

// ReloadResult is what Reload did with a new configuration.
type ReloadResult struct {
	// Engines is what changed in the configuration's engines (source SourceConfig).
	Engines EngineChanges `json:"engines"`
	// NotApplied names, by their JSON field names, the settings that differ from the
	// running configuration but take effect only at a restart: everything but the
	// engine list (listen, index, grpc, tiers, the durations...). The engines are
	// planned with the running settings.
	NotApplied []string `json:"not_applied"`
}

// Reload applies a new configuration: it is validated whole first (an invalid one
// changes nothing and its error is returned), then the configuration's engines become
// its engines (SetEngines(SourceConfig, cfg.Engines): added, removed and changed
// engines only; engines of the API and of discovery are left alone) and every other
// setting that differs is reported in NotApplied, never silently dropped. The token
// files (auth.token_file, auth.admin_token_file) are read again: a token rotated in
// them is accepted, and one removed refused, from now on; a file that no longer reads
// is Reload's error and leaves every token as it was.
func (s *Server) Reload(cfg Config) (ReloadResult, error) {
	res := ReloadResult{NotApplied: []string{}}
	if err := cfg.Validate(); err != nil {
		return res, err
	}
	res.NotApplied = fixedChanges(spelledOut(s.cfg), spelledOut(cfg.withDefaults()))
	// The token files are read again (a rotated token takes effect now); their paths
	// are fixed settings like the rest.
	if err := s.access.reload(); err != nil {
		return res, err
	}
	ch, err := s.SetEngines(SourceConfig, cfg.Engines)
	res.Engines = ch
	if err != nil {
		return res, err
	}
	if len(res.NotApplied) > 0 {
		s.log.Warn("reload: these settings changed but take effect only at a restart", "settings", strings.Join(res.NotApplied, ", "))
	}
	return res, nil
}

// fixedChanges lists the JSON names of the fields, the engine list aside, in which two
// configurations (defaults applied) differ, comparing their JSON encodings (an empty
// map or list counts as absent).
func fixedChanges(old, cur Config) []string {
	out := []string{}
	ov, cv := reflect.ValueOf(old), reflect.ValueOf(cur)
	t := ov.Type()
	for i := range t.NumField() {
		f := t.Field(i)
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		if name == "" || name == "-" {
			name = f.Name
		}
		if name == "engines" {
			continue
		}
		a, b := ov.Field(i), cv.Field(i)
		if empty(a) && empty(b) {
			continue
		}
		ja, err1 := json.Marshal(a.Interface())
		jb, err2 := json.Marshal(b.Interface())
		if err1 != nil || err2 != nil || string(ja) != string(jb) {
			out = append(out, name)
		}
	}
	return out
}

// spelledOut fills in the defaults the subscribers and the gRPC server apply to zero
// settings, so that a setting written out at its default is no change.
func spelledOut(c Config) Config {
	def := func(v *Duration, d time.Duration) {
		if *v == 0 {
			*v = Duration(d)
		}
	}
	def(&c.ReplayTimeout, subscriber.DefaultReplayTimeout)
	def(&c.ReconnectMin, subscriber.DefaultReconnectMin)
	def(&c.ReconnectMax, subscriber.DefaultReconnectMax)
	def(&c.Grace, subscriber.DefaultGrace)
	def(&c.ResyncInterval, subscriber.DefaultResyncInterval)
	if c.MaxMessageBytes == 0 {
		c.MaxMessageBytes = subscriber.DefaultMaxMessageBytes
	}
	c.GRPC = c.GRPC.withDefaults()
	return c
}

// empty reports whether v is a nil or empty map or slice.
func empty(v reflect.Value) bool {
	switch v.Kind() {
	case reflect.Map, reflect.Slice:
		return v.Len() == 0
	}
	return false
}
