package inspect

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	corev1helpers "k8s.io/component-helpers/scheduling/corev1"

	"github.com/dynamig/dynamig/api"
	"github.com/dynamig/dynamig/config"
	"github.com/dynamig/dynamig/deviceplugin/inventory"
	"github.com/dynamig/dynamig/nvml/sim"
	"github.com/dynamig/dynamig/plugins/dynamicmig/placement"
)

// Landing is where Simulate puts one pod.
type Landing struct {
	Pod string `json:"pod"`
	// Node is where the pod lands; "" when it fits nowhere (Refusals says why) or is not
	// simulated (Skipped says why).
	Node    string   `json:"node,omitempty"`
	Devices []string `json:"devices,omitempty"`
	// Close are other nodes the pod fits whose DynamicMIG score is near enough to Node's that
	// kube-scheduler's other score plugins (CPU and memory balance, image locality, at weight
	// 1 each) can decide for them instead.
	Close []string `json:"close,omitempty"`
	// Refusals counts, per reason, the nodes that refuse the pod, as its Pending event does.
	Refusals map[string]int `json:"refusals,omitempty"`
	// Refusal is the scheduler's PreFilter refusal, which refuses every node at once.
	Refusal string `json:"refusal,omitempty"`
	Skipped string `json:"skipped,omitempty"`
}

// dynamicMIGWeight is DynamicMIG's Score weight in the shipped scheduler profile, and
// otherScoreRoom the most kube-scheduler's other default score plugins can add for a pod
// without affinity, spread constraints or tolerations (NodeResourcesBalancedAllocation and
// ImageLocality, 100 each at weight 1; the profile turns NodeResourcesFit's score off).
const (
	dynamicMIGWeight = 10
	otherScoreRoom   = 200
)

// Simulate places pods, one by one in the scheduler's queue order (higher priority first,
// then as given), on the cluster of nodes, existing pods and heartbeat leases, with policy,
// each pod seeing the ones placed before it. It writes nothing.
func Simulate(pods []*v1.Pod, nodes []v1.Node, existing []v1.Pod, leases []coordinationv1.Lease, policy *Policy, now time.Time) []Landing {
	candidates := newCandidates(nodes, existing, leases, now, nil)
	order := slices.Clone(pods)
	slices.SortStableFunc(order, func(a, b *v1.Pod) int {
		return cmp.Compare(corev1helpers.PodPriority(b), corev1helpers.PodPriority(a))
	})
	var out []Landing
	for _, pod := range order {
		l := Landing{Pod: pod.Namespace + "/" + pod.Name}
		req, err := policy.parse(pod)
		if err != nil {
			l.Skipped = err.Error()
			out = append(out, l)
			continue
		}
		if why := policy.preFilter(req, candidates); why != "" {
			l.Refusal = why
			out = append(out, l)
			continue
		}
		var fits []judgement
		refusals := map[string]int{}
		quotas := policy.quotaCheck(pod, candidates)
		for _, c := range candidates {
			if j := policy.judge(pod, req, c, quotas); j.Fits {
				fits = append(fits, j)
			} else {
				refusals[j.Reason]++
			}
		}
		if len(fits) == 0 {
			l.Refusals = refusals
			out = append(out, l)
			continue
		}
		scores := normalized(fits, req.NodePolicy)
		best := 0
		for i, sc := range scores {
			if sc > scores[best] {
				best = i
			}
		}
		l.Node, l.Devices = fits[best].Node, fits[best].Devices
		for i, j := range fits {
			if i != best && scores[i]*dynamicMIGWeight > scores[best]*dynamicMIGWeight-otherScoreRoom {
				l.Close = append(l.Close, j.Node)
			}
		}
		c := fits[best].candidate
		c.holders = append(c.holders, holder{pod: l.Pod, assignments: fits[best].result.Assignments})
		c.add(pod)
		out = append(out, l)
	}
	return out
}

// normalized is each fit's DynamicMIG score as NormalizeScore gives it, before its weight.
func normalized(fits []judgement, nodePolicy string) []int64 {
	names := make([]string, len(fits))
	scores := make([]int64, len(fits))
	for i, j := range fits {
		names[i], scores[i] = j.Node, j.score
	}
	placement.NormalizeScores(names, scores, nodePolicy)
	return scores
}

// DescribedNode is a node of a described cluster: a name, its GPUs (model keys or NVML
// names) and the operating mode its device config gives it.
type DescribedNode struct {
	Name   string
	Models []string
	Mode   string
}

