//go:build tools

// Package tools pins kube-controller-manager, which `ci/kube-up --with-gc`
// builds and runs with only its garbage collector. It is a module of its
// own, at the same k8s.io/kubernetes release and staging replaces as
// ../go.mod (ci/kube-up refuses to build if the two differ), so that adding
// it did not change the pin of the binaries every test uses: their cached
// build stays valid.
package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
)
