// Package metrics holds the device plugin's metrics; cmd/dynamig-device-plugin serves
// Registry on --metrics-bind-address.
package metrics

import (
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/klog/v2"

	"github.com/dynamig/dynamig/api"
	"github.com/dynamig/dynamig/deviceplugin/checkpoint"
	"github.com/dynamig/dynamig/deviceplugin/instances"
	"github.com/dynamig/dynamig/deviceplugin/runtimecdi"
)

// Registry is process-wide, as metrics are.
var Registry = prometheus.NewRegistry()

var (
	preStartDuration = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Namespace: "dynamig", Subsystem: "device_plugin", Name: "prestart_duration_seconds",
		Help:    "Time per PreStartContainer (a container's devices realised), by result (ok or the failure reason).",
		Buckets: prometheus.ExponentialBuckets(0.001, 4, 9),
	}, []string{"result"})
	preStartErrors = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "dynamig", Subsystem: "device_plugin", Name: "prestart_errors_total",
		Help: "Refused or failed PreStartContainer calls, by reason.",
	}, []string{"reason"})
	recoveryActions = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "dynamig", Subsystem: "device_plugin", Name: "instance_actions_total",
		Help: "What reconcile and restart recovery did with MIG instances: reclaimed, reclaim_failed, rolled_back, adopted, unknown, lost, kept.",
	}, []string{"action"})
	instanceDesc = prometheus.NewDesc("dynamig_mig_instance",
		"A MIG instance as NVML reports it, with the pod it was made for (empty when dynamig did not make it).",
		[]string{"gpu_uuid", "profile", "placement_start", "placement_size", "gpu_instance_id", "compute_instance_id", "pod_namespace", "pod_name"}, nil)
	runtimeCDIDesc = prometheus.NewDesc("dynamig_device_plugin_runtime_cdi",
		"1 for what the node's container runtime does with CDI devices (state: applies, ignores or unknown), as it answers over the CRI; ignores means GPU containers start without their GPU.",
		[]string{"node", "state", "runtime"}, nil)
	// HAMi v2.10's vGPU monitor series (its name, help, labels and constant zone), which
	// dashboards written for HAMi read on the same port: one per realised MIG reservation.
	migDeviceDesc = prometheus.NewDesc("hami_mig_device_info",
		"MIG runtime identity for a container allocation",
		[]string{"namespace", "pod", "container", "vdevice_index", "device_uuid", "mig_uuid", "profile", "gpu_instance_id", "compute_instance_id"},
		prometheus.Labels{"zone": "vGPU"})
)

// Source is where the instance and runtime metrics read from.
type Source struct {
	Instances  *instances.Manager
	Checkpoint *checkpoint.Checkpoint
	// Node and RuntimeCDI, if set, give the runtime's CDI support.
	Node       string
	RuntimeCDI func() runtimecdi.Verdict
	// Pods, if set, lists the node's pods, whose realised MIG reservations are
	// hami_mig_device_info.
	Pods corelisters.PodLister
}

// collector reads every running plugin's state: one in a node's process, several when a
// sandbox runs many simulated nodes in one process.
type collector struct {
	mu      sync.Mutex
	sources map[*Source]bool
}

var instanceCollector = &collector{sources: map[*Source]bool{}}

func init() {
	Registry.MustRegister(preStartDuration, preStartErrors, recoveryActions, instanceCollector)
}

// AddSource makes the instance metric report a running plugin's state until remove.
func AddSource(s *Source) (remove func()) {
	instanceCollector.mu.Lock()
	defer instanceCollector.mu.Unlock()
	instanceCollector.sources[s] = true
	return func() {
		instanceCollector.mu.Lock()
		defer instanceCollector.mu.Unlock()
		delete(instanceCollector.sources, s)
	}
}

func (c *collector) Describe(ch chan<- *prometheus.Desc) {
	ch <- instanceDesc
	ch <- runtimeCDIDesc
	ch <- migDeviceDesc
}

