package inspect

import (
	"fmt"
	"slices"
	"strings"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	v1 "k8s.io/api/core/v1"

	"github.com/dynamig/dynamig/api"
	"github.com/dynamig/dynamig/plugins/dynamicmig/placement"
)

// Verdict is whether a pod's GPU request fits one node now, by the scheduler's filters:
// kube-scheduler's that can be told from the objects (unschedulable, node name, taints, node
// affinity and selector, CPU, memory and pods), then DynamicMIG's (the heartbeat, the
// inventory, the allocator, placement.Fit, on the node's GPUs as the pods bound there
// occupy them).
type Verdict struct {
	Node string `json:"node"`
	// GPUNode: the node publishes a GPU inventory or renews a dynamig heartbeat.
	GPUNode bool `json:"gpuNode"`
	Fits    bool `json:"fits"`
	// Reason is the scheduler's refusal reason (what its Pending event counts), Detail the
	// allocator's detail (container, device, GPU).
	Reason string `json:"reason,omitempty"`
	Detail string `json:"detail,omitempty"`
	// Layout is, when other pods' instances or shares are in the way, each MIG GPU's slot map.
	Layout []string `json:"layout,omitempty"`
	// FitsWithout is the smallest change that makes the pod fit: sets of pods (namespace/name)
	// whose ending would each make room — single pods if any would, else pairs.
	FitsWithout [][]string `json:"fitsWithout,omitempty"`
	// Relocation, where the scheduler's args turn relocation on, are the relocatable pods
	// (namespace/name) its PostFilter would evict to make room here: the smallest set on one
	// GPU, each fitting on another node now (their disruption budgets and the relocation
	// interval are the scheduler's to check).
	Relocation []string `json:"relocation,omitempty"`
	// Devices are the devices the pod would get, when it fits.
	Devices []string `json:"devices,omitempty"`
}

// Explanation is why a pod fits where it does, or does not.
type Explanation struct {
	// Refusal is the scheduler's PreFilter refusal, which refuses every node at once (its
	// Pending event then counts no nodes); Nodes is empty then.
	Refusal string    `json:"refusal,omitempty"`
	Nodes   []Verdict `json:"nodes"`
}

// Explain says, per node, whether pod's GPU request fits it now and, if not, why, with the
// smallest change that would make it fit. pod itself is left out of the occupancy.
func Explain(pod *v1.Pod, nodes []v1.Node, pods []v1.Pod, leases []coordinationv1.Lease, policy *Policy, now time.Time) (*Explanation, error) {
	req, err := policy.parse(pod)
	if err != nil {
		return nil, err
	}
	candidates := newCandidates(nodes, pods, leases, now, pod)
	if why := policy.preFilter(req, candidates); why != "" {
		return &Explanation{Refusal: why, Nodes: []Verdict{}}, nil
	}
	out := []Verdict{}
	quotas := policy.quotaCheck(pod, candidates)
	for _, c := range candidates {
		j := policy.judge(pod, req, c, quotas)
		j.GPUNode = c.gpuNode
		if j.Layout != nil && policy.Args.Relocation.Enabled {
			j.Relocation = policy.relocation(pod, req, c, candidates)
		}
		out = append(out, j.Verdict)
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
	return &Explanation{Nodes: out}, nil
}

// describe is one assigned device: "container 0 device 0: 2g.10gb [6,8) on GPU-…" or
// "… 4000 MiB 30% of GPU-…".
func describe(a placement.Assignment) string {
	if a.Mode == api.ModeMIG {
		return fmt.Sprintf("container %d device %d: %s %s on %s", a.ContainerIndex, a.DeviceIndex, a.Profile, a.Placement, a.GPUUUID)
	}
	return fmt.Sprintf("container %d device %d: %d MiB %d%% of %s", a.ContainerIndex, a.DeviceIndex, a.MemoryMiB, a.Cores, a.GPUUUID)
}
