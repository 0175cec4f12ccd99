package dynamicmig

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"
	fwk "k8s.io/kube-scheduler/framework"

	"github.com/dynamig/dynamig/plugins/dynamicmig/placement"
	"github.com/dynamig/dynamig/plugins/dynamicmig/request"
)

// gpuRequestSignKey names DynamicMIG's fragment of a GPU pod's batching signature, and
// nodePolicySignKey that of another pod.
const (
	gpuRequestSignKey = "dynamig.io/v1.Pod.Spec.Containers.Resources.GPURequest()"
	nodePolicySignKey = "dynamig.io/v1.Pod.Annotations.NodeSchedulerPolicy()"
)

// signedRequest is what Filter, Score and Reserve read of a GPU pod: its request as the
// allocator sees it, and the node policy Score ranks by.
type signedRequest struct {
	Request    placement.Request
	NodePolicy string
}

// SignPod signs a GPU pod by its request's shape, so that kube-scheduler's opportunistic
// batching (KEP-5598) may reuse one pod's ranking of the nodes for the next identical pod.
// That is right for DynamicMIG: Filter and Score of a node read that node's inventory and
// pods only, and Reserve the fit Filter found on the chosen node (a batched pod skips Score),
// so a placement on one node changes no other node's feasibility or score. A pod whose
// request PreFilter refuses is not signed; a pod without one signs its node policy, which
// Score ranks its nodes' CPU and memory by.
func (pl *DynamicMIG) SignPod(_ context.Context, pod *v1.Pod) ([]fwk.SignFragment, *fwk.Status) {
	req, err := request.Parse(pod, pl.args.ResourceNames, pl.args.NodeSchedulerPolicy)
	if err != nil {
		return nil, fwk.NewStatus(fwk.Unschedulable, "an invalid GPU request is not signable")
	}
	if req == nil {
		// Score ranks its nodes by their CPU and memory, by its node policy.
		return []fwk.SignFragment{{Key: nodePolicySignKey, Value: hostNodePolicy(pod, pl.args.NodeSchedulerPolicy)}}, nil
	}
	return []fwk.SignFragment{{Key: gpuRequestSignKey, Value: signedRequest{Request: req.Request, NodePolicy: req.NodePolicy}}}, nil
}

// PreFilter parses the pod's GPU request once, limits the nodes it is filtered on to those
// with a GPU of a mode it accepts (gpuNodes), takes the request's resources out of
// NodeResourcesFit's (takeFitRequest), and counts its namespace's GPU quota use when a quota
// limits it (quotaCheckFor); pods without one are skipped.
func (pl *DynamicMIG) PreFilter(ctx context.Context, state fwk.CycleState, pod *v1.Pod, nodes []fwk.NodeInfo) (*fwk.PreFilterResult, *fwk.Status) {
	req, err := request.Parse(pod, pl.args.ResourceNames, pl.args.NodeSchedulerPolicy)
	if err != nil {
		pl.refuseRequest(pod)
		return nil, fwk.NewStatus(fwk.UnschedulableAndUnresolvable, err.Error())
	}
	if req == nil {
		return nil, fwk.NewStatus(fwk.Skip)
	}
	if err := req.CheckLargest(pl.largestDevice(req.Mode, req.MaxMemoryMiB, nodes), pl.args.ResourceMemoryName); err != nil {
		pl.refuseRequest(pod)
		return nil, fwk.NewStatus(fwk.UnschedulableAndUnresolvable, err.Error())
	}
	key, err := json.Marshal(req.Request)
	if err != nil {
		return nil, fwk.AsStatus(fmt.Errorf("keying the GPU request: %w", err))
	}
	gpuNodes := pl.gpuNodes.names(pl.inventory, nodes, req.Mode)
	if gpuNodes.Len() == 0 {
		pl.pending.start(pod).note(rankNoInventory)
		return nil, fwk.NewStatus(fwk.UnschedulableAndUnresolvable, placement.NoGPUNodeMessage(req.Mode))
	}
	quota, err := pl.quotaCheckFor(pod, nodes)
	if err != nil {
		return nil, fwk.AsStatus(err)
	}
	state.Write(stateKey, &stateData{req: req, key: string(key), now: time.Now(), devices: pl.takeFitRequest(state), quota: quota,
		fitsRoom: min(gpuNodes.Len(), maxPresizedFits), refused: &sync.Map{}, nominatedFits: &sync.Map{}, attempt: pl.pending.start(pod)})
	if gpuNodes.Len() == len(nodes) {
		// Every node: kube-scheduler would clone the set for each pod (PreFilterResult.Merge)
		// to filter the nodes it filters anyway.
		return nil, nil
	}
	return &fwk.PreFilterResult{NodeNames: gpuNodes}, nil
}

// refuseRequest counts a GPU request that PreFilter refuses.
func (pl *DynamicMIG) refuseRequest(pod *v1.Pod) {
	observeRefusal(reasonInvalidRequest)
	pl.pending.start(pod).note(rankInvalidRequest)
}