func (c *collector) Collect(ch chan<- prometheus.Metric) {
	c.mu.Lock()
	sources := make([]*Source, 0, len(c.sources))
	for s := range c.sources {
		sources = append(sources, s)
	}
	c.mu.Unlock()
	for _, src := range sources {
		collectSource(ch, src)
	}
}

func collectSource(ch chan<- prometheus.Metric, src *Source) {
	if src.RuntimeCDI != nil {
		v := src.RuntimeCDI()
		ch <- prometheus.MustNewConstMetric(runtimeCDIDesc, prometheus.GaugeValue, 1, src.Node, string(v.State), v.Runtime)
	}
	if src.Pods != nil {
		collectMigDevices(ch, src.Pods)
	}
	owners := map[string]checkpoint.Entry{} // by MIG UUID
	for _, e := range src.Checkpoint.Entries() {
		if e.State == checkpoint.Created {
			owners[e.MigUUID] = e
		}
	}
	for _, gpu := range src.Instances.GPUs() {
		list, err := src.Instances.List(gpu)
		if err != nil {
			klog.Background().Error(err, "Listing MIG instances for metrics", "gpu", gpu)
			continue
		}
		for _, in := range list {
			owner := owners[in.MigUUID]
			ch <- prometheus.MustNewConstMetric(instanceDesc, prometheus.GaugeValue, 1, gpu, in.Profile,
				strconv.Itoa(in.Placement.Start), strconv.Itoa(in.Placement.Size),
				strconv.Itoa(in.GPUInstanceID), strconv.Itoa(in.ComputeInstanceID), owner.PodNamespace, owner.PodName)
		}
	}
}

// collectMigDevices exports the realised MIG reservations of the node's pods that have not
// ended, as HAMi's vGPU monitor reads them from the same annotation.
func collectMigDevices(ch chan<- prometheus.Metric, pods corelisters.PodLister) {
	list, err := pods.List(labels.Everything())
	if err != nil {
		klog.Background().Error(err, "Listing pods for metrics")
		return
	}
	for _, p := range list {
		raw, ok := p.Annotations[api.MigReservationsAnnotation]
		if !ok || p.Status.Phase == v1.PodSucceeded || p.Status.Phase == v1.PodFailed {
			continue
		}
		recs, err := api.DecodeMigReservations(raw)
		if err != nil {
			continue // an unreadable reservation names no instance
		}
		for _, r := range recs {
			name, ok := containerName(p, r.ContainerIndex)
			if !ok || !r.Realized() {
				continue
			}
			ch <- prometheus.MustNewConstMetric(migDeviceDesc, prometheus.GaugeValue, 1, p.Namespace, p.Name, name,
				strconv.Itoa(r.DeviceIndex), r.GPUUUID, r.MigUUID, r.Profile,
				strconv.Itoa(int(*r.GPUInstanceID)), strconv.Itoa(int(*r.ComputeInstanceID)))
		}
	}
}

// containerName is the name of the container at a reservation's containerIndex (init
// containers first).
func containerName(p *v1.Pod, index int) (string, bool) {
	switch {
	case index < 0:
		return "", false
	case index < len(p.Spec.InitContainers):
		return p.Spec.InitContainers[index].Name, true
	case index-len(p.Spec.InitContainers) < len(p.Spec.Containers):
		return p.Spec.Containers[index-len(p.Spec.InitContainers)].Name, true
	}
	return "", false
}

// ObservePreStart records one PreStartContainer: reason "" is success.
func ObservePreStart(start time.Time, reason string) {
	result := reason
	if reason == "" {
		result = "ok"
	} else {
		preStartErrors.WithLabelValues(reason).Inc()
	}
	preStartDuration.WithLabelValues(result).Observe(time.Since(start).Seconds())
}

// ObserveActions counts instance actions.
func ObserveActions(action string, n int) {
	if n > 0 {
		recoveryActions.WithLabelValues(action).Add(float64(n))
	}
}
