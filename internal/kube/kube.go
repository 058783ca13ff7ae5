package kube

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"net/url"
	"os"
	"slices"
	"strings"
	"time"
)

// The service account's files in a pod, and the defaults.
const (
	ServiceAccountDir   = "/var/run/secrets/kubernetes.io/serviceaccount"
	DefaultMaxPods      = 10000
	DefaultMaxObject    = 1 << 20
	DefaultWatchTimeout = 5 * time.Minute
	DefaultBackoffMin   = 500 * time.Millisecond
	DefaultBackoffMax   = 30 * time.Second
	listPageSize        = 500
	maxSelectorLen      = 1024
)

// ErrConfig wraps every configuration error.
var ErrConfig = errors.New("kube: invalid config")

// Config configures a Watcher. Zero fields take the in-cluster defaults.
type Config struct {
	// APIServer is the API server's base URL. Default
	// https://$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT.
	APIServer string
	// TokenFile holds the bearer token, re-read before every request (the kubelet
	// rotates projected tokens). Default ServiceAccountDir/token.
	TokenFile string
	// CAFile holds the PEM certificates that sign the API server's. Default
	// ServiceAccountDir/ca.crt.
	CAFile string
	// Namespace to watch. Default: the pod's own (ServiceAccountDir/namespace).
	Namespace string
	// Selector is the label selector (required), e.g. "app=vllm,tier in (gpu)"; the API
	// server evaluates it.
	Selector string
	// MaxPods bounds the pods tracked (default 10,000); a list or watch that would pass
	// it fails. MaxObjectBytes bounds one pod, one watch event, or one list page per
	// 500 pods (default 1 MiB).
	MaxPods        int
	MaxObjectBytes int
	// WatchTimeout is the server-side timeout of one watch (default 5m); the client gives
	// up on a silent one 30 s after it.
	WatchTimeout time.Duration
	// BackoffMin and BackoffMax bound the wait before a retry after a failure (default
	// 500ms, 30s, doubling, with jitter).
	BackoffMin, BackoffMax time.Duration
	// Transport, when set, replaces the TLS transport built from CAFile (tests).
	Transport http.RoundTripper
	// Logger receives failures and relists. Default: discard.
	Logger *slog.Logger
}

// Pod is what a Watcher keeps of a pod.
type Pod struct {
	Namespace string
	Name      string
	UID       string
	IP        string
	Phase     string
	// Ready is the Ready condition; Terminating is set once the pod is being deleted.
	Ready       bool
	Terminating bool
	Labels      map[string]string
	Annotations map[string]string
}

// Watcher follows the pods that match a selector in one namespace.
type Watcher struct {
	cfg  Config
	base *url.URL
	hc   *http.Client
	log  *slog.Logger
	// pods and rv are owned by Run's goroutine.
	pods map[string]Pod // by name
	rv   string
}

