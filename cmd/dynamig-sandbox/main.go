// Command dynamig-sandbox runs a whole dynamig cluster on one machine: etcd, the real
// kube-apiserver, kube-controller-manager and dynamig-scheduler in-process, and simulated
// GPU nodes, each the real kubelet (a process in a private mount namespace, on a fake
// container runtime that resolves CDI devices) with the real dynamig-device-plugin on
// simulated NVML. No Docker, no
// containers, no GPU; nothing on the host changes.
//
//	dynamig-sandbox [--config sandbox.yaml] [--kubeconfig-out PATH] [--state-out PATH] [--install manifests/install.yaml] [--kubelet bin/kubelet-1.37] [-v[=N]]
//	dynamig-sandbox demo [--examples examples/] [--install ...] [--kubelet ...] [--timeout 2m] [-v[=N]]
//
// The first form runs until SIGINT or SIGTERM and prints `ready` on stdout once every node
// has registered its devices and published its inventory. The second starts the default
// world, applies the example pods, waits until they run with realised MIG reservations,
// prints the reservations and each GPU's occupancy, deletes them, scales a Deployment of GPU
// pods up and down, and stops.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}
