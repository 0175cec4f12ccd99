package integration

import (
	"fmt"
	"slices"
	"testing"
	"time"

	utilfeature "k8s.io/apiserver/pkg/util/feature"
	"k8s.io/component-base/metrics/testutil"
	"k8s.io/kubernetes/pkg/features"
	schedmetrics "k8s.io/kubernetes/pkg/scheduler/metrics"
)

// TestBatchingKeepsPlacements binds the same burst of identical GPU pods twice on the same
// empty nodes, with kube-scheduler's opportunistic batching off and on (the shipped profile,
// which lets GPU pods be signed): every pod gets the same node, GPU and placement both ways,
// so a batched pod lands nowhere the full pass would not put it, and with batching on
// kube-scheduler did give GPU pods its hints. The burst fills a node and more, so every
// minor's batching has hints to give (1.35 and 1.36 give one only once the previous pod's node
// is full; 1.37 re-scores that node and gives one each time).
func TestBatchingKeepsPlacements(t *testing.T) {
	const burst = 40 // 1g.5gb devices: 14 fit on a node of two A100-40GB
	nodes := []string{"batch-a", "batch-b", "batch-c"}
	var placements [2][]string
	var hints [2]float64
	for i, batching := range []bool{false, true} {
		t.Run(fmt.Sprintf("batching=%v", batching), func(t *testing.T) {
			setBatching(t, batching)
			e := newEnv(t, fmt.Sprintf("batching-%v", batching))
			for _, n := range nodes {
				e.addNode(n, a100, a100)
			}
			before := hintsUsed(t)
			e.startScheduler()
			names := e.burst("p", burst, 4000)
			e.waitRealised(2*time.Minute, names...)
			pods := e.pods()
			if n := checkPlacements(t, pods); n != burst {
				t.Fatalf("%d pods bound with their reservations, want %d", n, burst)
			}
			for _, p := range pods {
				recs, _ := reservations(t, &p)
				for _, r := range recs {
					placements[i] = append(placements[i], fmt.Sprintf("%s %s %s@%d+%d", p.Spec.NodeName, r.GPUUUID, r.Profile, r.Placement.Start, r.Placement.Size))
				}
			}
			slices.Sort(placements[i])
			hints[i] = hintsUsed(t) - before
		})
	}
	if t.Failed() {
		return
	}
	if !slices.Equal(placements[0], placements[1]) {
		t.Errorf("placements differ with batching on:\noff: %v\non:  %v", placements[0], placements[1])
	}
	if hints[0] != 0 {
		t.Errorf("batching off: %v hints used, want none", hints[0])
	}
	if hints[1] == 0 {
		t.Errorf("batching on: no hint used for %d identical GPU pods (are they signed?)", burst)
	}
	t.Logf("hints used with batching on: %v of %d pods", hints[1], burst)
}

// setBatching turns kube-scheduler's OpportunisticBatching on or off for the schedulers the
// test starts (read when one starts), restored when it ends.
func setBatching(t *testing.T, on bool) {
	t.Helper()
	gate := string(features.OpportunisticBatching)
	was := utilfeature.DefaultFeatureGate.Enabled(features.OpportunisticBatching)
	if err := utilfeature.DefaultMutableFeatureGate.SetFromMap(map[string]bool{gate: on}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = utilfeature.DefaultMutableFeatureGate.SetFromMap(map[string]bool{gate: was}) })
}

// hintsUsed is kube-scheduler's count of pods bound to the node batching hinted, in the
// dynamig-scheduler profile (this process's schedulers, all of them).
func hintsUsed(t *testing.T) float64 {
	t.Helper()
	schedmetrics.Register() // once per process; a scheduler's start registers them too
	v, err := testutil.GetCounterMetricValue(schedmetrics.BatchAttemptStats.WithLabelValues("dynamig-scheduler", schedmetrics.BatchAttemptHintUsed))
	if err != nil {
		t.Fatal(err)
	}
	return v
}
