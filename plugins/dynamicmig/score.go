package dynamicmig

import (
	"context"
	"time"

	v1 "k8s.io/api/core/v1"
	fwk "k8s.io/kube-scheduler/framework"

	"github.com/dynamig/dynamig/plugins/dynamicmig/placement"
)

// PreScore skips Score for pods without GPU requests (PreFilter skipped them, so no state).
func (pl *DynamicMIG) PreScore(_ context.Context, state fwk.CycleState, _ *v1.Pod, _ []fwk.NodeInfo) *fwk.Status {
	if _, err := readState(state); err != nil {
		return fwk.NewStatus(fwk.Skip)
	}
	return nil
}

// Score is the node's raw score by the node policy (placement.NodeScore): binpack, the
// fragmentation cost of the chosen placements and whether the node is in use already;
// spread, how empty its GPUs, CPU and memory are after placement.
func (pl *DynamicMIG) Score(ctx context.Context, state fwk.CycleState, pod *v1.Pod, nodeInfo fwk.NodeInfo) (int64, *fwk.Status) {
	if state.ShouldRecordPluginMetrics() {
		defer observeLatency(scoreLatency, time.Now())
	}
	s, err := readState(state)
	if err != nil {
		return 0, fwk.AsStatus(err)
	}
	f, ok := s.fit(nodeInfo.Node().Name)
	if !ok {
		return 0, fwk.AsStatus(errNoFit(nodeInfo.Node().Name))
	}
	return placement.NodeScore(f.gpuUtil, hostUtilisation(nodeInfo), f.inUse, f.result.Cost, s.req.NodePolicy, pl.opts.FragmentationAware), nil
}

// hostUtilisation is the node's requested CPU and memory as DynamicMIG scores them.
func hostUtilisation(nodeInfo fwk.NodeInfo) float64 {
	alloc, req := nodeInfo.GetAllocatable(), nodeInfo.GetRequested()
	return placement.HostUtilisation(req.GetMilliCPU(), alloc.GetMilliCPU(), req.GetMemory(), alloc.GetMemory())
}

// NormalizeScore maps the raw scores onto [0, MaxNodeScore] by the pod's node policy
// (placement.NormalizeScores): binpack by rank, ties to the first node by name.
func (pl *DynamicMIG) NormalizeScore(_ context.Context, state fwk.CycleState, _ *v1.Pod, scores fwk.NodeScoreList) *fwk.Status {
	s, err := readState(state)
	if err != nil {
		return fwk.AsStatus(err)
	}
	names := make([]string, len(scores))
	raw := make([]int64, len(scores))
	for i, ns := range scores {
		names[i], raw[i] = ns.Name, ns.Score
	}
	placement.NormalizeScores(names, raw, s.req.NodePolicy)
	for i := range scores {
		scores[i].Score = raw[i]
	}
	return nil
}
