package inspect

import (
	"fmt"
	"slices"
	"strings"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	v1 "k8s.io/api/core/v1"

	"github.com/dynamig/dynamig/api"
	"github.com/dynamig/dynamig/config"
	"github.com/dynamig/dynamig/plugins/dynamicmig/placement"
	"github.com/dynamig/dynamig/plugins/dynamicmig/request"
)

// Verdict is whether a pod's GPU request fits one node now, by DynamicMIG's own Filter
// steps: the heartbeat, the inventory, then the allocator (placement.Fit) on the node's GPUs
// as the pods bound there occupy them.
type Verdict struct {
	Node string `json:"node"`
	Fits bool   `json:"fits"`
	// Reason is the scheduler's refusal reason (what its Pending event says), Detail the
	// allocator's detail (container, device, GPU).
	Reason string `json:"reason,omitempty"`
	Detail string `json:"detail,omitempty"`
	// Devices are the devices the pod would get, when it fits.
	Devices []string `json:"devices,omitempty"`
}

// Explain says, per node that publishes an inventory or a heartbeat, whether pod's GPU
// request fits it now and, if not, why. args are the scheduler's DynamicMIG args and device
// its device config (the allowlist is already in each node's inventory). kube-scheduler's
// own filters (node selectors, taints, CPU and memory) are not evaluated.
func Explain(pod *v1.Pod, nodes []v1.Node, pods []v1.Pod, leases []coordinationv1.Lease, args *config.DynamicMIGArgs, device *config.DeviceConfig, now time.Time) ([]Verdict, error) {
	req, err := request.Parse(pod, args.ResourceNames, args.NodeSchedulerPolicy)
	if err != nil {
		return nil, fmt.Errorf("pod %s/%s: %w", pod.Namespace, pod.Name, err)
	}
	if req == nil {
		return nil, fmt.Errorf("pod %s/%s asks for no %s: it is not a GPU pod", pod.Namespace, pod.Name, args.ResourceCountName)
	}
	opts := placement.Options{MIGPolicy: args.MIGGPUSchedulerPolicy, HAMiCorePolicy: args.HAMiCoreGPUSchedulerPolicy,
		FragmentationAware: args.FragmentationAware == nil || *args.FragmentationAware,
		DefaultMemory:      device.Nvidia.DefaultMemory, DefaultCores: device.Nvidia.DefaultCores}
	var out []Verdict
	for _, n := range readNodes(nodes, leases, now) {
		v := Verdict{Node: n.Name}
		switch {
		case n.Heartbeat != "fresh":
			v.Reason = "node's dynamig-device-plugin heartbeat " + n.Heartbeat
		case n.Inventory == "missing":
			v.Reason = "node publishes no GPU inventory"
		case n.Inventory != "":
			v.Reason = "unreadable GPU inventory: " + n.Inventory
		}
		if v.Reason != "" {
			out = append(out, v)
			continue
		}
		gpus := placement.GPUsOf(n.inventory)
		if err := occupy(gpus, n.Name, pod, pods); err != nil {
			v.Reason = err.Error()
			out = append(out, v)
			continue
		}
		res, refusal := placement.Fit(gpus, &req.Request, opts)
		if refusal != nil {
			v.Reason, v.Detail = string(refusal.Reason), refusal.Detail
		} else {
			v.Fits = true
			for _, a := range res.Assignments {
				v.Devices = append(v.Devices, describe(a))
			}
		}
		out = append(out, v)
	}
	slices.SortStableFunc(out, func(a, b Verdict) int {
		if a.Fits != b.Fits {
			if a.Fits {
				return -1
			}
			return 1
		}
		return strings.Compare(a.Node, b.Node)
	})
	return out, nil
}

// occupy adds the reservations of the pods bound to node that have not ended (pod itself
// excepted) to gpus, as the scheduler's Filter does.
func occupy(gpus []placement.GPU, node string, pod *v1.Pod, pods []v1.Pod) error {
	for i := range pods {
		p := &pods[i]
		if p.Spec.NodeName != node || p.Namespace == pod.Namespace && p.Name == pod.Name || p.Status.Phase == v1.PodSucceeded || p.Status.Phase == v1.PodFailed {
			continue
		}
		if _, err := placement.AddAnnotated(gpus, p.Annotations, api.DecodeMigReservations); err != nil {
			return fmt.Errorf("pod %s/%s on the node has an unreadable reservation: %v", p.Namespace, p.Name, err)
		}
	}
	return nil
}

// describe is one assigned device: "container 0 device 0: 2g.10gb [6,8) on GPU-…" or
// "… 4000 MiB 30% of GPU-…".
func describe(a placement.Assignment) string {
	if a.Mode == api.ModeMIG {
		return fmt.Sprintf("container %d device %d: %s %s on %s", a.ContainerIndex, a.DeviceIndex, a.Profile, a.Placement, a.GPUUUID)
	}
	return fmt.Sprintf("container %d device %d: %d MiB %d%% of %s", a.ContainerIndex, a.DeviceIndex, a.MemoryMiB, a.Cores, a.GPUUUID)
}
