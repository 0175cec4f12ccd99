package dynamicmig

import (
	"fmt"

	v1 "k8s.io/api/core/v1"
	fwk "k8s.io/kube-scheduler/framework"
	"k8s.io/kubernetes/pkg/scheduler/framework/plugins/noderesources"
)

// fitRequestKey is where NodeResourcesFit's PreFilter leaves the pod's request, which its
// Filter checks against every node (the same in 1.35 through 1.38).
const fitRequestKey fwk.StateKey = "PreFilter" + noderesources.Name

// scalarRequests is what NodeResourcesFit's request offers of its extended resources: the
// map its Filter ranges over on every node.
type scalarRequests interface {
	GetScalarResources() map[v1.ResourceName]int64
}

// takeFitRequest takes the GPU request's resources and HAMi-core's task priority out of
// NodeResourcesFit's request for this cycle and returns the device count it held (0: none
// taken). NodeResourcesFit validates every extended resource's name on every node it filters
// (a Sprintf, a Split and two regular expressions per name, before it looks at
// ignoredResources), three or four per GPU pod; DynamicMIG's Filter checks the count in its
// place (fitsDeviceCount), the allocator fits memory and cores, and the device plugin reads
// the priority, which the chart has NodeResourcesFit ignore. Fit's PreFilter runs before
// DynamicMIG's (the default plugins come first in multiPoint); where it has not, nothing is
// taken and Fit checks all of them itself.
func (pl *DynamicMIG) takeFitRequest(state fwk.CycleState) int64 {
	data, err := state.Read(fitRequestKey)
	if err != nil {
		return 0
	}
	fit, ok := data.(scalarRequests)
	if !ok {
		return 0
	}
	scalars := fit.GetScalarResources()
	count := v1.ResourceName(pl.args.ResourceCountName)
	devices := scalars[count]
	for _, name := range []string{pl.args.ResourceCountName, pl.args.ResourceMemoryName, pl.args.ResourceMemoryPercentageName, pl.args.ResourceCoreName,
		pl.device.Nvidia.ResourcePriorityName} {
		delete(scalars, v1.ResourceName(name))
	}
	return devices
}

// fitsDeviceCount is NodeResourcesFit's check of the device count taken from its request:
// the node's allocatable count minus what its pods request, the same reason and codes, and
// the same delegation to DynamicResources of a count that no device plugin advertises on
// the node but a DeviceClass maps (DRA-backed extended resources, KEP-5004).
func (pl *DynamicMIG) fitsDeviceCount(devices int64, nodeInfo fwk.NodeInfo) *fwk.Status {
	if devices == 0 {
		return nil
	}
	count := v1.ResourceName(pl.args.ResourceCountName)
	allocatable := nodeInfo.GetAllocatable().GetScalarResources()[count]
	if allocatable == 0 && pl.draExtendedResources && pl.handle.SharedDRAManager() != nil &&
		pl.handle.SharedDRAManager().DeviceClassResolver().GetDeviceClass(count) != nil {
		return nil
	}
	if devices <= allocatable-nodeInfo.GetRequested().GetScalarResources()[count] {
		return nil
	}
	code := fwk.Unschedulable
	if devices > allocatable {
		code = fwk.UnschedulableAndUnresolvable
	}
	return fwk.NewStatus(code, fmt.Sprintf("Insufficient %v", count))
}
