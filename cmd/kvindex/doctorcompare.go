package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/kvindex/kvindex/engine"
	"github.com/kvindex/kvindex/fabric"
	"github.com/kvindex/kvindex/internal/readlimit"
	"github.com/kvindex/kvindex/server"
)

// compareHelp documents doctor --compare in doctor's flags.
const compareHelp = "compare the digests of what two indexes hold per worker: kvindex doctor --compare SOURCE1 SOURCE2, " +
	"each a serve URL (its /v1/workers) or a snapshot file (serve --snapshot's, or a NATS replica's); prints the workers that differ, exit status 1 if any"

// wantsCompare reports whether doctor's arguments ask for --compare.
func wantsCompare(args []string) bool { return hasFlag(args, "compare") }

// hasFlag reports whether args name flag (-flag, --flag or --flag=...) before any "--".
func hasFlag(args []string, flag string) bool {
	for _, a := range args {
		if a == "--" {
			return false
		}
		if name, _, _ := strings.Cut(strings.TrimLeft(a, "-"), "="); strings.HasPrefix(a, "-") && name == flag {
			return true
		}
	}
	return false
}

// doctorCompare is kvindex doctor --compare SOURCE1 SOURCE2 [--resync]: it reads each
// source's per-worker digests (engine.Digest) and prints the workers whose digests
// differ, with the namespaces that do; with --resync it asks SOURCE1 (a NATS replica's
// URL) to rebuild each of them from its stream (POST /v1/workers/{worker}/resync) and
// compares again. Exit status 0: the sources agree (after the resync); 1: they differ
// (or a runtime failure); 2: bad usage.
func doctorCompare(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := newFlags("doctor", stderr)
	fs.Bool("compare", true, compareHelp)
	resync := fs.Bool("resync", false, "with --compare: ask SOURCE1, a NATS replica, to resync each worker that differs from its stream, then compare again")
	asJSON := fs.Bool("json", false, "with --compare: print one JSON object")
	timeout := fs.Duration("timeout", 2*time.Minute, "with --compare: bound on each request")
	maxBytes := fs.Int64("max-bytes", 1<<30, "with --compare: bound on a /v1/workers answer or a snapshot file read")
	var sources []string
	if parseOnly != nil {
		args = parseOnly(fs, args)
	}
	for rest := args; ; {
		usage := fs.Usage
		fs.Usage = func() {}
		err := fs.Parse(rest)
		fs.Usage = usage
		if errors.Is(err, flag.ErrHelp) {
			fs.SetOutput(stdout)
			usage()
			return 0
		}
		if err != nil {
			fmt.Fprintf(stderr, "run '%s -h' for the flags\n", fs.Name())
			return 2
		}
		if fs.NArg() == 0 {
			break
		}
		sources = append(sources, fs.Arg(0))
		rest = fs.Args()[1:]
	}
	if parseOnly != nil {
		return 0
	}
	if len(sources) != 2 {
		fmt.Fprintf(stderr, "kvindex doctor: --compare takes two sources (serve URLs or snapshot files), got %d\n", len(sources))
		return 2
	}
	if *resync && !isURL(sources[0]) {
		fmt.Fprintln(stderr, "kvindex doctor: --resync resyncs SOURCE1, which must be a serve URL")
		return 2
	}
	hc := &http.Client{Timeout: *timeout}
	read := func() (a, b map[string]engine.WorkerDigest, err error) {
		if a, err = readDigests(ctx, hc, sources[0], *maxBytes); err != nil {
			return nil, nil, err
		}
		if b, err = readDigests(ctx, hc, sources[1], *maxBytes); err != nil {
			return nil, nil, err
		}
		return a, b, nil
	}
	a, b, err := read()
	if err != nil {
		fmt.Fprintf(stderr, "kvindex doctor: %v\n", err)
		return 1
	}
	report := compareReport{Sources: sources, Workers: len(unionKeys(a, b))}
	report.Differ = digestDiffs(a, b)
	if *resync && len(report.Differ) > 0 {
		for _, d := range report.Differ {
			info, err := postResync(ctx, hc, sources[0], d.Worker)
			if err != nil {
				fmt.Fprintf(stderr, "kvindex doctor: resync %q: %v\n", d.Worker, err)
				return 1
			}
			report.Resynced = append(report.Resynced, info)
		}
		if a, b, err = read(); err != nil {
			fmt.Fprintf(stderr, "kvindex doctor: %v\n", err)
			return 1
		}
		report.After = digestDiffs(a, b)
	}
	still := report.Differ
	if *resync && len(report.Differ) > 0 {
		still = report.After
	}
	if *asJSON {
		out, _ := json.Marshal(report)
		fmt.Fprintln(stdout, string(out))
	} else {
		report.print(stdout)
	}
	if len(still) > 0 {
		return 1
	}
	return 0
}

// compareReport is what doctor --compare found.
type compareReport struct {
	Sources  []string            `json:"sources"`
	Workers  int                 `json:"workers"`
	Differ   []workerDiff        `json:"differ"`
	Resynced []server.ResyncInfo `json:"resynced,omitempty"`
	// After is the comparison after the resyncs.
	After []workerDiff `json:"after,omitempty"`
}

// workerDiff is one worker whose digests differ.
type workerDiff struct {
	Worker string             `json:"worker"`
	A      *server.DigestInfo `json:"a"`
	B      *server.DigestInfo `json:"b"`
	// Namespaces lists the namespaces whose digests differ ("" is the default).
	Namespaces []string `json:"namespaces"`
}

