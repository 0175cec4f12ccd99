package dynamicmig

import (
	"math/bits"
	"strconv"
	"strings"
	"sync"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/klog/v2"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/dynamig/dynamig/api"
	"github.com/dynamig/dynamig/plugins/dynamicmig/placement"
	"github.com/dynamig/dynamig/plugins/dynamicmig/quota"
)

// The state metrics are computed at scrape time from the scheduler's informers: what is
// reserved and realised is in the pods' annotations, so nothing has to be kept in step.
var (
	allocatedDesc = prometheus.NewDesc("dynamig_scheduler_gpu_allocated",
		"What is reserved on a GPU, by resource: memory_mib, cores_percent, shares, slots",
		[]string{"node", "device_uuid", "device_index", "mode", "resource"}, nil)
	capacityDesc = prometheus.NewDesc("dynamig_scheduler_gpu_capacity",
		"What a GPU offers, by resource: memory_mib, cores_percent, shares, slots",
		[]string{"node", "device_uuid", "device_index", "mode", "resource"}, nil)
	pendingDesc = prometheus.NewDesc("dynamig_scheduler_pending_pods",
		"GPU pods not bound yet, by the outcome of their latest scheduling attempt: the closest any node came",
		[]string{"reason"}, nil)
	inFlightDesc = prometheus.NewDesc("dynamig_scheduler_reservations_in_flight",
		"GPU pods this scheduler has reserved devices for and not bound yet: in their binding cycle, or waiting at Permit for the rest of their pod group",
		nil, nil)
)

// hamiZone is the constant label HAMi's scheduler registers all its series under.
var hamiZone = prometheus.Labels{"zone": "vGPU"}

// HAMi v2.10's scheduler series, with its names, help texts and labels, so that dashboards
// and alerts written for HAMi read dynamig: memory in bytes, cores in devcore units
// (percent of a GPU), and the per-container series by containerIndex.
var (
	migInstanceDesc = prometheus.NewDesc("hami_node_gpu_mig_instance_info",
		"Realized MIG instance identity and scheduler placement",
		[]string{"node", "device_uuid", "device_index", "mig_uuid", "profile", "gpu_instance_id", "compute_instance_id", "placement_start", "placement_size"}, hamiZone)
	gpuMemoryLimitDesc = prometheus.NewDesc("hami_gpu_memory_limit_bytes",
		"Device memory limit for a certain GPU",
		[]string{"node", "device_uuid", "device_index", "device_type"}, hamiZone)
	gpuCoreLimitDesc = prometheus.NewDesc("hami_gpu_core_limit_ratio",
		"Device core limit for a certain GPU",
		[]string{"node", "device_uuid", "device_index", "device_type"}, hamiZone)
	gpuMemoryAllocatedDesc = prometheus.NewDesc("hami_gpu_memory_allocated_bytes",
		"Device memory allocated for a certain GPU",
		[]string{"node", "device_uuid", "device_index", "device_cores", "device_type"}, hamiZone)
	gpuSharedDesc = prometheus.NewDesc("hami_gpu_shared_count",
		"Number of containers sharing this GPU",
		[]string{"node", "device_uuid", "device_index", "device_type"}, hamiZone)
	gpuCoreAllocatedDesc = prometheus.NewDesc("hami_gpu_core_allocated_ratio",
		"Device core allocated for a certain GPU",
		[]string{"node", "device_uuid", "device_index", "device_type"}, hamiZone)
	gpuOverviewDesc = prometheus.NewDesc("hami_node_gpu_overview",
		"GPU overview on a certain node",
		[]string{"node", "device_uuid", "device_index", "device_cores", "device_memory_limit", "device_type"}, hamiZone)
	gpuMemoryRatioDesc = prometheus.NewDesc("hami_node_gpu_memory_allocated_ratio",
		"GPU Memory Allocated Percentage on a certain GPU",
		[]string{"node", "device_uuid", "device_index"}, hamiZone)
	containerMemoryDesc = prometheus.NewDesc("hami_vgpu_memory_allocated_bytes",
		"vGPU memory allocated from a container",
		[]string{"namespace", "node", "pod", "container_index", "device_uuid"}, hamiZone)
	containerCoreDesc = prometheus.NewDesc("hami_vgpu_core_allocated_ratio",
		"vGPU core allocated from a container",
		[]string{"namespace", "node", "pod", "container_index", "device_uuid"}, hamiZone)
)

