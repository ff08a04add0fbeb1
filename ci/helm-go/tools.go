//go:build tools

// Package tools pins the command ci/helm builds (the helm CLI), so that
// `go mod tidy` keeps its whole dependency graph in go.mod and go.sum.
package tools

import (
	_ "helm.sh/helm/v3/cmd/helm"
)
