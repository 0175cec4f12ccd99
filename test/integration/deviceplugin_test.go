package integration

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/dynamig/dynamig/api"
	"github.com/dynamig/dynamig/cmd/dynamig-device-plugin/app"
	"github.com/dynamig/dynamig/deviceplugin/checkpoint"
	"github.com/dynamig/dynamig/test/cluster"
	"github.com/dynamig/dynamig/test/kubelet"
)

// TestDevicePluginEndToEnd runs `dynamig-device-plugin run --nvml=sim` (the command's own
// code, in-process) against the API server and a kubelet stand-in's socket directory, with
// the real dynamig-scheduler: the seed pods are bound, kubelet admits them (Allocate), their
// instances are realised and written back, and a deleted pod's instances are reclaimed.
func TestDevicePluginEndToEnd(t *testing.T) {
	e := newEnv(t, "dp")
	ns := e.ns + "-real" // the stand-in device plugin does not watch this namespace
	if _, err := e.admin.CoreV1().Namespaces().Create(e.ctx, &v1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	const node = "dp-node"
	// The Node as kubelet registers it; the device plugin adds the inventory.
	resources := v1.ResourceList{v1.ResourceCPU: resource.MustParse("32"), v1.ResourceMemory: resource.MustParse("256Gi"),
		v1.ResourcePods: resource.MustParse("110"), api.ResourceCount: resource.MustParse("7")}
	created, err := e.admin.CoreV1().Nodes().Create(e.ctx, &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: node}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	e.mu.Lock()
	e.nodes = append(e.nodes, node)
	e.mu.Unlock()
	now := metav1.Now()
	created.Status = v1.NodeStatus{Capacity: resources, Allocatable: resources,
		Conditions: []v1.NodeCondition{{Type: v1.NodeReady, Status: v1.ConditionTrue, Reason: "KubeletReady", LastHeartbeatTime: now, LastTransitionTime: now}}}
	if _, err := e.admin.CoreV1().Nodes().UpdateStatus(e.ctx, created, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}

	dir, err := os.MkdirTemp("", "dp")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	ctx, cancel := context.WithCancel(e.ctx)
	kl, err := kubelet.Start(ctx, dir)
	if err != nil {
		t.Fatal(err)
	}
	kubeconfig, err := cp.WriteKubeconfig(cluster.UserDevicePlugin)
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		if code := app.MainContext(ctx, []string{"run", "--nvml=sim", "--sim-gpus=NVIDIA A100-PCIE-40GB:1", "--node-name=" + node,
			"--kubeconfig=" + kubeconfig, "--kubelet-socket-dir=" + dir, "--metrics-bind-address="}, &out, &out); code != 0 && ctx.Err() == nil {
			t.Errorf("dynamig-device-plugin run exited %d: %s", code, out.String())
		}
	}()
	defer func() { cancel(); wg.Wait(); kl.Stop() }()
	wctx, wcancel := context.WithTimeout(ctx, 20*time.Second)
	defer wcancel()
	if err := kl.WaitForResource(wctx, api.ResourceCount, 7); err != nil {
		t.Fatalf("the device plugin did not register: %v\n%s", err, out.String())
	}
	e.waitFor(10*time.Second, "the inventory and heartbeat", func() (bool, string) {
		n, err := e.admin.CoreV1().Nodes().Get(e.ctx, node, metav1.GetOptions{})
		if err != nil || n.Annotations[api.NodeInventoryAnnotation] == "" {
			return false, "no inventory"
		}
		_, err = e.admin.CoordinationV1().Leases(api.DefaultSystemNamespace).Get(e.ctx, api.HeartbeatLeaseName(node), metav1.GetOptions{})
		return err == nil, "no heartbeat"
	})
	e.startScheduler()

	// kubelet: admit every pod bound here, once, in binding order.
	admitted := map[types.UID]bool{}
	var admitErrs []string
	admit := func() {
		list, err := e.admin.CoreV1().Pods(ns).List(e.ctx, metav1.ListOptions{})
		if err != nil {
			return
		}
		for i := range list.Items {
			p := &list.Items[i]
			if p.Spec.NodeName != node || admitted[p.UID] {
				continue
			}
			admitted[p.UID] = true
			if _, err := kl.Admit(ctx, p); err != nil {
				admitErrs = append(admitErrs, p.Name+": "+err.Error())
			}
		}
	}
	pod := func(name string, devices int) *v1.Pod {
		p := e.gpuPod(name, api.ModeMIG, [2]int{devices, 8000})
		p.Namespace = ns
		return p
	}
	for _, p := range []*v1.Pod{pod("gpu-pod1", 2), pod("mig-workload", 1)} {
		if _, err := e.admin.CoreV1().Pods(ns).Create(e.ctx, p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	var recs []api.MigReservation
	e.waitFor(60*time.Second, "both seed pods realised", func() (bool, string) {
		admit()
		recs = nil
		for _, name := range []string{"gpu-pod1", "mig-workload"} {
			p, err := e.admin.CoreV1().Pods(ns).Get(e.ctx, name, metav1.GetOptions{})
			if err != nil || p.Annotations[api.BindPhaseAnnotation] != api.BindPhaseSuccess {
				return false, name + " not realised; admission errors: " + strings.Join(admitErrs, "; ")
			}
			r, err := api.DecodeMigReservations(p.Annotations[api.MigReservationsAnnotation])
			if err != nil {
				return false, err.Error()
			}
			recs = append(recs, r...)
		}
		return true, ""
	})
	if len(recs) != 3 {
		t.Fatalf("want three reservations: %+v", recs)
	}
	for i, r := range recs {
		if r.Profile != "2g.10gb" || !r.Realized() {
			t.Errorf("reservation %d: %+v", i, r)
		}
		for _, o := range recs[:i] {
			if o.Placement.Overlaps(r.Placement) || o.MigUUID == r.MigUUID {
				t.Errorf("overlap or shared instance: %+v and %+v", o, r)
			}
		}
	}
	entries := func() []checkpoint.Entry {
		data, err := os.ReadFile(filepath.Join(dir, "dynamig.checkpoint"))
		if err != nil {
			return nil
		}
		var f struct{ Entries []checkpoint.Entry }
		_ = json.Unmarshal(data, &f)
		return f.Entries
	}
	if got := entries(); len(got) != 3 {
		t.Errorf("checkpoint entries: %+v", got)
	}
	// Deleting gpu-pod1 reclaims exactly its two instances.
	gone, _ := e.admin.CoreV1().Pods(ns).Get(e.ctx, "gpu-pod1", metav1.GetOptions{})
	if err := e.admin.CoreV1().Pods(ns).Delete(e.ctx, "gpu-pod1", metav1.DeleteOptions{GracePeriodSeconds: new(int64)}); err != nil {
		t.Fatal(err)
	}
	kl.Release(gone.UID)
	e.waitFor(30*time.Second, "gpu-pod1's instances reclaimed", func() (bool, string) {
		got := entries()
		return len(got) == 1 && got[0].PodName == "mig-workload", "checkpoint still lists " + names(got)
	})
	if err := e.admin.CoreV1().Pods(ns).DeleteCollection(e.ctx, metav1.DeleteOptions{GracePeriodSeconds: new(int64)}, metav1.ListOptions{}); err != nil {
		t.Error(err)
	}
}

func names(es []checkpoint.Entry) string {
	var out []string
	for _, e := range es {
		out = append(out, e.PodName)
	}
	return strings.Join(out, ",")
}