// HAMi's legacy names of the same series, exported only with the arg legacyMetrics.
var (
	legacyMigInstanceDesc = prometheus.NewDesc("nodeGPUMigInstance",
		"MIG instance in use (HAMi's legacy metric; migname is <profile>-<GPU instance id>)",
		[]string{"nodeid", "deviceuuid", "deviceidx", "migname"}, hamiZone)
	legacyMemoryLimitDesc = prometheus.NewDesc("GPUDeviceMemoryLimit",
		"Device memory limit for a certain GPU",
		[]string{"nodeid", "deviceuuid", "deviceidx", "devicetype"}, hamiZone)
	legacyCoreLimitDesc = prometheus.NewDesc("GPUDeviceCoreLimit",
		"Device memory core limit for a certain GPU",
		[]string{"nodeid", "deviceuuid", "deviceidx", "devicetype"}, hamiZone)
	legacyMemoryAllocatedDesc = prometheus.NewDesc("GPUDeviceMemoryAllocated",
		"Device memory allocated for a certain GPU",
		[]string{"nodeid", "deviceuuid", "deviceidx", "devicecores", "devicetype"}, hamiZone)
	legacySharedDesc = prometheus.NewDesc("GPUDeviceSharedNum",
		"Number of containers sharing this GPU",
		[]string{"nodeid", "deviceuuid", "deviceidx", "devicetype"}, hamiZone)
	legacyCoreAllocatedDesc = prometheus.NewDesc("GPUDeviceCoreAllocated",
		"Device core allocated for a certain GPU",
		[]string{"nodeid", "deviceuuid", "deviceidx", "devicetype"}, hamiZone)
	legacyOverviewDesc = prometheus.NewDesc("nodeGPUOverview",
		"GPU overview on a certain node",
		[]string{"nodeid", "deviceuuid", "deviceidx", "devicecores", "devicememorylimit", "devicetype"}, hamiZone)
	legacyMemoryRatioDesc = prometheus.NewDesc("nodeGPUMemoryPercentage",
		"GPU Memory Allocated Percentage on a certain GPU",
		[]string{"nodeid", "deviceuuid", "deviceidx"}, hamiZone)
	legacyContainerMemoryDesc = prometheus.NewDesc("vGPUMemoryAllocated",
		"vGPU memory allocated from a container",
		[]string{"podnamespace", "nodename", "podname", "containeridx", "deviceuuid"}, hamiZone)
	legacyContainerCoreDesc = prometheus.NewDesc("vGPUCoreAllocated",
		"vGPU core allocated from a container",
		[]string{"podnamespace", "nodename", "podname", "containeridx", "deviceuuid"}, hamiZone)
)

// Every series of the collector: the legacy ones are described whether or not they are
// exported, so that the registry knows them.
var stateDescs = []*prometheus.Desc{
	allocatedDesc, capacityDesc, pendingDesc, inFlightDesc,
	migInstanceDesc, gpuMemoryLimitDesc, gpuCoreLimitDesc, gpuMemoryAllocatedDesc, gpuSharedDesc, gpuCoreAllocatedDesc,
	gpuOverviewDesc, gpuMemoryRatioDesc, containerMemoryDesc, containerCoreDesc,
	legacyMigInstanceDesc, legacyMemoryLimitDesc, legacyCoreLimitDesc, legacyMemoryAllocatedDesc, legacySharedDesc,
	legacyCoreAllocatedDesc, legacyOverviewDesc, legacyMemoryRatioDesc, legacyContainerMemoryDesc, legacyContainerCoreDesc,
	quotaUsedDesc, legacyQuotaUsedDesc,
}

// mib is a MiB count in bytes, HAMi's unit of memory in its series.
func mib(n int) float64 { return float64(n) * (1 << 20) }

