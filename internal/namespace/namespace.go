// Package namespace decides the index namespace of a model's events and queries. Every
// path that puts events into an index or the fabric, or asks one, names the namespace
// with Of: the ZeroMQ subscriber (subscriber.Namespace), the relay's op-log publisher
// (fabric.PublishOps), the replay and bench drivers (internal/replay), the fabric
// replica's check of a message against its subject, and the HTTP and gRPC queries
// (server.RequestNamespace). The simulator's engines serve no named model: it stores
// and queries in the default namespace, Of("", ""), which is "" (FindMatches'). Two
// paths that spelled it differently would each work alone and never match each other.
package namespace

import (
	"strings"

	"github.com/kvindex/kvindex/kvevents"
)

// modelKey opens a model's namespaces; no kvevents namespace starts with it ("lora=",
// "lora_id=", "salt=" do), so a namespace names its model unambiguously.
const modelKey = "model="

// Of is the index namespace of an event or query in kvevents namespace ns (the LoRA
// adapter / cache salt space, "" for the default) of an engine serving model:
// "model=" + MODEL + ";" + ns, where MODEL has '%', ';' and control bytes written as
// %XX (kvevents.AppendEscaped), so different (model, ns) pairs never share a namespace.
// An empty model gives ns unchanged.
func Of(model, ns string) string {
	if model == "" {
		return ns
	}
	b := make([]byte, 0, len(modelKey)+1+len(model)+len(ns))
	b = append(b, modelKey...)
	b = kvevents.AppendEscaped(b, model)
	b = append(b, ';')
	return string(append(b, ns...))
}

// In reports whether full is a namespace Of(model, ns) gives for some ns: one of
// model's namespaces. For model "" that is any namespace that names no model.
func In(model, full string) bool {
	if model == "" {
		return !strings.HasPrefix(full, modelKey)
	}
	rest, ok := strings.CutPrefix(full, modelKey)
	if !ok || len(rest) < len(model)+1 {
		return false
	}
	// Compare against the escaped model without building it: most model names need
	// no escape, and then the escaped name is the name.
	var buf [64]byte
	esc := kvevents.AppendEscaped(buf[:0], model)
	return strings.HasPrefix(rest, string(esc)) && len(rest) > len(esc) && rest[len(esc)] == ';'
}
