package main

import (
	"log/slog"
	"strings"

	"github.com/kvindex/kvindex/server"
)

// reloadConfig is serve's SIGHUP: it re-reads the --config file, merges the command
// line into it as at start (withFlags) and hands it to the server, which applies the
// engine list's changes (server.Reload). A file that does not read or validate changes
// nothing; every outcome is logged, settings that take effect only at a restart by
// name.
func reloadConfig(log *slog.Logger, s *server.Server, path string, withFlags func(*server.Config) error) {
	if path == "" {
		log.Warn("SIGHUP: serve runs without --config; nothing to reload")
		return
	}
	cfg, err := server.ReadConfig(path)
	if err == nil {
		err = withFlags(&cfg)
	}
	var res server.ReloadResult
	if err == nil {
		res, err = s.Reload(cfg)
	}
	if err != nil {
		log.Error("reload failed; the running configuration stays", "config", path, "err", err)
		return
	}
	ch := res.Engines
	log.Info("reloaded", "config", path, "added", strings.Join(ch.Added, ","), "removed", strings.Join(ch.Removed, ","),
		"replaced", strings.Join(ch.Replaced, ","), "unchanged", len(ch.Unchanged), "rejected", len(ch.Rejected),
		"not_applied", strings.Join(res.NotApplied, ","))
}
