package server

import (
	"context"
	"fmt"
	"maps"
	"net"
	"slices"
	"strconv"

	"github.com/kvindex/kvindex/internal/kube"
)

// Kubernetes discovery: the pods that match a label selector in one namespace, each an
// engine (package kube lists and watches them with the pod's service account). A pod
// is an engine while it runs, has an IP and is not being deleted (and, with
// require_ready, is Ready); its endpoint is tcp://POD_IP:PORT with PORT from its
// port annotation, its replay endpoint likewise from the replay annotation (none
// without it), its worker id its name, and everything else comes from the "engine"
// template, which an annotation may override for the model and the data-parallel
// ranks. A pod without the port annotation is not an engine; one whose annotations do
// not parse is skipped and logged once.

// The default annotations of Kubernetes discovery.
const (
	DefaultPortAnnotation       = "kvindex.io/kv-events-port"
	DefaultReplayPortAnnotation = "kvindex.io/kv-replay-port"
	DefaultModelAnnotation      = "kvindex.io/model"
	DefaultDPRanksAnnotation    = "kvindex.io/dp-ranks"
)

// KubeDiscovery follows Kubernetes pods by label selector.
type KubeDiscovery struct {
	// Selector is the pods' label selector, e.g. "app=vllm" (required).
	Selector string `json:"selector"`
	// Namespace is the pods' namespace. Default: kvindex's own pod's.
	Namespace string `json:"namespace,omitempty"`
	// The annotations read from each pod (defaults DefaultPortAnnotation, ...): the
	// KV-event PUB port (required for a pod to be an engine), the replay ROUTER port,
	// the model (default Engine.Model) and the data-parallel ranks (default
	// Engine.DPRanks; rank r publishes on port + r).
	PortAnnotation       string `json:"port_annotation,omitempty"`
	ReplayPortAnnotation string `json:"replay_port_annotation,omitempty"`
	ModelAnnotation      string `json:"model_annotation,omitempty"`
	DPRanksAnnotation    string `json:"dp_ranks_annotation,omitempty"`
	// RequireReady serves only pods whose Ready condition is true (default: every
	// running pod; a subscriber waits for its engine anyway).
	RequireReady bool `json:"require_ready,omitempty"`
	// Engine is every pod's engine but for its endpoints and worker, which must be
	// unset: model, block_size, dp_ranks, topic, media, kv_group_kinds, hash_check...
	Engine EngineConfig `json:"engine,omitzero"`
	// APIServer, TokenFile and CAFile override the in-cluster defaults (package kube).
	APIServer string `json:"api_server,omitempty"`
	TokenFile string `json:"token_file,omitempty"`
	CAFile    string `json:"ca_file,omitempty"`
	// MaxPods bounds the pods followed (default 10,000).
	MaxPods int `json:"max_pods,omitempty"`
}

func (k KubeDiscovery) withDefaults() KubeDiscovery {
	if k.PortAnnotation == "" {
		k.PortAnnotation = DefaultPortAnnotation
	}
	if k.ReplayPortAnnotation == "" {
		k.ReplayPortAnnotation = DefaultReplayPortAnnotation
	}
	if k.ModelAnnotation == "" {
		k.ModelAnnotation = DefaultModelAnnotation
	}
	if k.DPRanksAnnotation == "" {
		k.DPRanksAnnotation = DefaultDPRanksAnnotation
	}
	return k
}

func (k KubeDiscovery) validate() error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: discovery.kubernetes: %s", ErrConfig, fmt.Sprintf(format, args...))
	}
	if k.Selector == "" {
		return bad("selector is required")
	}
	if e := k.Engine; e.Endpoint != "" || e.ReplayEndpoint != "" || e.Worker != "" {
		return bad("engine: endpoint, replay_endpoint and worker come from each pod; leave them out")
	}
	if k.MaxPods < 0 {
		return bad("max_pods %d", k.MaxPods)
	}
	return nil
}

// kubeWatcher is the Kubernetes source (its goroutine owns it).
type kubeWatcher struct {
	s       *Server
	cfg     KubeDiscovery
	w       *kube.Watcher
	st      *discoveryState
	skipped map[string]string // pod -> the reason last logged
}