// largestDevice is the most memory one device of the mode can have on any node. Most
// requests are below what some node already decoded offers; only the others scan.
func (pl *DynamicMIG) largestDevice(mode string, need int, nodes []fwk.NodeInfo) int {
	if seen := pl.inventory.largestSeen(mode); need <= seen {
		return seen
	}
	largest := 0
	for _, ni := range nodes {
		gpus, ok, err := pl.inventory.get(ni.Node())
		if !ok || err != nil {
			continue
		}
		for i := range gpus {
			if mode == "" || gpus[i].Mode == mode {
				largest = max(largest, gpus[i].LargestDeviceMiB())
			}
		}
	}
	return largest
}

// Filter fits the pod on one node: its device count against the node's allocatable, as
// NodeResourcesFit would have, then the node's inventory minus the reservations of the pods
// in this NodeInfo, which is what makes preemption's dry runs right.
func (pl *DynamicMIG) Filter(ctx context.Context, state fwk.CycleState, pod *v1.Pod, nodeInfo fwk.NodeInfo) *fwk.Status {
	if state.ShouldRecordPluginMetrics() {
		defer observeLatency(filterLatency, time.Now())
	}
	s, err := readState(state)
	if err != nil {
		return fwk.AsStatus(err)
	}
	if status := pl.fitsDeviceCount(s.devices, nodeInfo); status != nil {
		return status
	}
	node := nodeInfo.Node()
	if status := pl.checkHeartbeat(pod, node.Name, s); status != nil {
		s.attempt.note(rankHeartbeat)
		return status
	}
	// A pod-group cycle's fits are its own: see podGroupCycle.
	cacheable := !podGroupCycle(state)
	generation := nodeInfo.GetGeneration()
	var cached cachedFit
	var hit bool
	if cacheable {
		cached, hit = pl.fits.get(node.Name, generation, s.key)
	}
	if !hit {
		gpus, nominated, rank, status := pl.nodeGPUs(nodeInfo)
		if status != nil {
			s.attempt.note(rank)
			return status
		}
		cached = cachedFit{generation: generation, request: s.key, withNominated: nominated}
		opts := pl.opts
		opts.Terse = !klog.FromContext(ctx).V(5).Enabled()
		res, refusal := placement.Fit(gpus, &s.req.Request, opts)
		if refusal == nil {
			cached.fit = &nodeFit{result: res, gpus: gpus, gpuUtil: placement.NodeUtilisation(gpus, res), inUse: placement.InUse(gpus)}
		}
		cached.refusal = refusal
		if cacheable {
			pl.fits.put(node.Name, cached)
		}
	}
	if refusal := cached.refusal; refusal != nil {
		klog.FromContext(ctx).V(5).Info("Pod does not fit", "pod", klog.KObj(pod), "node", klog.KObj(node), "reason", refusal.Reason, "detail", refusal.Detail)
		s.observeRefusal(node.Name, string(refusal.Reason))
		s.attempt.note(allocatorRanks[refusal.Reason])
		code := fwk.Unschedulable
		switch refusal.Reason {
		case placement.ReasonNoGPU, placement.ReasonNotSelected, placement.ReasonNoMIGGPU, placement.ReasonNoProfile:
			code = fwk.UnschedulableAndUnresolvable // no pod's removal can help
		}
		return fwk.NewStatus(code, string(refusal.Reason))
	}
	if s.quota != nil {
		if msg := s.quota.Exceeded(cached.fit.result.Grant(), pl.quotaNames); msg != "" {
			// Unresolvable by preemption: the namespace's use was counted over the whole
			// cluster at PreFilter, and no victim on this node lowers it.
			pl.quotaWaiting.add(pod)
			s.observeRefusal(node.Name, reasonQuota)
			s.attempt.note(rankQuota)
			return fwk.NewStatus(fwk.UnschedulableAndUnresolvable, msg)
		}
	}
	s.setFit(node.Name, s.nominatedFit(node.Name, cached.fit, cached.withNominated))
	s.attempt.note(rankFit)
	return nil
}

// podGroupCycle reports a pod-group scheduling cycle (kube-scheduler 1.36 and later, the
// Workload API's gangs): it tries the group's pods one after the other, each assumed into the
// snapshot's NodeInfo for the next, and reverts them all before binding any, while keeping
// every NodeInfo's generation as it was (Snapshot.AssumePod, ForgetPod). A node's generation
// then no longer tells what pods it holds, and the fit cache, which it keys, would give each
// member of a gang the placement the first one took, and a fit to pods the group's own
// members leave no room for. Read as an optional method: 1.35's CycleState has none.
func podGroupCycle(state fwk.CycleState) bool {
	g, ok := state.(interface{ IsPodGroupSchedulingCycle() bool })
	return ok && g.IsPodGroupSchedulingCycle()
}

