//go:build tools

// Package hack pins k8s.io/kubernetes (and through the replace block of go.mod its staging
// modules) at the version the scheduler is built against, before any package imports it.
package hack

import (
	_ "go.etcd.io/etcd/server/v3/embed"
	_ "k8s.io/kubernetes/cmd/kube-apiserver/app/testing"
	_ "k8s.io/kubernetes/cmd/kube-scheduler/app"
)