// stateCollector reads the plugin that New built last; one per process.
type stateCollector struct {
	mu     sync.Mutex
	nodes  corelisters.NodeLister
	pods   corelisters.PodLister
	pl     *DynamicMIG
	legacy bool
}

var collector = &stateCollector{}

func init() { Registry.MustRegister(collector) }

func (c *stateCollector) setSource(pl *DynamicMIG, nodes corelisters.NodeLister, pods corelisters.PodLister) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.pl, c.nodes, c.pods, c.legacy = pl, nodes, pods, pl.args.LegacyMetrics
}

func (c *stateCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range stateDescs {
		ch <- d
	}
}

// gpuTally is what is reserved on one GPU.
type gpuTally struct {
	memory, cores, shares int
	slots                 uint32
}

// containerDevice is one container's devices on one GPU: the per-container series have one
// sample per container and GPU, since a MIG container's instances of one GPU would give
// samples with equal labels.
type containerDevice struct {
	namespace, pod string
	container      int
	gpu            string
}

// containerTally is what a container holds on one GPU.
type containerTally struct{ memory, cores int }

func (c *stateCollector) Collect(ch chan<- prometheus.Metric) {
	c.mu.Lock()
	pl, nodes, pods, legacy := c.pl, c.nodes, c.pods, c.legacy
	c.mu.Unlock()
	if pl == nil {
		return
	}
	for reason, n := range pl.pending.count(pods) {
		ch <- prometheus.MustNewConstMetric(pendingDesc, prometheus.GaugeValue, float64(n), reason)
	}
	ch <- prometheus.MustNewConstMetric(inFlightDesc, prometheus.GaugeValue, float64(pl.reservations.unbound(pods)))
	nodeList, err := nodes.List(labels.Everything())
	if err != nil {
		klog.Background().Error(err, "Listing nodes for metrics")
		return
	}
	podList, err := pods.List(labels.Everything())
	if err != nil {
		klog.Background().Error(err, "Listing pods for metrics")
		return
	}
	byNode := map[string][]*v1.Pod{}
	for _, p := range podList {
		if p.Spec.NodeName != "" && p.Status.Phase != v1.PodSucceeded && p.Status.Phase != v1.PodFailed {
			byNode[p.Spec.NodeName] = append(byNode[p.Spec.NodeName], p)
		}
	}
	for _, node := range nodeList {
		gpus, ok, err := pl.inventory.get(node)
		if !ok || err != nil {
			continue
		}
		collectNode(ch, pl, node.Name, gpus, byNode[node.Name], legacy)
	}
	collectQuotas(ch, pl, nodeList, byNode, legacy)
}