func (r *compareReport) print(w io.Writer) {
	show := func(diffs []workerDiff) {
		for _, d := range diffs {
			ns := make([]string, len(d.Namespaces))
			for i, n := range d.Namespaces {
				ns[i] = fmt.Sprintf("%q", n)
			}
			fmt.Fprintf(w, "  %s: %s (%d blocks) vs %s (%d blocks); namespaces %s\n", d.Worker, d.A.Sum, d.A.Blocks, d.B.Sum, d.B.Blocks, strings.Join(ns, ", "))
		}
	}
	fmt.Fprintf(w, "%d worker(s) compared between %s and %s: %d differ\n", r.Workers, r.Sources[0], r.Sources[1], len(r.Differ))
	show(r.Differ)
	if len(r.Resynced) > 0 {
		for _, s := range r.Resynced {
			fmt.Fprintf(w, "resynced %s: %d messages replayed, %d applied (complete: %v), digest now %s\n", s.Worker, s.Messages, s.Applied, s.Complete, s.Digest.Sum)
		}
		fmt.Fprintf(w, "after the resync: %d differ\n", len(r.After))
		show(r.After)
	}
}

// digestDiffs lists the workers whose digests differ, with their namespaces that do.
func digestDiffs(a, b map[string]engine.WorkerDigest) []workerDiff {
	out := []workerDiff{}
	for _, name := range engine.DiffDigests(a, b) {
		da, db := a[name], b[name]
		d := workerDiff{Worker: name, A: server.NewDigestInfo(da), B: server.NewDigestInfo(db), Namespaces: []string{}}
		for _, ns := range slices.Sorted(func(yield func(string) bool) {
			for k := range unionKeys(da.Namespaces, db.Namespaces) {
				if !yield(k) {
					return
				}
			}
		}) {
			if da.Namespaces[ns] != db.Namespaces[ns] {
				d.Namespaces = append(d.Namespaces, ns)
			}
		}
		out = append(out, d)
	}
	return out
}

func unionKeys[V any](a, b map[string]V) map[string]struct{} {
	out := make(map[string]struct{}, len(a)+len(b))
	for k := range a {
		out[k] = struct{}{}
	}
	for k := range b {
		out[k] = struct{}{}
	}
	return out
}

func isURL(s string) bool { return strings.HasPrefix(s, "http://") || strings.HasPrefix(s, "https://") }

// readDigests reads the per-worker digests of a serve URL's /v1/workers or of a
// snapshot file (an engine snapshot, serve --snapshot's, or a NATS replica's).
func readDigests(ctx context.Context, hc *http.Client, source string, maxBytes int64) (map[string]engine.WorkerDigest, error) {
	if !isURL(source) {
		return snapshotDigests(source, maxBytes)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimSuffix(source, "/")+"/v1/workers", nil)
	if err != nil {
		return nil, err
	}
	resp, err := hc.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	body, err := readlimit.ReadAll(resp.Body, maxBytes)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", source, err)
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("%s/v1/workers: status %d: %.200s", source, resp.StatusCode, body)
	}
	var out struct{ Workers []server.WorkerInfo }
	if err := json.Unmarshal(body, &out); err != nil {
		return nil, fmt.Errorf("%s/v1/workers: %w", source, err)
	}
	ds := make(map[string]engine.WorkerDigest, len(out.Workers))
	for _, wi := range out.Workers {
		if wi.Digest == nil {
			return nil, fmt.Errorf("%s/v1/workers: worker %q has no digest (a kvindex older than digests?)", source, wi.Worker)
		}
		d, err := wi.Digest.WorkerDigest()
		if err != nil {
			return nil, fmt.Errorf("%s/v1/workers: worker %q: %w", source, wi.Worker, err)
		}
		ds[wi.Worker] = d
	}
	return ds, nil
}

// snapshotDigests restores a snapshot file into a private index and returns its
// digests.
func snapshotDigests(path string, maxBytes int64) (map[string]engine.WorkerDigest, error) {
	cfg := engine.Config{Shards: 1}
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	e, err := engine.Restore(cfg, f, maxBytes)
	f.Close()
	if err != nil {
		var ferr error
		if e, ferr = fabric.RestoreSnapshot(path, cfg, maxBytes); ferr != nil {
			return nil, fmt.Errorf("%s: neither an index snapshot (%v) nor a replica's (%v)", path, err, ferr)
		}
	}
	defer e.Close()
	return e.Digests(), nil
}

// postResync asks the serve at base to resync worker from its stream.
func postResync(ctx context.Context, hc *http.Client, base, worker string) (server.ResyncInfo, error) {
	var info server.ResyncInfo
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, strings.TrimSuffix(base, "/")+"/v1/workers/"+url.PathEscape(worker)+"/resync", nil)
	if err != nil {
		return info, err
	}
	resp, err := hc.Do(req)
	if err != nil {
		return info, err
	}
	defer resp.Body.Close()
	body, err := readlimit.ReadAll(resp.Body, 1<<20)
	if err != nil {
		return info, err
	}
	if resp.StatusCode != http.StatusOK {
		return info, fmt.Errorf("status %d: %.300s", resp.StatusCode, body)
	}
	err = json.Unmarshal(body, &info)
	return info, err
}