// New validates cfg and returns a Watcher. It reads the namespace, token and CA files
// once, so that a pod without a service account (or without the API server's address)
// fails here, at start, rather than at the first list.
func New(cfg Config) (*Watcher, error) {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: %s", ErrConfig, fmt.Sprintf(format, args...))
	}
	if cfg.TokenFile == "" {
		cfg.TokenFile = ServiceAccountDir + "/token"
	}
	if cfg.CAFile == "" && cfg.Transport == nil {
		cfg.CAFile = ServiceAccountDir + "/ca.crt"
	}
	if cfg.APIServer == "" {
		host, port := os.Getenv("KUBERNETES_SERVICE_HOST"), os.Getenv("KUBERNETES_SERVICE_PORT")
		if host == "" || port == "" {
			return nil, bad("no API server: set one, or run in a pod (KUBERNETES_SERVICE_HOST and _PORT are unset)")
		}
		cfg.APIServer = "https://" + net.JoinHostPort(host, port)
	}
	if cfg.Namespace == "" {
		b, err := os.ReadFile(ServiceAccountDir + "/namespace")
		if err != nil {
			return nil, bad("no namespace given and none from the service account: %v", err)
		}
		cfg.Namespace = strings.TrimSpace(string(b))
	}
	if err := checkName(cfg.Namespace); err != nil {
		return nil, bad("namespace %q: %v", cfg.Namespace, err)
	}
	if err := checkSelector(cfg.Selector); err != nil {
		return nil, bad("selector %q: %v", cfg.Selector, err)
	}
	base, err := url.Parse(cfg.APIServer)
	if err != nil || (base.Scheme != "https" && base.Scheme != "http") || base.Host == "" {
		return nil, bad("api server %q: want https://HOST:PORT", cfg.APIServer)
	}
	if _, err := readToken(cfg.TokenFile); err != nil {
		return nil, bad("%v", err)
	}
	switch {
	case cfg.MaxPods == 0:
		cfg.MaxPods = DefaultMaxPods
	case cfg.MaxPods < 0:
		return nil, bad("max pods %d", cfg.MaxPods)
	}
	switch {
	case cfg.MaxObjectBytes == 0:
		cfg.MaxObjectBytes = DefaultMaxObject
	case cfg.MaxObjectBytes < 4096:
		return nil, bad("max object bytes %d: want >= 4096", cfg.MaxObjectBytes)
	}
	if cfg.WatchTimeout <= 0 {
		cfg.WatchTimeout = DefaultWatchTimeout
	}
	if cfg.BackoffMin <= 0 {
		cfg.BackoffMin = DefaultBackoffMin
	}
	if cfg.BackoffMax < cfg.BackoffMin {
		cfg.BackoffMax = max(DefaultBackoffMax, cfg.BackoffMin)
	}
	tr := cfg.Transport
	if tr == nil {
		pem, err := os.ReadFile(cfg.CAFile)
		if err != nil {
			return nil, bad("CA: %v", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, bad("CA %s holds no PEM certificate", cfg.CAFile)
		}
		tr = &http.Transport{
			TLSClientConfig:       &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12},
			TLSHandshakeTimeout:   10 * time.Second,
			ResponseHeaderTimeout: 30 * time.Second,
			MaxIdleConns:          2,
			IdleConnTimeout:       90 * time.Second,
		}
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Watcher{cfg: cfg, base: base, hc: &http.Client{Transport: tr}, log: log}, nil
}

// checkName checks a namespace: a DNS label.
func checkName(s string) error {
	if s == "" || len(s) > 63 {
		return errors.New("want 1 to 63 characters")
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' && i > 0 && i < len(s)-1) {
			return errors.New("want lower-case letters, digits and inner '-'")
		}
	}
	return nil
}

// checkSelector checks what the API server will parse: present, bounded, printable.
func checkSelector(s string) error {
	if strings.TrimSpace(s) == "" {
		return errors.New("a label selector is required (watching every pod is never meant)")
	}
	if len(s) > maxSelectorLen {
		return fmt.Errorf("longer than %d bytes", maxSelectorLen)
	}
	for i := 0; i < len(s); i++ {
		if s[i] < 0x20 || s[i] == 0x7f {
			return fmt.Errorf("control byte %#02x", s[i])
		}
	}
	return nil
}

func readToken(path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("token: %w", err)
	}
	t := strings.TrimSpace(string(b))
	if t == "" || len(t) > 64<<10 {
		return "", fmt.Errorf("token %s: empty or longer than 64 KiB", path)
	}
	return t, nil
}

// Namespace returns the namespace watched.
func (w *Watcher) Namespace() string { return w.cfg.Namespace }

