package daemon

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/klog/v2/ktesting"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
	"k8s.io/utils/ptr"

	"github.com/prometheus/common/expfmt"

	"github.com/dynamig/dynamig/api"
	"github.com/dynamig/dynamig/config"
	"github.com/dynamig/dynamig/deviceplugin/metrics"
	"github.com/dynamig/dynamig/nvml/sim"
	"github.com/dynamig/dynamig/signing"
	"github.com/dynamig/dynamig/test/kubelet"
)

const node = "mig-node"

// TestSeedExampleThroughKubelet runs the daemon against a kubelet stand-in speaking the
// real v1beta1 gRPC API: it registers, advertises the A100's seven devices, creates the
// seed pod's two 2g.10gb instances when kubelet admits the pod, writes their identity back,
// and reclaims them when the pod is deleted.
func TestSeedExampleThroughKubelet(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	dir, err := os.MkdirTemp("", "dp") // short: unix socket paths are limited
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	kl, err := kubelet.Start(ctx, dir)
	if err != nil {
		t.Fatal(err)
	}
	defer kl.Stop()

	s, err := sim.New(sim.Options{Seed: node}, sim.GPUSpec{Model: "NVIDIA A100-PCIE-40GB"})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Init(); err != nil {
		t.Fatal(err)
	}
	client := fake.NewClientset(&v1.Node{ObjectMeta: metav1.ObjectMeta{Name: node}})
	cfg, _ := config.ParseDeviceConfig([]byte("nodeconfig:\n- name: mig-node\n  operatingmode: mig\n"))
	// The scheduler's signing key, made and published as dynamig-scheduler does on start.
	key, err := signing.LoadSigningKey(ctx, client, api.DefaultSigningKeyNamespace, api.DefaultSystemNamespace, true)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		done <- Run(ctx, Options{NodeName: node, Client: client, NVML: s, DeviceConfig: cfg, SocketDir: dir, ReclaimInterval: time.Hour})
	}()
	wctx, wcancel := context.WithTimeout(ctx, 10*time.Second)
	defer wcancel()
	if err := kl.WaitForResource(wctx, api.ResourceCount, 7); err != nil {
		t.Fatalf("the plugin did not register seven devices: %v", err)
	}
	// The node's inventory is published and the heartbeat renewed.
	n, _ := client.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
	if gpus, err := api.DecodeInventory(n.Annotations[api.NodeInventoryAnnotation]); err != nil || len(gpus[0].MigProfiles) != 4 {
		t.Errorf("inventory: %v %v", gpus, err)
	}
	// The heartbeat runs beside the kubelet registration: wait for its first renewal.
	var heartbeatErr error
	if err := wait.PollUntilContextTimeout(wctx, 10*time.Millisecond, 5*time.Second, true, func(ctx context.Context) (bool, error) {
		_, heartbeatErr = client.CoordinationV1().Leases(api.DefaultSystemNamespace).Get(ctx, api.HeartbeatLeaseName(node), metav1.GetOptions{})
		return heartbeatErr == nil, nil
	}); err != nil {
		t.Errorf("heartbeat: %v", heartbeatErr)
	}

	// The scheduler's Binding and hand-off, as dynamig-scheduler writes them.
	gpu := s.Snapshot()[0].UUID
	recs := []api.MigReservation{
		{ContainerIndex: 0, DeviceIndex: 0, GPUUUID: gpu, Profile: "2g.10gb", Placement: api.Placement{Start: 0, Size: 2}},
		{ContainerIndex: 0, DeviceIndex: 1, GPUUUID: gpu, Profile: "2g.10gb", Placement: api.Placement{Start: 2, Size: 2}},
	}
	raw, _ := api.EncodeMigReservations(recs)
	pod := &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "gpu-pod1", Namespace: "default", UID: "uid-1", Annotations: map[string]string{
			api.MigReservationsAnnotation: raw, api.BindPhaseAnnotation: api.BindPhaseAllocating}},
		Spec: v1.PodSpec{NodeName: node, Containers: []v1.Container{{Name: "ubuntu", Resources: v1.ResourceRequirements{Limits: v1.ResourceList{
			api.ResourceCount: resource.MustParse("2"), api.ResourceMemory: resource.MustParse("8000")}}}}},
	}
	if err := api.SignReservation(key, string(pod.UID), node, pod.Annotations); err != nil {
		t.Fatal(err)
	}
	if _, err := client.CoreV1().Pods("default").Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := client.CoordinationV1().Leases(api.DefaultSystemNamespace).Create(ctx, &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Name: api.HandoffLeaseName(node), Namespace: api.DefaultSystemNamespace},
		Spec:       coordinationv1.LeaseSpec{HolderIdentity: ptr.To("default/gpu-pod1/uid-1")},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	resps, err := kl.Admit(ctx, pod)
	if err != nil {
		t.Fatalf("admission: %v", err)
	}
	env := resps["ubuntu"].Envs["NVIDIA_VISIBLE_DEVICES"]
	if len(strings.Split(env, ",")) != 2 {
		t.Errorf("NVIDIA_VISIBLE_DEVICES=%q", env)
	}
	gis := s.Snapshot()[0].GpuInstances
	if len(gis) != 2 || gis[0].Placement != recs[0].Placement || gis[1].Placement != recs[1].Placement {
		t.Fatalf("instances: %+v", gis)
	}
	got, _ := client.CoreV1().Pods("default").Get(ctx, "gpu-pod1", metav1.GetOptions{})
	realised, err := api.DecodeMigReservations(got.Annotations[api.MigReservationsAnnotation])
	if err != nil || !realised[0].Realized() || !realised[1].Realized() || got.Annotations[api.BindPhaseAnnotation] != api.BindPhaseSuccess {
		t.Errorf("write-back: %v %v", got.Annotations, err)
	}
	// The metrics show the two instances with their pod, and the Allocate.
	families, _ := metrics.Registry.Gather()
	var text strings.Builder
	for _, f := range families {
		expfmt.MetricFamilyToText(&text, f)
	}
	if n := strings.Count(text.String(), `dynamig_mig_instance{`); n != 2 || !strings.Contains(text.String(), `pod_name="gpu-pod1"`) ||
		!strings.Contains(text.String(), `dynamig_device_plugin_allocate_duration_seconds_count{result="ok"} 1`) {
		t.Errorf("metrics:\n%s", text.String())
	}
	// Admitting again (a container restart) calls no Allocate and creates nothing.
	if _, err := kl.Admit(ctx, pod); err != nil || len(s.Snapshot()[0].GpuInstances) != 2 {
		t.Errorf("re-admission: %v", err)
	}

	// Kubelet restarts: the plugin registers again.
	if err := kl.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	if err := kl.WaitForResource(wctx, api.ResourceCount, 7); err != nil {
		t.Fatalf("no re-registration after a kubelet restart: %v", err)
	}

	// The pod is deleted: its instances are reclaimed (the pod informer triggers it).
	if err := client.CoreV1().Pods("default").Delete(ctx, "gpu-pod1", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := wait.PollUntilContextTimeout(ctx, 20*time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) {
		return len(s.Snapshot()[0].GpuInstances) == 0, nil
	}); err != nil {
		t.Errorf("instances not reclaimed after deletion: %+v", s.Snapshot()[0].GpuInstances)
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("daemon: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Error("daemon did not stop")
	}
}

