package kubeletnode_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/common/expfmt"
	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/klog/v2/ktesting"
	"k8s.io/utils/ptr"

	"github.com/dynamig/dynamig/api"
	"github.com/dynamig/dynamig/config"
	"github.com/dynamig/dynamig/deviceplugin/cdi"
	"github.com/dynamig/dynamig/deviceplugin/daemon"
	"github.com/dynamig/dynamig/deviceplugin/metrics"
	"github.com/dynamig/dynamig/deviceplugin/podresources"
	"github.com/dynamig/dynamig/nvml/sim"
	"github.com/dynamig/dynamig/signing"
	"github.com/dynamig/dynamig/test/kubeletnode"
)

// TestDaemonOnTheRealKubelet runs the device plugin's daemon on a simulated A100-PCIE-40GB
// against the real kubelet and API server. It publishes the inventory and heartbeat and
// registers seven devices; the seed pod (two signed 2g.10gb reservations, bound without a
// scheduler) runs: at PreStartContainer its two instances are created at the reserved
// placements, the container gets them through the CDI names Allocate answered (its
// NVIDIA_VISIBLE_DEVICES are exactly their MIG UUIDs), and the identity is written back.
// Deleting the pod reclaims them. A GPU that falls off the bus leaves no device allocatable.
func TestDaemonOnTheRealKubelet(t *testing.T) {
	const node = "mig-node"
	_, ctx := ktesting.NewTestContext(t)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	n, client := kubeletnode.StartTestNode(t, node)
	// The daemon starts once the kubelet registered the Node, as a DaemonSet's pod does.
	waitFor(t, "the kubelet to register the Node", time.Minute, func() (bool, string) {
		_, err := client.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
		return err == nil, fmt.Sprint(err)
	})
	s, err := sim.New(sim.Options{Seed: node}, sim.GPUSpec{Model: "NVIDIA A100-PCIE-40GB"})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Init(); err != nil {
		t.Fatal(err)
	}
	cfg, err := config.ParseDeviceConfig([]byte("nodeconfig:\n- name: mig-node\n  operatingmode: mig\n"))
	if err != nil {
		t.Fatal(err)
	}
	// The scheduler's signing key, made and published as dynamig-scheduler does on start.
	key, err := signing.LoadSigningKey(ctx, client, api.DefaultSigningKeyNamespace, api.DefaultSystemNamespace, true)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	readiness := &daemon.Readiness{}
	if err := readiness.Check(nil); err == nil || !strings.Contains(err.Error(), "starting") {
		t.Errorf("readiness before Run: %v, want starting", err)
	}
	go func() {
		done <- daemon.Run(ctx, daemon.Options{NodeName: node, Client: client, NVML: s, DeviceConfig: cfg,
			SocketDir: n.DevicePluginDir, PodResourcesSocket: n.PodResourcesSocket, CDISpecDir: n.CDIDir,
			InventoryInterval: 200 * time.Millisecond, ReclaimInterval: time.Hour, HealthRecheck: 200 * time.Millisecond, Readiness: readiness})
	}()
	defer func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("daemon: %v", err)
			}
		case <-time.After(10 * time.Second):
			t.Error("the daemon did not stop")
		}
	}()
	waitDevices(t, client, node, api.ResourceCount, 7, 7)
	if err := readiness.Check(nil); err != nil {
		t.Errorf("readiness while the kubelet lists the plugin's devices: %v", err)
	}
	nd, err := client.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if gpus, err := api.DecodeInventory(nd.Annotations[api.NodeInventoryAnnotation]); err != nil || len(gpus) != 1 || len(gpus[0].MigProfiles) != 4 {
		t.Errorf("inventory: %v %v", gpus, err)
	}
	waitFor(t, "the heartbeat", 10*time.Second, func() (bool, string) {
		_, err := client.CoordinationV1().Leases(api.DefaultSystemNamespace).Get(ctx, api.HeartbeatLeaseName(node), metav1.GetOptions{})
		return err == nil, fmt.Sprint(err)
	})

	// The seed pod, bound here with its signed reservation as dynamig-scheduler's Binding
	// does it: the signature covers the pod's UID, which the API server assigns at create.
	gpu := s.Snapshot()[0].UUID
	recs := []api.MigReservation{
		{ContainerIndex: 0, DeviceIndex: 0, GPUUUID: gpu, Profile: "2g.10gb", Placement: api.Placement{Start: 0, Size: 2}},
		{ContainerIndex: 0, DeviceIndex: 1, GPUUUID: gpu, Profile: "2g.10gb", Placement: api.Placement{Start: 2, Size: 2}},
	}
	raw, err := api.EncodeMigReservations(recs)
	if err != nil {
		t.Fatal(err)
	}
	pod := create(t, client, &v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "gpu-pod1", Namespace: "default"}, Spec: v1.PodSpec{
		AutomountServiceAccountToken: ptr.To(false),
		Containers: []v1.Container{{Name: "ubuntu", Image: "ubuntu:22.04", Resources: v1.ResourceRequirements{Limits: v1.ResourceList{
			api.ResourceCount: resource.MustParse("2")}}}}}})
	annotations := map[string]string{api.MigReservationsAnnotation: raw, api.BindPhaseAnnotation: api.BindPhaseAllocating}
	if err := api.SignReservation(key, string(pod.UID), node, annotations); err != nil {
		t.Fatal(err)
	}
	if err := client.CoreV1().Pods("default").Bind(ctx, &v1.Binding{
		ObjectMeta: metav1.ObjectMeta{Name: pod.Name, Namespace: pod.Namespace, UID: pod.UID, Annotations: annotations},
		Target:     v1.ObjectReference{Kind: "Node", Name: node},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitPhase(t, client, pod, v1.PodRunning, time.Minute)

	// The instances exist at the reserved placements.
	gis := s.Snapshot()[0].GpuInstances
	if len(gis) != 2 || gis[0].Placement != recs[0].Placement || gis[1].Placement != recs[1].Placement || len(gis[0].ComputeInstances) != 1 || len(gis[1].ComputeInstances) != 1 {
		t.Fatalf("instances: %+v", gis)
	}
	migUUIDs := []string{gis[0].ComputeInstances[0].MigUUID, gis[1].ComputeInstances[0].MigUUID}
	// The container got them through the CDI names of the devices the kubelet assigned.
	c, ok := n.Runtime.Latest(pod.UID, "ubuntu")
	if !ok {
		t.Fatal("no container created")
	}
	if got, want := c.Env["NVIDIA_VISIBLE_DEVICES"], strings.Join(migUUIDs, ","); got != want {
		t.Errorf("the container sees NVIDIA_VISIBLE_DEVICES=%q, want its two instances %q", got, want)
	}
	byName := map[string]string{}
	for i := range 7 {
		id := fmt.Sprintf("%s::%d", gpu, i)
		byName[cdi.QualifiedName(node, id)] = id
	}
	var ids []string
	for _, name := range c.CDIDevices {
		if id, ok := byName[name]; ok && !slices.Contains(ids, id) {
			ids = append(ids, id)
		}
	}
	if len(ids) != 2 || len(c.CDIDevices) != 2 {
		t.Errorf("CDI devices %v, want two of the GPU's device IDs' names", c.CDIDevices)
	} else if owner, err := dialPodResources(t, n).Find(ctx, api.ResourceCount, ids); err != nil || owner != (podresources.Owner{Namespace: "default", Pod: "gpu-pod1", Container: "ubuntu"}) {
		t.Errorf("PodResources on %v: %v, %v", ids, owner, err)
	}
	// The runtime identity is written back, and the bind phase is success.
	got, err := client.CoreV1().Pods("default").Get(ctx, "gpu-pod1", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	realised, err := api.DecodeMigReservations(got.Annotations[api.MigReservationsAnnotation])
	if err != nil || len(realised) != 2 || got.Annotations[api.BindPhaseAnnotation] != api.BindPhaseSuccess {
		t.Fatalf("write-back: %v %v", got.Annotations, err)
	}
	for i, r := range realised {
		if !r.Realized() || r.MigUUID != migUUIDs[i] || r.Placement != recs[i].Placement || *r.GPUInstanceID != uint32(gis[i].ID) {
			t.Errorf("reservation %d written back as %+v, want the instance %+v", i, r, gis[i])
		}
	}
	// The metrics show the PreStart and the two instances with their pod.
	text := gatherMetrics(t)
	if n := strings.Count(text, `dynamig_mig_instance{`); n != 2 || strings.Count(text, `pod_name="gpu-pod1"`) != 2 ||
		!strings.Contains(text, `dynamig_device_plugin_prestart_duration_seconds_count{result="ok"} 1`) {
		t.Errorf("metrics:\n%s", text)
	}

	// XID 79 on the GPU, a reset pending: its devices go unhealthy at the kubelet and in the
	// inventory, and Warning events on the Node and the running pod say why; an application's
	// XID (31) changes nothing. Healthy again when NVML no longer needs a reset.
	s.InjectXID(0, 31, -1, -1)
	s.SetResetPending(0, true)
	s.InjectXID(0, 79, -1, -1)
	waitDevices(t, client, node, api.ResourceCount, 7, 0)
	nd, err = client.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if gpus, err := api.DecodeInventory(nd.Annotations[api.NodeInventoryAnnotation]); err != nil || len(gpus) != 1 || gpus[0].Health {
		t.Errorf("inventory after XID 79: %v %v", gpus, err)
	}
	waitFor(t, "GPUUnhealthy events on the node and the pod", 30*time.Second, func() (bool, string) {
		evs, err := client.CoreV1().Events("").List(ctx, metav1.ListOptions{FieldSelector: "reason=GPUUnhealthy"})
		if err != nil {
			return false, err.Error()
		}
		on := map[string]string{}
		for _, e := range evs.Items {
			on[e.InvolvedObject.Kind+"/"+e.InvolvedObject.Name] = e.Message
		}
		return strings.Contains(on["Node/"+node], "XID 79") && strings.Contains(on["Pod/gpu-pod1"], "XID 79"), fmt.Sprint(on)
	})
	s.SetResetPending(0, false)
	waitDevices(t, client, node, api.ResourceCount, 7, 7)

	// The pod is deleted: the kubelet stops it, and its instances are reclaimed.
	if err := client.CoreV1().Pods("default").Delete(ctx, "gpu-pod1", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the pod gone and its instances reclaimed", time.Minute, func() (bool, string) {
		_, err := client.CoreV1().Pods("default").Get(ctx, "gpu-pod1", metav1.GetOptions{})
		gis := s.Snapshot()[0].GpuInstances
		return apierrors.IsNotFound(err) && len(gis) == 0, fmt.Sprintf("pod: %v; instances %+v", err, gis)
	})
	if text := gatherMetrics(t); strings.Contains(text, `dynamig_mig_instance{`) {
		t.Errorf("metrics still list instances:\n%s", text)
	}

	// The GPU falls off the bus: its device is published unhealthy, and the kubelet offers none.
	s.LoseGPU(0)
	waitDevices(t, client, node, api.ResourceCount, 1, 0)
}

// gatherMetrics is the device plugin's metrics registry in the text format.
func gatherMetrics(t *testing.T) string {
	t.Helper()
	families, err := metrics.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var text strings.Builder
	for _, f := range families {
		if _, err := expfmt.MetricFamilyToText(&text, f); err != nil {
			t.Fatal(err)
		}
	}
	return text.String()
}
