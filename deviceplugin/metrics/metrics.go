// Package metrics holds the device plugin's metrics; cmd/dynamig-device-plugin serves
// Registry on --metrics-bind-address.
package metrics

import (
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/klog/v2"

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
)

// Source is where the instance and runtime metrics read from.
type Source struct {
	Instances  *instances.Manager
	Checkpoint *checkpoint.Checkpoint
	// Node and RuntimeCDI, if set, give the runtime's CDI support.
	Node       string
	RuntimeCDI func() runtimecdi.Verdict
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
