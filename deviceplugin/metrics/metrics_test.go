package metrics

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/prometheus/common/expfmt"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"

	"github.com/dynamig/dynamig/api"
	"github.com/dynamig/dynamig/deviceplugin/checkpoint"
	"github.com/dynamig/dynamig/deviceplugin/instances"
	"github.com/dynamig/dynamig/nvml/sim"
	"github.com/dynamig/dynamig/test/metricsdoc"
)

// migPod is a pod on the node with a MIG reservation for its sidecar (containerIndex 0, an
// init container) and its main container, the main container's realised when realised.
func migPod(t *testing.T, name string, phase v1.PodPhase, realised bool) *v1.Pod {
	t.Helper()
	recs := []api.MigReservation{
		{ContainerIndex: 0, DeviceIndex: 0, GPUUUID: "GPU-a", Profile: "1g.5gb", Placement: api.Placement{Start: 6, Size: 1}},
		{ContainerIndex: 1, DeviceIndex: 0, GPUUUID: "GPU-a", Profile: "3g.20gb", Placement: api.Placement{Start: 0, Size: 4}},
	}
	if realised {
		recs[1].SetRuntime("MIG-b", 2, 0)
	}
	raw, err := api.EncodeMigReservations(recs)
	if err != nil {
		t.Fatal(err)
	}
	always := v1.ContainerRestartPolicyAlways
	return &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name, Annotations: map[string]string{api.MigReservationsAnnotation: raw}},
		Spec: v1.PodSpec{NodeName: "n",
			InitContainers: []v1.Container{{Name: "sidecar", RestartPolicy: &always}},
			Containers:     []v1.Container{{Name: "main"}}},
		Status: v1.PodStatus{Phase: phase},
	}
}

// TestHAMiMigDeviceInfo: the device plugin exports HAMi's vGPU monitor series for each
// realised MIG reservation of the node's running pods, naming the container; every series
// docs/metrics.md's HAMi table says metrics.go exports has a sample with the table's labels.
func TestHAMiMigDeviceInfo(t *testing.T) {
	s, err := sim.New(sim.Options{Seed: "n"}, sim.GPUSpec{Model: "NVIDIA A100-PCIE-40GB"})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Init(); err != nil {
		t.Fatal(err)
	}
	mgr, err := instances.New(s)
	if err != nil {
		t.Fatal(err)
	}
	cp, err := checkpoint.Open(filepath.Join(t.TempDir(), "checkpoint"))
	if err != nil {
		t.Fatal(err)
	}
	pods := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{})
	for _, p := range []*v1.Pod{
		migPod(t, "running", v1.PodRunning, true),
		migPod(t, "pending", v1.PodPending, false), // not realised yet: no series
		migPod(t, "ended", v1.PodSucceeded, true),  // its instance is reclaimed: no series
	} {
		if err := pods.Add(p); err != nil {
			t.Fatal(err)
		}
	}
	defer AddSource(&Source{Instances: mgr, Checkpoint: cp, Pods: corelisters.NewPodLister(pods)})()

	families, err := Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	for _, f := range families {
		if _, err := expfmt.MetricFamilyToText(&b, f); err != nil {
			t.Fatal(err)
		}
	}
	out := b.String()
	want := `hami_mig_device_info{compute_instance_id="0",container="main",device_uuid="GPU-a",gpu_instance_id="2",mig_uuid="MIG-b",namespace="ns",pod="running",profile="3g.20gb",vdevice_index="0",zone="vGPU"} 1` + "\n"
	if !strings.Contains(out, want) || strings.Count(out, "\nhami_mig_device_info{") != 1 {
		t.Errorf("want only %s\ngot:\n%s", want, out)
	}
	if n := metricsdoc.CheckScraped(t, Registry, metricsdoc.DevicePluginFile); n != 1 {
		t.Errorf("the HAMi table lists %d series of %s, want hami_mig_device_info", n, metricsdoc.DevicePluginFile)
	}
}