// ParseNodes reads described nodes: NAME=[COUNTx]MODEL[+[COUNTx]MODEL…][:MODE], e.g.
// "a=8xA100-40GB" or "b=2xH100-80GB+A30-24GB:hami-core". MODE is mig (the default) or
// hami-core.
func ParseNodes(specs []string) ([]DescribedNode, error) {
	var out []DescribedNode
	seen := map[string]bool{}
	for _, spec := range specs {
		name, gpus, ok := strings.Cut(spec, "=")
		if !ok || name == "" || gpus == "" {
			return nil, fmt.Errorf("--nodes %q: want NAME=[COUNTx]MODEL[+…][:MODE], e.g. gpu-1=8xA100-40GB", spec)
		}
		if seen[name] {
			return nil, fmt.Errorf("--nodes %q: node %s is described twice", spec, name)
		}
		seen[name] = true
		n := DescribedNode{Name: name, Mode: api.ModeMIG}
		if g, mode, ok := strings.Cut(gpus, ":"); ok {
			if mode != api.ModeMIG && mode != api.ModeHAMiCore {
				return nil, fmt.Errorf("--nodes %q: mode %q: want %s or %s", spec, mode, api.ModeMIG, api.ModeHAMiCore)
			}
			gpus, n.Mode = g, mode
		}
		for _, part := range strings.Split(gpus, "+") {
			count, model := 1, part
			if c, m, ok := strings.Cut(part, "x"); ok {
				if _, err := fmt.Sscanf(c, "%d", &count); err == nil && fmt.Sprint(count) == c {
					model = m
				} else {
					count = 1
				}
			}
			if count < 1 || count > 64 {
				return nil, fmt.Errorf("--nodes %q: %d GPUs of %s: want 1 to 64", spec, count, model)
			}
			if _, ok := config.LookupModel(model); !ok {
				return nil, fmt.Errorf("--nodes %q: unknown GPU model %q: want one of %s (kubectl dynamig models)", spec, model, strings.Join(config.ModelKeys(), ", "))
			}
			for range count {
				n.Models = append(n.Models, model)
			}
		}
		out = append(out, n)
	}
	return out, nil
}

// BuildNodes makes the Node objects and fresh heartbeat Leases of described nodes: each
// node's inventory is what dynamig's device plugin publishes (its own inventory code) for
// simulated GPUs of those models, with device's allowlist and the node's mode. Each node
// can take 110 pods and has 64 CPUs and 512 GiB of memory.
func BuildNodes(ctx context.Context, described []DescribedNode, device *config.DeviceConfig, leaseNamespace string, now time.Time) ([]v1.Node, []coordinationv1.Lease, error) {
	var nodes []v1.Node
	var leases []coordinationv1.Lease
	for _, d := range described {
		// The described mode wins over the device config's (Node reads the first entry).
		cfg, nc := *device, device.Node(d.Name)
		nc.OperatingMode = d.Mode
		cfg.NodeConfig = append([]config.NodeConfig{nc}, device.NodeConfig...)
		specs := make([]sim.GPUSpec, len(d.Models))
		for i, m := range d.Models {
			specs[i] = sim.GPUSpec{Model: m}
		}
		sim.SetMIGModeFor(specs, d.Mode)
		lib, err := sim.New(sim.Options{Seed: d.Name}, specs...)
		if err != nil {
			return nil, nil, fmt.Errorf("node %s: %w", d.Name, err)
		}
		if err := lib.Init(); err != nil {
			return nil, nil, fmt.Errorf("node %s: %w", d.Name, err)
		}
		res, err := inventory.Discover(ctx, lib, &cfg, d.Name)
		if err != nil {
			return nil, nil, fmt.Errorf("node %s: %w", d.Name, err)
		}
		raw, err := api.EncodeInventory(res.GPUs)
		if err != nil {
			return nil, nil, fmt.Errorf("node %s: %w", d.Name, err)
		}
		devices := 0
		for _, g := range res.GPUs {
			devices += g.Count
		}
		alloc := v1.ResourceList{
			v1.ResourceCPU:    resource.MustParse("64"),
			v1.ResourceMemory: resource.MustParse("512Gi"),
			v1.ResourcePods:   resource.MustParse("110"),
			v1.ResourceName(device.Nvidia.ResourceCountName): *resource.NewQuantity(int64(devices), resource.DecimalSI),
		}
		nodes = append(nodes, v1.Node{
			ObjectMeta: metav1.ObjectMeta{Name: d.Name, Labels: map[string]string{v1.LabelHostname: d.Name, "gpu": "on"},
				Annotations: map[string]string{api.NodeInventoryAnnotation: raw}},
			Status: v1.NodeStatus{Capacity: alloc, Allocatable: alloc},
		})
		renew, seconds := metav1.NewMicroTime(now), int32(3600)
		leases = append(leases, coordinationv1.Lease{
			ObjectMeta: metav1.ObjectMeta{Name: api.HeartbeatLeasePrefix + d.Name, Namespace: leaseNamespace},
			Spec:       coordinationv1.LeaseSpec{RenewTime: &renew, LeaseDurationSeconds: &seconds},
		})
	}
	return nodes, leases, nil
}
