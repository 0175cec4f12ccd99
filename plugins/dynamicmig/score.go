package dynamicmig

import (
	"context"

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

// Score ranks a node by the node policy over its GPUs after placement (binpack: fuller is
// better; spread: emptier), its CPU and memory likewise, and the fragmentation cost of the
// chosen placements.
func (pl *DynamicMIG) Score(ctx context.Context, state fwk.CycleState, pod *v1.Pod, nodeInfo fwk.NodeInfo) (int64, *fwk.Status) {
	start := defaultClock()
	defer func() { observeLatency(scoreLatency, start) }()
	s, err := readState(state)
	if err != nil {
		return 0, fwk.AsStatus(err)
	}
	f, ok := s.fit(nodeInfo.Node().Name)
	if !ok {
		return 0, fwk.AsStatus(errNoFit(nodeInfo.Node().Name))
	}
	return placement.NodeScore(f.gpuUtil, hostUtilisation(nodeInfo), f.emptyGPUs, f.result.Cost, s.req.NodePolicy, pl.opts.FragmentationAware), nil
}

// hostUtilisation is the node's requested CPU and memory as DynamicMIG scores them.
func hostUtilisation(nodeInfo fwk.NodeInfo) float64 {
	alloc, req := nodeInfo.GetAllocatable(), nodeInfo.GetRequested()
	return placement.HostUtilisation(req.GetMilliCPU(), alloc.GetMilliCPU(), req.GetMemory(), alloc.GetMemory())
}

// NormalizeScore maps the raw scores onto [0, MaxNodeScore].
func (pl *DynamicMIG) NormalizeScore(_ context.Context, _ fwk.CycleState, _ *v1.Pod, scores fwk.NodeScoreList) *fwk.Status {
	if len(scores) == 0 {
		return nil
	}
	lo, hi := scores[0].Score, scores[0].Score
	for _, s := range scores {
		lo, hi = min(lo, s.Score), max(hi, s.Score)
	}
	for i := range scores {
		if hi == lo {
			scores[i].Score = fwk.MaxNodeScore
			continue
		}
		scores[i].Score = (scores[i].Score - lo) * fwk.MaxNodeScore / (hi - lo)
	}
	return nil
}
