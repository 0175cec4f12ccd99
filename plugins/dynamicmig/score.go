package dynamicmig

import (
	"context"
	"fmt"
	"time"

	v1 "k8s.io/api/core/v1"
	fwk "k8s.io/kube-scheduler/framework"

	"github.com/dynamig/dynamig/api"
	"github.com/dynamig/dynamig/plugins/dynamicmig/placement"
)

// hostStateKey holds the node policy of a pod without GPU request in the CycleState.
const hostStateKey fwk.StateKey = Name + "/host"

// hostState is the node policy a pod without GPU request is scored by.
type hostState struct{ nodePolicy string }

func (s *hostState) Clone() fwk.StateData { return s }

// PreScore readies Score for a pod without GPU request (PreFilter skipped it): the shipped
// profile turns NodeResourcesFit's score off, so DynamicMIG scores every pod's node by its
// CPU and memory, by the node policy: the pod's hami.io/node-scheduler-policy, else the
// args'.
func (pl *DynamicMIG) PreScore(_ context.Context, state fwk.CycleState, pod *v1.Pod, _ []fwk.NodeInfo) *fwk.Status {
	if _, err := readState(state); err == nil {
		return nil
	}
	state.Write(hostStateKey, &hostState{nodePolicy: hostNodePolicy(pod, pl.args.NodeSchedulerPolicy)})
	return nil
}

// hostNodePolicy is the node policy of a pod without GPU request: its annotation when it is
// one, else the default (such a pod's annotation is not validated: it is no GPU request).
func hostNodePolicy(pod *v1.Pod, defaultPolicy string) string {
	switch v := pod.Annotations[api.NodeSchedulerPolicyAnnotation]; v {
	case api.PolicyBinpack, api.PolicySpread:
		return v
	}
	return defaultPolicy
}

// nodePolicy is the node policy Score used for the pod.
func nodePolicy(state fwk.CycleState) (string, error) {
	if s, err := readState(state); err == nil {
		return s.req.NodePolicy, nil
	}
	c, err := state.Read(hostStateKey)
	if err != nil {
		return "", fmt.Errorf("reading %q from the cycle state: %w", hostStateKey, err)
	}
	return c.(*hostState).nodePolicy, nil
}

// Score is the node's raw score by the node policy (placement.NodeScore): binpack, the
// fragmentation cost of the chosen placements, whether the node is in use already, then how
// full its CPU and memory are; spread, how empty its GPUs, CPU and memory are after
// placement. A pod without GPU request is scored by its node's CPU and memory alone
// (placement.HostScore).
func (pl *DynamicMIG) Score(ctx context.Context, state fwk.CycleState, pod *v1.Pod, nodeInfo fwk.NodeInfo) (int64, *fwk.Status) {
	if state.ShouldRecordPluginMetrics() {
		defer observeLatency(scoreLatency, time.Now())
	}
	s, err := readState(state)
	if err != nil {
		policy, err := nodePolicy(state)
		if err != nil {
			return 0, fwk.AsStatus(err)
		}
		return placement.HostScore(hostUtilisation(nodeInfo), policy), nil
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
	policy, err := nodePolicy(state)
	if err != nil {
		return fwk.AsStatus(err)
	}
	names := make([]string, len(scores))
	raw := make([]int64, len(scores))
	for i, ns := range scores {
		names[i], raw[i] = ns.Name, ns.Score
	}
	placement.NormalizeScores(names, raw, policy)
	for i := range scores {
		scores[i].Score = raw[i]
	}
	return nil
}
