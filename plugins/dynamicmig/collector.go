package dynamicmig

import (
	"math/bits"
	"strconv"
	"sync"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/klog/v2"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/dynamig/dynamig/api"
)

// The state metrics are computed at scrape time from the scheduler's informers: what is
// reserved and realised is in the pods' annotations, so nothing has to be kept in step.
var (
	migInstanceDesc = prometheus.NewDesc("hami_node_gpu_mig_instance_info",
		"Realized MIG instance identity and scheduler placement",
		[]string{"node", "device_uuid", "device_index", "mig_uuid", "profile", "gpu_instance_id", "compute_instance_id", "placement_start", "placement_size"}, nil)
	legacyMigInstanceDesc = prometheus.NewDesc("nodeGPUMigInstance",
		"MIG instance in use (HAMi's legacy metric; migname is <profile>-<placement start>)",
		[]string{"nodeid", "deviceuuid", "deviceidx", "migname"}, prometheus.Labels{"zone": "vGPU"})
	allocatedDesc = prometheus.NewDesc("dynamig_scheduler_gpu_allocated",
		"What is reserved on a GPU, by resource: memory_mib, cores_percent, shares, slots",
		[]string{"node", "device_uuid", "device_index", "mode", "resource"}, nil)
	capacityDesc = prometheus.NewDesc("dynamig_scheduler_gpu_capacity",
		"What a GPU offers, by resource: memory_mib, cores_percent, shares, slots",
		[]string{"node", "device_uuid", "device_index", "mode", "resource"}, nil)
	pendingDesc = prometheus.NewDesc("dynamig_scheduler_pending_pods",
		"GPU pods not bound yet, by the outcome of their latest scheduling attempt: the closest any node came",
		[]string{"reason"}, nil)
)

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
	ch <- migInstanceDesc
	ch <- legacyMigInstanceDesc
	ch <- allocatedDesc
	ch <- capacityDesc
	ch <- pendingDesc
}

// gpuTally is what is reserved on one GPU.
type gpuTally struct {
	memory, cores, shares int
	slots                 uint32
}

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
	gauge := func(d *prometheus.Desc, v float64, l ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, l...)
	}
	for _, node := range nodeList {
		gpus, ok, err := pl.inventory.get(node)
		if !ok || err != nil {
			continue
		}
		tally := map[string]*gpuTally{}
		index := map[string]string{}
		byID := map[string]*api.GPU{}
		for i := range gpus {
			tally[gpus[i].ID] = &gpuTally{}
			index[gpus[i].ID] = strconv.Itoa(int(gpus[i].Index))
			byID[gpus[i].ID] = &gpus[i]
		}
		for _, p := range byNode[node.Name] {
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
					if prof, ok := byID[r.GPUUUID].Profile(r.Profile); ok {
						t.memory += prof.MemoryMB
						t.cores += prof.Core
					}
					if !r.Realized() {
						continue
					}
					gauge(migInstanceDesc, 1, node.Name, r.GPUUUID, index[r.GPUUUID], r.MigUUID, r.Profile,
						strconv.Itoa(int(*r.GPUInstanceID)), strconv.Itoa(int(*r.ComputeInstanceID)),
						strconv.Itoa(r.Placement.Start), strconv.Itoa(r.Placement.Size))
					if legacy {
						gauge(legacyMigInstanceDesc, 1, node.Name, r.GPUUUID, index[r.GPUUUID], r.Profile+"-"+strconv.Itoa(r.Placement.Start))
					}
				}
			}
			if raw, ok := p.Annotations[api.DevicesAllocatedAnnotation]; ok {
				containers, err := api.DecodeHAMiCoreDevices(api.DevicesAllocatedAnnotation, raw)
				if err != nil {
					continue
				}
				for _, devs := range containers {
					for _, d := range devs {
						if t, ok := tally[d.UUID]; ok {
							t.memory += d.MemoryMiB
							t.cores += d.Cores
							t.shares++
						}
					}
				}
			}
		}
		for i := range gpus {
			g := &gpus[i]
			t := tally[g.ID]
			labels := func(resource string) []string { return []string{node.Name, g.ID, index[g.ID], g.Mode, resource} }
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
		}
	}
}
