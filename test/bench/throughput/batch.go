package throughput

import (
	"fmt"
	"maps"
	"slices"
	"strings"

	"k8s.io/component-base/metrics/legacyregistry"
)

// BatchCounts are kube-scheduler's opportunistic-batching counters of one profile over a
// scenario, read from this process's metrics registry (the scheduler runs in it), by
// "attempts <result>" (hint_used, no_hint, hint_not_used: one per pod that reached
// filtering), "flushed <reason>" (why a batch was dropped) and "rescores" (the last chosen
// node filtered and scored again before a hint: 1.37 and later).
type BatchCounts map[string]float64

// batchMetrics are the counters BatchCounts reads, and the label each is keyed by.
var batchMetrics = map[string]struct{ key, label string }{
	"scheduler_batch_attempts_total":         {"attempts ", "result"},
	"scheduler_batch_cache_flushed_total":    {"flushed ", "reason"},
	"scheduler_batch_rescore_attempts_total": {"rescores", ""},
}

// readBatchCounts is the counters' values now, for profile.
func readBatchCounts(profile string) (BatchCounts, error) {
	families, err := legacyregistry.DefaultGatherer.Gather()
	if err != nil {
		return nil, fmt.Errorf("reading kube-scheduler's metrics: %w", err)
	}
	out := BatchCounts{}
	for _, mf := range families {
		bm, ok := batchMetrics[mf.GetName()]
		if !ok {
			continue
		}
		for _, m := range mf.GetMetric() {
			labels := map[string]string{}
			for _, lp := range m.GetLabel() {
				labels[lp.GetName()] = lp.GetValue()
			}
			if labels["profile"] != profile {
				continue
			}
			out[bm.key+labels[bm.label]] += m.GetCounter().GetValue()
		}
	}
	return out, nil
}

// since is what the counters grew by from before.
func (b BatchCounts) since(before BatchCounts) BatchCounts {
	out := BatchCounts{}
	for k, v := range b {
		if d := v - before[k]; d != 0 {
			out[k] = d
		}
	}
	return out
}

// hintUsed is the pods bound to the node batching hinted.
func (b BatchCounts) hintUsed() float64 { return b["attempts hint_used"] }

// flushes is "reason n, ..." of the batches dropped, or "none".
func (b BatchCounts) flushes() string {
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(b)) {
		if reason, ok := strings.CutPrefix(k, "flushed "); ok {
			parts = append(parts, fmt.Sprintf("%s %.0f", reason, b[k]))
		}
	}
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, ", ")
}