func TestEnableMIGMode(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	s, _ := sim.New(sim.Options{Seed: "n", MigModeNeedsReset: true}, sim.GPUSpec{Model: "A100-40GB", MigDisabled: true}, sim.GPUSpec{Model: "A100-40GB"})
	s.Init()
	if err := enableMIGMode(ctx, s); err != nil {
		t.Fatal(err)
	}
	st := s.Snapshot()
	if st[0].MigEnabled || !st[0].MigPending || !st[1].MigEnabled {
		t.Fatalf("MIG mode must be pending a reset on GPU 0: %+v", st)
	}
	if err := s.ResetGPU(0); err != nil || !s.Snapshot()[0].MigEnabled {
		t.Errorf("after the operator's reset MIG mode is on: %v", err)
	}
}

func TestLostGPUIsUnhealthyInListAndWatch(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	dir, _ := os.MkdirTemp("", "dp")
	defer os.RemoveAll(dir)
	kl, err := kubelet.Start(ctx, dir)
	if err != nil {
		t.Fatal(err)
	}
	defer kl.Stop()
	s, _ := sim.New(sim.Options{Seed: node}, sim.GPUSpec{Model: "A30"}, sim.GPUSpec{Model: "A30"})
	s.Init()
	client := fake.NewClientset(&v1.Node{ObjectMeta: metav1.ObjectMeta{Name: node}})
	done := make(chan error, 1)
	go func() {
		done <- Run(ctx, Options{NodeName: node, Client: client, NVML: s, DeviceConfig: config.DefaultDeviceConfig(), SocketDir: dir,
			InventoryInterval: 50 * time.Millisecond, ReclaimInterval: time.Hour})
	}()
	wctx, wcancel := context.WithTimeout(ctx, 10*time.Second)
	defer wcancel()
	if err := kl.WaitForResource(wctx, api.ResourceCount, 8); err != nil {
		t.Fatal(err)
	}
	s.LoseGPU(1)
	if err := kl.WaitForDevices(wctx, api.ResourceCount, func(devs []*pluginapi.Device) bool {
		unhealthy := 0
		for _, d := range devs {
			if d.Health == pluginapi.Unhealthy {
				unhealthy++
			}
		}
		return unhealthy == 1 && len(devs) == 5
	}); err != nil {
		t.Errorf("kubelet must see the lost GPU's device unhealthy: %v (%d devices)", err, len(kl.Devices(api.ResourceCount)))
	}
	cancel()
	<-done
}
