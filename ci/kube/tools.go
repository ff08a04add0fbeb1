//go:build tools

// Package tools pins the commands ci/kube-up builds, so that `go mod tidy`
// keeps their whole dependency graph in go.mod and go.sum. etcd is the
// server release k8s.io/kubernetes itself depends on (go.etcd.io/etcd/server/v3
// is already in its module graph), so its version follows the Kubernetes pin.
package tools

import (
	_ "go.etcd.io/etcd/server/v3"
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kubectl"
)