// newKubeWatcher builds the source: the pods' template is checked against the
// configuration as an engine of a placeholder pod would be, and package kube checks
// the service account's files.
func (s *Server) newKubeWatcher(kd KubeDiscovery) (*kubeWatcher, error) {
	kd = kd.withDefaults()
	sample := kd.Engine
	sample.Endpoint, sample.Worker = "tcp://127.0.0.1:1", "pod"
	p, err := s.cfg.planner()
	if err != nil {
		return nil, err
	}
	if _, err := p.engine(s.normalize(sample), 0, "discovery.kubernetes.engine"); err != nil {
		return nil, err
	}
	w, err := kube.New(kube.Config{APIServer: kd.APIServer, TokenFile: kd.TokenFile, CAFile: kd.CAFile,
		Namespace: kd.Namespace, Selector: kd.Selector, MaxPods: kd.MaxPods, Logger: s.log.With("component", "kubernetes")})
	if err != nil {
		return nil, fmt.Errorf("%w: discovery.kubernetes: %w", ErrConfig, err)
	}
	return &kubeWatcher{s: s, cfg: kd, w: w, st: &discoveryState{source: SourceKubernetes}, skipped: map[string]string{}}, nil
}

// run follows the pods until ctx ends.
func (k *kubeWatcher) run(ctx context.Context) {
	k.w.Run(ctx, k.update, func(err error) {
		if err != nil {
			k.st.up.Store(false)
			k.st.errors.Add(1)
			return
		}
		k.st.up.Store(true)
	})
}

// update hands the pods' engines to the server.
func (k *kubeWatcher) update(pods []kube.Pod) {
	var engines []EngineConfig
	seen := map[string]bool{}
	for _, p := range pods {
		seen[p.Name] = true
		e, ok, why := k.engine(p)
		if !ok {
			if why != "" && k.skipped[p.Name] != why {
				k.s.log.Warn("discovery: pod skipped", "pod", p.Name, "namespace", p.Namespace, "reason", why)
				k.skipped[p.Name] = why
			}
			continue
		}
		delete(k.skipped, p.Name)
		engines = append(engines, e)
	}
	for _, name := range slices.Collect(maps.Keys(k.skipped)) {
		if !seen[name] {
			delete(k.skipped, name)
		}
	}
	ch, err := k.s.SetEngines(SourceKubernetes, engines)
	if err != nil {
		return // shut down
	}
	k.st.synced.Store(true)
	if !ch.Empty() {
		k.st.updates.Add(1)
	}
}

// engine maps a pod to its engine; ok false with a reason for a pod that should be an
// engine and cannot, without one for a pod that is not (yet) one.
func (k *kubeWatcher) engine(p kube.Pod) (e EngineConfig, ok bool, why string) {
	port, annotated := p.Annotations[k.cfg.PortAnnotation]
	switch {
	case !annotated:
		return e, false, "" // not an engine
	case p.Phase != "Running" || p.IP == "" || p.Terminating || (k.cfg.RequireReady && !p.Ready):
		return e, false, "" // not yet, or no longer
	}
	ip := net.ParseIP(p.IP)
	if ip == nil {
		return e, false, fmt.Sprintf("pod IP %q is not an IP address", p.IP)
	}
	pub, err := annotationPort(port)
	if err != nil {
		return e, false, fmt.Sprintf("annotation %s: %v", k.cfg.PortAnnotation, err)
	}
	e = k.cfg.Engine
	e.Worker = p.Name
	e.Endpoint = "tcp://" + net.JoinHostPort(ip.String(), strconv.Itoa(pub))
	if rp, ok := p.Annotations[k.cfg.ReplayPortAnnotation]; ok {
		n, err := annotationPort(rp)
		if err != nil {
			return e, false, fmt.Sprintf("annotation %s: %v", k.cfg.ReplayPortAnnotation, err)
		}
		e.ReplayEndpoint = "tcp://" + net.JoinHostPort(ip.String(), strconv.Itoa(n))
	}
	if m, ok := p.Annotations[k.cfg.ModelAnnotation]; ok {
		e.Model = m
	}
	if d, ok := p.Annotations[k.cfg.DPRanksAnnotation]; ok {
		n, err := strconv.Atoi(d)
		if err != nil || n < 0 || n > MaxDPRanks {
			return e, false, fmt.Sprintf("annotation %s: %q is not a rank count 0..%d", k.cfg.DPRanksAnnotation, d, MaxDPRanks)
		}
		e.DPRanks = n
	}
	return e, true, ""
}

// annotationPort parses a port annotation.
func annotationPort(s string) (int, error) {
	n, err := strconv.Atoi(s)
	if err != nil || n < 1 || n > 65535 {
		return 0, fmt.Errorf("%q is not a port 1..65535", s)
	}
	return n, nil
}