// Run lists the pods, then watches them, until ctx ends; update gets the whole current
// set (by name) after the list and after every batch of watch events that changed it,
// on Run's goroutine. A watch that ends is resumed from the last resource version; one
// the server no longer holds (410 Gone) and every failure lead to a new list after a
// backoff. status, when set, hears each attempt's outcome (nil: the watch is up).
func (w *Watcher) Run(ctx context.Context, update func([]Pod), status func(error)) {
	if status == nil {
		status = func(error) {}
	}
	backoff := w.cfg.BackoffMin
	for ctx.Err() == nil {
		err := w.list(ctx)
		if err == nil {
			update(w.snapshot())
			status(nil)
			for err == nil && ctx.Err() == nil {
				err = w.watch(ctx, update, status)
			}
		}
		if ctx.Err() != nil {
			return
		}
		if errors.Is(err, errGone) {
			w.log.Info("kube: watch expired (410 Gone); listing again", "namespace", w.cfg.Namespace)
			backoff = w.cfg.BackoffMin
			continue // relist at once: nothing is wrong
		}
		status(err)
		w.log.Warn("kube: list/watch failed; retrying", "namespace", w.cfg.Namespace, "err", err, "in", backoff)
		t := time.NewTimer(time.Duration(float64(backoff) * (0.8 + 0.4*rand.Float64())))
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
		backoff = min(2*backoff, w.cfg.BackoffMax)
	}
}

// snapshot returns the pods, sorted by name.
func (w *Watcher) snapshot() []Pod {
	out := make([]Pod, 0, len(w.pods))
	for _, p := range w.pods {
		out = append(out, p)
	}
	slices.SortFunc(out, func(a, b Pod) int { return strings.Compare(a.Name, b.Name) })
	return out
}

// errGone is a watch or list the server no longer holds history for.
var errGone = errors.New("kube: resource version expired (410 Gone)")

// request builds a GET of the namespace's pods with query q.
func (w *Watcher) request(ctx context.Context, q url.Values) (*http.Request, error) {
	tok, err := readToken(w.cfg.TokenFile)
	if err != nil {
		return nil, err
	}
	u := *w.base
	u.Path = strings.TrimSuffix(u.Path, "/") + "/api/v1/namespaces/" + w.cfg.Namespace + "/pods"
	q.Set("labelSelector", w.cfg.Selector)
	u.RawQuery = q.Encode()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Authorization", "Bearer "+tok)
	req.Header.Set("Accept", "application/json")
	req.Header.Set("User-Agent", "kvindex")
	return req, nil
}

// statusError reads a failed response's Kubernetes Status (bounded) into an error.
func statusError(resp *http.Response) error {
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	var st apiStatus
	_ = json.Unmarshal(b, &st)
	if resp.StatusCode == http.StatusGone || st.Code == http.StatusGone {
		return errGone
	}
	msg := st.Message
	if msg == "" {
		msg = strings.TrimSpace(string(b))
	}
	return fmt.Errorf("kube: %s: %.200s", resp.Status, msg)
}

// list replaces the pods with a fresh list, page by page.
func (w *Watcher) list(ctx context.Context) error {
	pods := map[string]Pod{}
	cont := ""
	var rv string
	for {
		q := url.Values{"limit": {fmt.Sprint(listPageSize)}}
		if cont != "" {
			q.Set("continue", cont)
		}
		req, err := w.request(ctx, q)
		if err != nil {
			return err
		}
		lctx, cancel := context.WithTimeout(ctx, time.Minute)
		resp, err := w.hc.Do(req.WithContext(lctx))
		if err != nil {
			cancel()
			return fmt.Errorf("kube: list: %w", err)
		}
		var page podList
		err = func() error {
			defer resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				return statusError(resp)
			}
			limit := int64(w.cfg.MaxObjectBytes) * listPageSize
			b, err := io.ReadAll(io.LimitReader(resp.Body, limit+1))
			if err != nil {
				return fmt.Errorf("kube: list: %w", err)
			}
			if int64(len(b)) > limit {
				return fmt.Errorf("kube: list page larger than %d bytes", limit)
			}
			if err := json.Unmarshal(b, &page); err != nil {
				return fmt.Errorf("kube: list: %w", err)
			}
			return nil
		}()
		cancel()
		if err != nil {
			return err
		}
		for i := range page.Items {
			p, err := page.Items[i].pod()
			if err != nil {
				return fmt.Errorf("kube: list: %w", err)
			}
			pods[p.Name] = p
		}
		if len(pods) > w.cfg.MaxPods {
			return fmt.Errorf("kube: more than %d pods match %q", w.cfg.MaxPods, w.cfg.Selector)
		}
		rv = page.Metadata.ResourceVersion
		if cont = page.Metadata.Continue; cont == "" {
			break
		}
	}
	if rv == "" {
		return errors.New("kube: list without a resourceVersion")
	}
	w.pods, w.rv = pods, rv
	return nil
}

