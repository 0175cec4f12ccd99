package kubeletnode

import (
	"context"
	"os"
	"testing"

	"k8s.io/client-go/kubernetes"

	"github.com/dynamig/dynamig/test/cluster"
)

// StartTestNode starts a control plane and one kubelet named name for a test, both stopped
// when it ends (the kubelet's output is logged if it failed). It returns the node and an
// admin client; the caller waits for what it needs (the Node Ready, devices advertised).
func StartTestNode(t *testing.T, name string) (*Node, kubernetes.Interface) {
	t.Helper()
	kubelet, err := Binary()
	if err != nil {
		t.Fatal(err)
	}
	cp, err := cluster.Start(t, cluster.Options{})
	if err != nil {
		t.Fatal(err)
	}
	client, err := cp.Client(cluster.UserAdmin)
	if err != nil {
		t.Fatal(err)
	}
	dir, err := os.MkdirTemp("", name) // short: unix socket paths are limited
	if err != nil {
		t.Fatal(err)
	}
	log := &LogBuffer{}
	n, err := Start(context.Background(), Options{Kubelet: kubelet, Kubeconfig: cp.Kubeconfig, NodeName: name, Dir: dir, Log: log})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		n.Stop()
		if t.Failed() {
			out := log.String()
			t.Logf("kubelet output (last 20000 bytes):\n%s", out[max(0, len(out)-20000):])
		}
		_ = os.RemoveAll(dir)
	})
	return n, client
}
