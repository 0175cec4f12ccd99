// Command dynamig-sandbox runs a whole dynamig cluster in one process: etcd, the real
// kube-apiserver, the real dynamig-scheduler, and simulated GPU nodes, each with the real
// dynamig-device-plugin on simulated NVML and a kubelet stand-in. No Docker, no kubelet, no
// GPU.
//
//	dynamig-sandbox [--config sandbox.yaml] [--kubeconfig-out PATH] [--state-out PATH] [--scheduler-config manifests/scheduler-config.yaml] [-v[=N]]
//	dynamig-sandbox demo [--examples examples/] [--scheduler-config ...] [--timeout 2m] [-v[=N]]
//
// The first form runs until SIGINT or SIGTERM and prints `ready` on stdout once every node
// has registered its devices and published its inventory. The second starts the default
// world, applies the example pods, waits until they run with realised MIG reservations,
// prints the reservations and each GPU's occupancy, and stops.
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
