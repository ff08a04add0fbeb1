//go:build tools

// Package tools pins what ci/node-up builds and runs for a real node joined
// to ci/kube-up's API server: the kubelet, the scheduler and the
// controller-manager (a DaemonSet needs both). A module of its own at the
// same k8s.io/kubernetes release and staging replaces as ../go.mod
// (ci/node-up refuses to build if the two differ), so that adding it
// changed no other cached build.
package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "k8s.io/kubernetes/cmd/kubelet"
)