// collectNode exports one node's GPUs and the devices its pods hold.
func collectNode(ch chan<- prometheus.Metric, pl *DynamicMIG, node string, gpus []api.GPU, pods []*v1.Pod, legacy bool) {
	gauge := func(d *prometheus.Desc, v float64, l ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, l...)
	}
	tally := map[string]*gpuTally{}
	index := map[string]string{}
	byID := map[string]*api.GPU{}
	for i := range gpus {
		tally[gpus[i].ID] = &gpuTally{}
		index[gpus[i].ID] = strconv.Itoa(int(gpus[i].Index))
		byID[gpus[i].ID] = &gpus[i]
	}
	containers := map[containerDevice]*containerTally{}
	hold := func(p *v1.Pod, container int, gpu string, memory, cores int) {
		k := containerDevice{namespace: p.Namespace, pod: p.Name, container: container, gpu: gpu}
		t, ok := containers[k]
		if !ok {
			t = &containerTally{}
			containers[k] = t
		}
		t.memory += memory
		t.cores += cores
	}
	for _, p := range pods {
		if raw, ok := p.Annotations[api.MigReservationsAnnotation]; ok {
			recs, err := pl.reservations.decode(raw)
			if err != nil {
				continue
			}
			for _, r := range recs {
				t, ok := tally[r.GPUUUID]
				if !ok {
					continue
				}
				t.slots |= uint32(((uint64(1) << uint(min(r.Placement.Size, 32))) - 1) << uint(min(r.Placement.Start, 31)))
				t.shares++
				memory, cores := 0, 0
				if prof, ok := byID[r.GPUUUID].Profile(r.Profile); ok {
					memory, cores = prof.MemoryMB, prof.Core
				}
				t.memory += memory
				t.cores += cores
				hold(p, r.ContainerIndex, r.GPUUUID, memory, cores)
				if !r.Realized() {
					continue
				}
				gauge(migInstanceDesc, 1, node, r.GPUUUID, index[r.GPUUUID], r.MigUUID, r.Profile,
					strconv.Itoa(int(*r.GPUInstanceID)), strconv.Itoa(int(*r.ComputeInstanceID)),
					strconv.Itoa(r.Placement.Start), strconv.Itoa(r.Placement.Size))
				if legacy {
					gauge(legacyMigInstanceDesc, 1, node, r.GPUUUID, index[r.GPUUUID], r.Profile+"-"+strconv.Itoa(int(*r.GPUInstanceID)))
				}
			}
		}
		if raw, ok := p.Annotations[api.DevicesAllocatedAnnotation]; ok {
			assigned, err := api.DecodeHAMiCoreDevices(api.DevicesAllocatedAnnotation, raw)
			if err != nil {
				continue
			}
			for container, devs := range assigned {
				for _, d := range devs {
					if t, ok := tally[d.UUID]; ok {
						t.memory += d.MemoryMiB
						t.cores += d.Cores
						t.shares++
						hold(p, container, d.UUID, d.MemoryMiB, d.Cores)
					}
				}
			}
		}
	}
	for i := range gpus {
		g := &gpus[i]
		t := tally[g.ID]
		idx := index[g.ID]
		labels := func(resource string) []string { return []string{node, g.ID, idx, g.Mode, resource} }
		if g.Mode == api.ModeMIG {
			gauge(capacityDesc, float64(g.SlotCount()), labels("slots")...)
			gauge(allocatedDesc, float64(bits.OnesCount32(t.slots)), labels("slots")...)
		}
		gauge(capacityDesc, float64(g.Devmem), labels("memory_mib")...)
		gauge(capacityDesc, float64(g.Devcore), labels("cores_percent")...)
		gauge(capacityDesc, float64(g.Count), labels("shares")...)
		gauge(allocatedDesc, float64(t.memory), labels("memory_mib")...)
		gauge(allocatedDesc, float64(t.cores), labels("cores_percent")...)
		gauge(allocatedDesc, float64(t.shares), labels("shares")...)

		cores, memoryLimit := strconv.Itoa(g.Devcore), strconv.Itoa(g.Devmem)
		gauge(gpuMemoryLimitDesc, mib(g.Devmem), node, g.ID, idx, g.Type)
		gauge(gpuCoreLimitDesc, float64(g.Devcore), node, g.ID, idx, g.Type)
		gauge(gpuMemoryAllocatedDesc, mib(t.memory), node, g.ID, idx, cores, g.Type)
		gauge(gpuSharedDesc, float64(t.shares), node, g.ID, idx, g.Type)
		gauge(gpuCoreAllocatedDesc, float64(t.cores), node, g.ID, idx, g.Type)
		gauge(gpuOverviewDesc, mib(t.memory), node, g.ID, idx, cores, memoryLimit, g.Type)
		if g.Devmem > 0 { // as HAMi: no ratio of a GPU without memory
			gauge(gpuMemoryRatioDesc, float64(t.memory)/float64(g.Devmem), node, g.ID, idx)
		}
		if legacy {
			gauge(legacyMemoryLimitDesc, mib(g.Devmem), node, g.ID, idx, g.Type)
			gauge(legacyCoreLimitDesc, float64(g.Devcore), node, g.ID, idx, g.Type)
			gauge(legacyMemoryAllocatedDesc, mib(t.memory), node, g.ID, idx, cores, g.Type)
			gauge(legacySharedDesc, float64(t.shares), node, g.ID, idx, g.Type)
			gauge(legacyCoreAllocatedDesc, float64(t.cores), node, g.ID, idx, g.Type)
			gauge(legacyOverviewDesc, mib(t.memory), node, g.ID, idx, cores, memoryLimit, g.Type)
			if g.Devmem > 0 {
				gauge(legacyMemoryRatioDesc, float64(t.memory)/float64(g.Devmem), node, g.ID, idx)
			}
		}
	}
	for k, t := range containers {
		container := strconv.Itoa(k.container)
		gauge(containerMemoryDesc, mib(t.memory), k.namespace, node, k.pod, container, k.gpu)
		gauge(containerCoreDesc, float64(t.cores), k.namespace, node, k.pod, container, k.gpu)
		if legacy {
			gauge(legacyContainerMemoryDesc, mib(t.memory), k.namespace, node, k.pod, container, k.gpu)
			gauge(legacyContainerCoreDesc, float64(t.cores), k.namespace, node, k.pod, container, k.gpu)
		}
	}
}

