package dynamicmig

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Registry holds the plugin's metrics; cmd/dynamig-scheduler serves it on
// metricsBindAddress. It is process-wide, as metrics are.
var Registry = prometheus.NewRegistry()

var (
	latency = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Namespace: "dynamig", Subsystem: "scheduler", Name: "extension_point_duration_seconds",
		Help:    "Time DynamicMIG spends per call at Filter and Score (in the scheduling cycles kube-scheduler samples for its plugin metrics, 10 %) and at Bind (every call).",
		Buckets: prometheus.ExponentialBuckets(0.00001, 4, 10),
	}, []string{"extension_point"})
	refusals = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "dynamig", Subsystem: "scheduler", Name: "unschedulable_reasons_total",
		Help: "Nodes refused for a GPU pod, by reason: once per node per scheduling cycle of the pod.",
	}, []string{"reason"})
)

// The observers of each extension point, resolved once. Filter and Score run for every node
// of every cycle, so they observe only where kube-scheduler samples its own plugin metrics
// (CycleState.ShouldRecordPluginMetrics): two clock reads per node cost a sixth of
// DynamicMIG's cycle (BenchmarkCycle1000Nodes).
var (
	filterLatency = latency.WithLabelValues("filter")
	scoreLatency  = latency.WithLabelValues("score")
	bindLatency   = latency.WithLabelValues("bind")
)

func init() {
	Registry.MustRegister(latency, refusals)
}

func observeLatency(o prometheus.Observer, start time.Time) {
	o.Observe(time.Since(start).Seconds())
}

func observeRefusal(reason string) { refusals.WithLabelValues(reason).Inc() }
