package dynamicmig

import (
	"fmt"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"

	"github.com/dynamig/dynamig/api"
	"github.com/dynamig/dynamig/config"
	"github.com/dynamig/dynamig/test/metricsdoc"
)

// TestHAMiSeries: with a MIG pod (two instances of one GPU in one container, realised) and a
// hami-core pod placed, and legacyMetrics on, the scheduler exports HAMi's series with HAMi's
// units: every series docs/metrics.md's HAMi table says collector.go exports has a sample
// with exactly the labels the table lists, and the values are the reservations'.
func TestHAMiSeries(t *testing.T) {
	migNode := gpuNode(t, "mig-node", api.ModeMIG, "A100-40GB")
	quota := gpuQuotaObject("gpu", map[string]int64{"limits." + api.ResourceMemory: 100000, "limits." + api.ResourceCores: 90})
	e := newEnv(t, &config.DynamicMIGArgs{LegacyMetrics: true}, []*v1.Node{migNode, gpuNode(t, "core-node", api.ModeHAMiCore, "A100-40GB")}, quota)
	gpus, err := api.DecodeInventory(migNode.Annotations[api.NodeInventoryAnnotation])
	if err != nil || len(gpus) != 1 {
		t.Fatalf("inventory %v, %v", gpus, err)
	}
	gpu := gpus[0]
	recs := e.mustSchedule(gpuPod("m", api.ModeMIG, [2]int{2, 8000}))
	if len(recs) != 2 || recs[0].GPUUUID != recs[1].GPUUUID {
		t.Fatalf("want two instances of one GPU: %v", recs)
	}
	core, statuses := e.schedule(gpuPod("h", api.ModeHAMiCore, [2]int{1, 4000}))
	if core == nil {
		t.Fatalf("hami-core pod unschedulable: %s", reasons(statuses))
	}
	shares, err := api.DecodeHAMiCoreDevices(api.DevicesAllocatedAnnotation, core.Annotations[api.DevicesAllocatedAnnotation])
	if err != nil || len(shares) != 1 || len(shares[0]) != 1 {
		t.Fatalf("hami-core shares %v, %v", shares, err)
	}
	// The device plugin realises both instances.
	p := e.pod("m")
	for i := range recs {
		recs[i].SetRuntime(fmt.Sprintf("MIG-%d", i), uint32(3+i), 0)
	}
	e.realise(p, recs)
	var out string
	waitFor(t, func() bool {
		out = scrape(t)
		return strings.Contains(out, `mig_uuid="MIG-1"`) && strings.Contains(out, `pod="h"`)
	})

	mig, share := recs[0].GPUUUID, shares[0][0]
	profile, _ := gpu.Profile("2g.10gb")
	reserved := 2 * profile.MemoryMB
	migMemory := fmt.Sprint(float64(reserved) * (1 << 20))
	typ, devmem := `device_type="`+gpu.Type+`"`, fmt.Sprint(gpu.Devmem)
	for _, want := range []string{
		// Per GPU, in bytes and devcore units.
		`hami_gpu_memory_limit_bytes{device_index="0",` + typ + `,device_uuid="` + mig + `",node="mig-node",zone="vGPU"} ` + fmt.Sprint(float64(gpu.Devmem)*(1<<20)),
		`hami_gpu_core_limit_ratio{device_index="0",` + typ + `,device_uuid="` + mig + `",node="mig-node",zone="vGPU"} 100`,
		`hami_gpu_memory_allocated_bytes{device_cores="100",device_index="0",` + typ + `,device_uuid="` + mig + `",node="mig-node",zone="vGPU"} ` + migMemory,
		`hami_gpu_shared_count{device_index="0",` + typ + `,device_uuid="` + mig + `",node="mig-node",zone="vGPU"} 2`,
		`hami_node_gpu_overview{device_cores="100",device_index="0",device_memory_limit="` + devmem + `",` + typ + `,device_uuid="` + mig + `",node="mig-node",zone="vGPU"} ` + migMemory,
		`hami_node_gpu_memory_allocated_ratio{device_index="0",device_uuid="` + mig + `",node="mig-node",zone="vGPU"} ` + fmt.Sprint(float64(reserved)/float64(gpu.Devmem)),
		`hami_gpu_shared_count{device_index="0",` + typ + `,device_uuid="` + share.UUID + `",node="core-node",zone="vGPU"} 1`,
		// Per container: the MIG container's two instances of one GPU are one sample.
		`hami_vgpu_memory_allocated_bytes{container_index="0",device_uuid="` + mig + `",namespace="default",node="mig-node",pod="m",zone="vGPU"} ` + migMemory,
		`hami_vgpu_memory_allocated_bytes{container_index="0",device_uuid="` + share.UUID + `",namespace="default",node="core-node",pod="h",zone="vGPU"} ` + fmt.Sprint(float64(4000)*(1<<20)),
		`hami_vgpu_core_allocated_ratio{container_index="0",device_uuid="` + share.UUID + `",namespace="default",node="core-node",pod="h",zone="vGPU"} ` + fmt.Sprint(share.Cores),
		// Legacy names: the same values.
		`GPUDeviceSharedNum{deviceidx="0",devicetype="` + gpu.Type + `",deviceuuid="` + mig + `",nodeid="mig-node",zone="vGPU"} 2`,
		`vGPUMemoryAllocated{containeridx="0",deviceuuid="` + mig + `",nodename="mig-node",podname="m",podnamespace="default",zone="vGPU"} ` + migMemory,
		`nodeGPUMigInstance{deviceidx="0",deviceuuid="` + mig + `",migname="2g.10gb-4",nodeid="mig-node",zone="vGPU"} 1`,
		// The namespace's quota use: both MIG instances' profiles and the share.
		`hami_resource_quota_used{limit="100000",namespace="default",quota_name="nvidia.com/gpumem",zone="vGPU"} ` + fmt.Sprint(reserved+4000),
		`hami_resource_quota_used{limit="90",namespace="default",quota_name="nvidia.com/gpucores",zone="vGPU"} ` + fmt.Sprint(2*profile.Core+share.Cores),
		`QuotaUsed{limit="100000",quotaName="nvidia.com/gpumem",quotanamespace="default",zone="vGPU"} ` + fmt.Sprint(reserved+4000),
	} {
		if !strings.Contains(out, want+"\n") {
			t.Errorf("the scrape lacks %s", want)
		}
	}
	if n := strings.Count(out, "\nhami_vgpu_memory_allocated_bytes{"); n != 2 {
		t.Errorf("%d per-container memory samples, want 2 (one per container and GPU):\n%s", n, out)
	}
	if n := metricsdoc.CheckScraped(t, Registry, metricsdoc.SchedulerFile); n < 22 {
		t.Errorf("the HAMi table lists %d series of %s, want HAMi's 10 and their 11 legacy names and the MIG instance's", n, metricsdoc.SchedulerFile)
	}
}
