package server

import (
	"strings"
	"testing"

	"github.com/kvindex/kvindex/internal/kube"
)

// TestKubePodEngine: how a pod becomes an engine: its IP (v4 or v6) and port
// annotations make the endpoints, annotations override the template's model and ranks,
// a pod not running, without an IP, terminating or (with require_ready) not ready is
// not one yet, and annotations that do not parse say why.
func TestKubePodEngine(t *testing.T) {
	k := &kubeWatcher{cfg: KubeDiscovery{Engine: EngineConfig{Model: "tmpl", BlockSize: 16, DPRanks: 2}}.withDefaults()}
	ready := func(ip string, ann map[string]string) kube.Pod {
		return kube.Pod{Name: "p", IP: ip, Phase: "Running", Ready: true, Annotations: ann}
	}
	port := map[string]string{DefaultPortAnnotation: "5557"}
	for _, tc := range []struct {
		name         string
		pod          kube.Pod
		requireReady bool
		ok           bool
		why          string
		endpoint     string
		replay       string
		model        string
		ranks        int
	}{
		{name: "v4", pod: ready("10.1.2.3", port), ok: true, endpoint: "tcp://10.1.2.3:5557", model: "tmpl", ranks: 2},
		{name: "v6", pod: ready("fd00::7", map[string]string{DefaultPortAnnotation: "5557", DefaultReplayPortAnnotation: "5558"}),
			ok: true, endpoint: "tcp://[fd00::7]:5557", replay: "tcp://[fd00::7]:5558", model: "tmpl", ranks: 2},
		{name: "overrides", pod: ready("10.0.0.1", map[string]string{DefaultPortAnnotation: "1", DefaultModelAnnotation: "llama", DefaultDPRanksAnnotation: "0"}),
			ok: true, endpoint: "tcp://10.0.0.1:1", model: "llama", ranks: 0},
		{name: "no annotation", pod: ready("10.0.0.1", nil)},
		{name: "pending", pod: kube.Pod{Name: "p", IP: "10.0.0.1", Phase: "Pending", Annotations: port}},
		{name: "no IP", pod: ready("", port)},
		{name: "terminating", pod: kube.Pod{Name: "p", IP: "10.0.0.1", Phase: "Running", Terminating: true, Annotations: port}},
		{name: "not ready", pod: kube.Pod{Name: "p", IP: "10.0.0.1", Phase: "Running", Annotations: port}, requireReady: true},
		{name: "not ready, allowed", pod: kube.Pod{Name: "p", IP: "10.0.0.1", Phase: "Running", Annotations: port}, ok: true,
			endpoint: "tcp://10.0.0.1:5557", model: "tmpl", ranks: 2},
		{name: "bad port", pod: ready("10.0.0.1", map[string]string{DefaultPortAnnotation: "70000"}), why: "not a port"},
		{name: "bad replay", pod: ready("10.0.0.1", map[string]string{DefaultPortAnnotation: "1", DefaultReplayPortAnnotation: "x"}), why: "not a port"},
		{name: "bad ranks", pod: ready("10.0.0.1", map[string]string{DefaultPortAnnotation: "1", DefaultDPRanksAnnotation: "-2"}), why: "rank count"},
		{name: "bad IP", pod: ready("host.local", port), why: "not an IP"},
	} {
		k.cfg.RequireReady = tc.requireReady
		e, ok, why := k.engine(tc.pod)
		if ok != tc.ok || !strings.Contains(why, tc.why) || (tc.why == "" && why != "") {
			t.Errorf("%s: ok %v why %q, want %v %q", tc.name, ok, why, tc.ok, tc.why)
			continue
		}
		if ok && (e.Endpoint != tc.endpoint || e.ReplayEndpoint != tc.replay || e.Model != tc.model || e.DPRanks != tc.ranks || e.Worker != "p" || e.BlockSize != 16) {
			t.Errorf("%s: %+v", tc.name, e)
		}
	}
}