// watch follows the pods from w.rv until the watch ends (nil: resume it), fails, or
// expires (errGone). Events already received are applied together: update runs once
// per burst, not once per event.
func (w *Watcher) watch(ctx context.Context, update func([]Pod), status func(error)) error {
	q := url.Values{"watch": {"true"}, "resourceVersion": {w.rv}, "allowWatchBookmarks": {"true"},
		"timeoutSeconds": {fmt.Sprint(int(w.cfg.WatchTimeout / time.Second))}}
	req, err := w.request(ctx, q)
	if err != nil {
		return err
	}
	// A watch the server holds open past its own timeout (plus slack) is dead.
	wctx, cancel := context.WithTimeout(ctx, w.cfg.WatchTimeout+30*time.Second)
	defer cancel()
	resp, err := w.hc.Do(req.WithContext(wctx))
	if err != nil {
		return fmt.Errorf("kube: watch: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return statusError(resp)
	}
	status(nil)
	// The reader goroutine decodes events into a channel; this one applies what has
	// arrived, then calls update once.
	events := make(chan watchEvent, 64)
	errc := make(chan error, 1)
	go func() {
		errc <- w.readEvents(resp.Body, events)
		close(events)
	}()
	defer func() {
		cancel() // unblocks the reader's Read
		for range events {
		}
	}()
	for {
		ev, ok := <-events
		if !ok {
			return <-errc
		}
		changed, err := w.apply(&ev)
		for more := true; more && err == nil; {
			select {
			case ev, ok := <-events:
				if !ok {
					more = false
					break
				}
				var c bool
				c, err = w.apply(&ev)
				changed = changed || c
			default:
				more = false
			}
		}
		if changed {
			update(w.snapshot())
		}
		if err != nil {
			return err
		}
	}
}

// readEvents decodes the watch stream, one JSON object per line of at most
// MaxObjectBytes, until it ends (nil) or fails.
func (w *Watcher) readEvents(body io.Reader, out chan<- watchEvent) error {
	r := bufio.NewReaderSize(body, 64<<10)
	var line []byte
	for {
		line = line[:0]
		for {
			chunk, err := r.ReadSlice('\n')
			line = append(line, chunk...)
			if len(line) > w.cfg.MaxObjectBytes {
				return fmt.Errorf("kube: watch event larger than %d bytes", w.cfg.MaxObjectBytes)
			}
			if err == nil {
				break
			}
			if errors.Is(err, bufio.ErrBufferFull) {
				continue
			}
			if errors.Is(err, io.EOF) && len(bytes.TrimSpace(line)) == 0 {
				return nil // the server ended the watch
			}
			if errors.Is(err, io.EOF) {
				break // a last event without its newline
			}
			return fmt.Errorf("kube: watch: %w", err)
		}
		if len(bytes.TrimSpace(line)) == 0 {
			continue
		}
		var ev watchEvent
		if err := json.Unmarshal(line, &ev); err != nil {
			return fmt.Errorf("kube: watch event: %w", err)
		}
		out <- ev
	}
}

// apply applies one watch event and reports whether the pods changed.
func (w *Watcher) apply(ev *watchEvent) (bool, error) {
	switch ev.Type {
	case "BOOKMARK":
		var o podObject
		if err := json.Unmarshal(ev.Object, &o); err != nil {
			return false, fmt.Errorf("kube: bookmark: %w", err)
		}
		if o.Metadata.ResourceVersion != "" {
			w.rv = o.Metadata.ResourceVersion
		}
		return false, nil
	case "ERROR":
		var st apiStatus
		_ = json.Unmarshal(ev.Object, &st)
		if st.Code == http.StatusGone {
			return false, errGone
		}
		return false, fmt.Errorf("kube: watch error %d %s: %.200s", st.Code, st.Reason, st.Message)
	case "ADDED", "MODIFIED", "DELETED":
	default:
		return false, fmt.Errorf("kube: unknown watch event type %.32q", ev.Type)
	}
	var o podObject
	if err := json.Unmarshal(ev.Object, &o); err != nil {
		return false, fmt.Errorf("kube: %s event: %w", ev.Type, err)
	}
	p, err := o.pod()
	if err != nil {
		return false, err
	}
	if o.Metadata.ResourceVersion != "" {
		w.rv = o.Metadata.ResourceVersion
	}
	old, had := w.pods[p.Name]
	if ev.Type == "DELETED" {
		delete(w.pods, p.Name)
		return had, nil
	}
	if !had && len(w.pods) >= w.cfg.MaxPods {
		return false, fmt.Errorf("kube: more than %d pods match %q", w.cfg.MaxPods, w.cfg.Selector)
	}
	w.pods[p.Name] = p
	return !had || !samePod(old, p), nil
}

func samePod(a, b Pod) bool {
	return a.Namespace == b.Namespace && a.Name == b.Name && a.UID == b.UID && a.IP == b.IP && a.Phase == b.Phase &&
		a.Ready == b.Ready && a.Terminating == b.Terminating && mapsEqual(a.Labels, b.Labels) && mapsEqual(a.Annotations, b.Annotations)
}

func mapsEqual(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

// The JSON shapes read: only the fields used.
type (
	podList struct {
		Metadata struct {
			ResourceVersion string `json:"resourceVersion"`
			Continue        string `json:"continue"`
		} `json:"metadata"`
		Items []podObject `json:"items"`
	}
	podObject struct {
		Metadata struct {
			Name              string            `json:"name"`
			Namespace         string            `json:"namespace"`
			UID               string            `json:"uid"`
			ResourceVersion   string            `json:"resourceVersion"`
			DeletionTimestamp *string           `json:"deletionTimestamp"`
			Labels            map[string]string `json:"labels"`
			Annotations       map[string]string `json:"annotations"`
		} `json:"metadata"`
		Status struct {
			Phase      string `json:"phase"`
			PodIP      string `json:"podIP"`
			Conditions []struct {
				Type   string `json:"type"`
				Status string `json:"status"`
			} `json:"conditions"`
		} `json:"status"`
	}
	watchEvent struct {
		Type   string          `json:"type"`
		Object json.RawMessage `json:"object"`
	}
	apiStatus struct {
		Code    int    `json:"code"`
		Reason  string `json:"reason"`
		Message string `json:"message"`
	}
)

// pod checks and converts an object.
func (o *podObject) pod() (Pod, error) {
	m := &o.Metadata
	if m.Name == "" || len(m.Name) > 253 {
		return Pod{}, fmt.Errorf("kube: pod with an empty or overlong name %.64q", m.Name)
	}
	p := Pod{Namespace: m.Namespace, Name: m.Name, UID: m.UID, IP: o.Status.PodIP, Phase: o.Status.Phase,
		Terminating: m.DeletionTimestamp != nil, Labels: m.Labels, Annotations: m.Annotations}
	for _, c := range o.Status.Conditions {
		if c.Type == "Ready" {
			p.Ready = c.Status == "True"
		}
	}
	return p, nil
}
