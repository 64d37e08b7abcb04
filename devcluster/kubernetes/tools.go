//go:build tools

// The commands this module builds. The build tag keeps this file out of every build: it only makes
// `go mod tidy` keep their dependencies in go.sum.
package controlplane

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
)