// HAMi's series of a namespace's GPU quota use, with its names and labels: quota_name is the
// resource (nvidia.com/gpumem, MiB; nvidia.com/gpucores, percent of a GPU), limit the
// namespace's tightest quota of it ("0" without one, as HAMi writes a namespace it tracks
// without a quota), the value what the namespace's bound pods are granted.
var (
	quotaUsedDesc = prometheus.NewDesc("hami_resource_quota_used", "resourcequota usage for a certain device",
		[]string{"namespace", "quota_name", "limit"}, hamiZone)
	legacyQuotaUsedDesc = prometheus.NewDesc("QuotaUsed", "resourcequota usage for a certain device",
		[]string{"quotanamespace", "quotaName", "limit"}, hamiZone)
)

// namespaceQuota is a namespace's granted GPU memory and cores and its tightest limits (-1:
// none).
type namespaceQuota struct {
	used             placement.Grant
	memoryMiB, cores int64
}

// collectQuotas exports, for every namespace with a GPU quota or a bound pod granted GPU
// memory or cores, what it is granted of each (pods is the bound pods that have not ended,
// by node).
func collectQuotas(ch chan<- prometheus.Metric, pl *DynamicMIG, nodes []*v1.Node, pods map[string][]*v1.Pod, legacy bool) {
	namespaces := map[string]*namespaceQuota{}
	of := func(ns string) *namespaceQuota {
		if namespaces[ns] == nil {
			namespaces[ns] = &namespaceQuota{memoryMiB: -1, cores: -1}
		}
		return namespaces[ns]
	}
	quotas, err := pl.quotaLister.List(labels.Everything())
	if err != nil {
		klog.Background().Error(err, "Listing ResourceQuotas for metrics")
		return
	}
	for _, q := range quotas {
		l, ok := pl.quotaNames.Of(q)
		if !ok {
			continue
		}
		n := of(q.Namespace)
		n.memoryMiB = quota.Tighter(n.memoryMiB, l.MemoryMiB)
		n.cores = quota.Tighter(n.cores, l.Cores)
	}
	for _, node := range nodes {
		for _, p := range pods[node.Name] {
			g, err := pl.granted(p, node)
			if err != nil || g == (placement.Grant{}) {
				continue
			}
			of(p.Namespace).used.Add(g)
		}
	}
	for ns, n := range namespaces {
		for _, r := range []struct {
			name        v1.ResourceName
			used, limit int64
		}{{pl.quotaNames.Memory, n.used.MemoryMiB, n.memoryMiB}, {pl.quotaNames.Cores, n.used.Cores, n.cores}} {
			if r.used == 0 && r.limit < 0 {
				continue
			}
			name, limit := strings.TrimPrefix(string(r.name), quota.LimitPrefix), strconv.FormatInt(max(r.limit, 0), 10)
			ch <- prometheus.MustNewConstMetric(quotaUsedDesc, prometheus.GaugeValue, float64(r.used), ns, name, limit)
			if legacy {
				ch <- prometheus.MustNewConstMetric(legacyQuotaUsedDesc, prometheus.GaugeValue, float64(r.used), ns, name, limit)
			}
		}
	}
}