// nodeGPUs is the node's inventory with the occupancy of its pods, and whether pods
// nominated there are among them; when it refuses the node, rank says why.
func (pl *DynamicMIG) nodeGPUs(nodeInfo fwk.NodeInfo) ([]placement.GPU, bool, int32, *fwk.Status) {
	node := nodeInfo.Node()
	inv, ok, err := pl.inventory.get(node)
	if !ok {
		return nil, false, rankNoInventory, fwk.NewStatus(fwk.UnschedulableAndUnresolvable, reasonNoInventory)
	}
	if err != nil {
		return nil, false, rankUnreadableInventory, fwk.NewStatus(fwk.UnschedulableAndUnresolvable, fmt.Sprintf("node %s has an unreadable GPU inventory: %v", node.Name, err))
	}
	gpus := placement.GPUsOf(inv)
	var nominated, leaving []*v1.Pod
	for _, pi := range nodeInfo.GetPods() {
		p := pi.GetPod()
		if p.Spec.NodeName == "" {
			// Only a pod kube-scheduler nominated here is in a NodeInfo unbound (its
			// addGENominatedPods): it has no reservation yet, but the room its preemption
			// or relocation freed is its own. It is placed after every reservation.
			nominated = append(nominated, p)
			continue
		}
		if err := pl.addOccupancy(gpus, p); err != nil {
			// An unreadable reservation could hide an occupied placement: place nothing here.
			return nil, false, rankUnreadableReservation, fwk.NewStatus(fwk.UnschedulableAndUnresolvable, fmt.Sprintf("node %s: pod %s/%s: %v", node.Name, p.Namespace, p.Name, err))
		}
		if p.DeletionTimestamp != nil {
			leaving = append(leaving, p)
		}
	}
	if len(nominated) > 0 {
		// The nominated pods are placed where they will fit once the pods going away (the
		// victims of their preemption, the pods relocated for them) are gone: the room those
		// free is held for them while they terminate.
		var after []placement.GPU
		if len(leaving) > 0 {
			after = placement.GPUsOf(inv)
			for _, pi := range nodeInfo.GetPods() {
				if p := pi.GetPod(); p.Spec.NodeName != "" && p.DeletionTimestamp == nil {
					_ = pl.addOccupancy(after, p) // read above
				}
			}
		}
		for _, p := range nominated {
			pl.addNominated(gpus, after, p)
		}
	}
	return gpus, len(nominated) > 0, rankNone, nil
}

// addNominated adds where a nominated pod would be placed now, as its own cycle would place
// it once the pods going away are gone (after: the node's GPUs without them; nil when none
// is going), to gpus and after; a pod that does not fit (any more) holds nothing.
func (pl *DynamicMIG) addNominated(gpus, after []placement.GPU, p *v1.Pod) {
	req, err := request.Parse(p, pl.args.ResourceNames, pl.args.NodeSchedulerPolicy)
	if err != nil || req == nil {
		return
	}
	room := after
	if room == nil {
		room = gpus
	}
	if res, refusal := placement.Fit(room, &req.Request, pl.opts); refusal == nil {
		placement.AddAssignments(gpus, res.Assignments)
		if after != nil {
			placement.AddAssignments(after, res.Assignments)
		}
	}
}

// addOccupancy adds a pod's reservations: from its annotations once bound, else from what
// Reserve recorded for it.
func (pl *DynamicMIG) addOccupancy(gpus []placement.GPU, p *v1.Pod) error {
	if p.Status.Phase == v1.PodSucceeded || p.Status.Phase == v1.PodFailed {
		return nil
	}
	found, err := placement.AddAnnotated(gpus, p.Annotations, pl.reservations.decode)
	if !found {
		if r, ok := pl.reservations.get(p.UID); ok {
			placement.AddAssignments(gpus, r.result.Assignments)
		}
		return nil
	}
	if _, ok := pl.reservations.get(p.UID); ok {
		pl.reservations.remove(p.UID) // the annotation now speaks for it
	}
	return err
}

// checkHeartbeat refuses nodes whose device plugin stopped renewing its heartbeat Lease by
// the cycle's start: a heartbeat lasts tens of seconds, a cycle milliseconds.
func (pl *DynamicMIG) checkHeartbeat(pod *v1.Pod, node string, s *stateData) *fwk.Status {
	if pl.leaseTimes.heartbeatFresh(node, s.now) {
		return nil
	}
	pl.heartbeatWaiters.Store(pod.UID, pod)
	s.observeRefusal(node, reasonHeartbeat)
	return fwk.NewStatus(fwk.Unschedulable, reasonHeartbeat)
}

// Reasons beyond the allocator's.
const (
	reasonNoInventory    = string(placement.ReasonNoInventory)
	reasonHeartbeat      = string(placement.ReasonHeartbeat)
	reasonInvalidRequest = "invalid GPU request"
)
