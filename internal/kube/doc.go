// Package kube is a minimal client of the Kubernetes API for one job: following the
// pods that match a label selector in one namespace (list, then watch from the list's
// resource version), with the pod's own service account (the bearer token, re-read
// before every request because the kubelet rotates it, and the cluster's CA).
//
// It is not client-go. With a fresh build cache, a 20-line program that watches pods
// with client-go v0.37.2 took 176 s of CPU to `go build`, and its test with client-go's
// fake clientset 281 s of CPU to `go test -race -c` (426 s of wall time on two shared
// cores), against a CI budget of about 8 minutes for all of `make test` on two cores.
// What discovery needs is two GETs and a line-delimited JSON stream; package kubetest
// fakes exactly that for the tests.
//
// What it owns: a Watcher's pod set and resource version, written only by Run's
// goroutine (and the goroutine Run starts per watch to decode the stream). Who may call
// it: package server's Kubernetes discovery. Everything read from the API server is
// bounded: one event or pod (MaxObjectBytes, 1 MiB), one list page (500 pods), the pods
// tracked (MaxPods, 10,000), a silent watch (its timeout plus 30 s).
package kube
