package dynamicmig

import (
	"context"
	"math"

	v1 "k8s.io/api/core/v1"
	fwk "k8s.io/kube-scheduler/framework"

	"github.com/dynamig/dynamig/api"
)

// Score weights: GPU occupancy leads, the node's CPU and memory follow, and each unit of
// fragmentation cost counts against the node.
const (
	gpuWeight           = 1000
	hostWeight          = 200
	fragmentationWeight = 10
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
	gpu := f.gpuUtil
	host := hostUtilisation(nodeInfo)
	if s.req.NodePolicy == api.PolicySpread {
		gpu, host = 1-gpu, 1-host
	}
	cost := 0
	if pl.opts.FragmentationAware {
		cost = f.result.Cost
	}
	return int64(math.Round(gpu*gpuWeight+host*hostWeight)) - int64(cost*fragmentationWeight), nil
}

// hostUtilisation is the mean of the node's requested CPU and memory fractions.
func hostUtilisation(nodeInfo fwk.NodeInfo) float64 {
	alloc, req := nodeInfo.GetAllocatable(), nodeInfo.GetRequested()
	frac := func(used, total int64) float64 {
		if total <= 0 {
			return 0
		}
		return min(1, float64(used)/float64(total))
	}
	return (frac(req.GetMilliCPU(), alloc.GetMilliCPU()) + frac(req.GetMemory(), alloc.GetMemory())) / 2
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
