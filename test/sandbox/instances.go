package sandbox

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/dynamig/dynamig/api"
	"github.com/dynamig/dynamig/deviceplugin/instances"
	"github.com/dynamig/dynamig/inspect"
	"github.com/dynamig/dynamig/test/cluster"
)

// Instance is a MIG instance as a node's device plugin reports it (cluster.Instance).
type Instance = cluster.Instance

// Instances reads the MIG instances on node's simulated GPUs from its device plugin's
// /metrics (cluster.ScrapeInstances).
//
// The device plugins of a sandbox share one process and so one metrics registry, which
// reports every node's instances: series are filtered by the node's GPU UUIDs.
func (s *Sandbox) Instances(node string) ([]Instance, error) {
	n := s.node(node)
	if n == nil {
		return nil, fmt.Errorf("no sandbox node %q", node)
	}
	ctx, cancel := context.WithTimeout(s.ctx, 10*time.Second)
	defer cancel()
	all, err := cluster.ScrapeInstances(ctx, n.metricsURL())
	if err != nil {
		return nil, err
	}
	ours := map[string]bool{}
	for _, id := range n.info().GPUUUIDs {
		ours[id] = true
	}
	return slices.DeleteFunc(all, func(in Instance) bool { return !ours[in.GPUUUID] }), nil
}

// GPUOccupancy is one MIG GPU's reservations, by placement.
type GPUOccupancy struct {
	Node  string
	GPU   api.GPU
	Slots []SlotRange
}

// SlotRange is a placement interval and what holds it (inspect's); Pod is "" for free
// slots, namespace/name or the name alone in the default namespace.
type SlotRange = inspect.SlotRange

// String prints `node GPU-… (type): [0,2) pod 2g.10gb | … | [6,8) free`; a hami-core GPU
// has no slots.
func (o GPUOccupancy) String() string {
	head := fmt.Sprintf("%s %s (%s):", o.Node, o.GPU.ID, o.GPU.Type)
	if o.GPU.Mode != api.ModeMIG {
		return head + " " + o.GPU.Mode + " (shared, not partitioned)"
	}
	var parts []string
	for _, r := range o.Slots {
		if r.Pod == "" {
			parts = append(parts, r.Placement.String()+" free")
		} else {
			parts = append(parts, fmt.Sprintf("%s %s %s", r.Placement, r.Pod, r.Profile))
		}
	}
	return head + " " + strings.Join(parts, " | ")
}

// Occupancy maps every GPU of every sandbox node (from the published inventories) to the
// MIG reservations of the pods bound there that have not ended, with the free intervals in
// between.
func (s *Sandbox) Occupancy(ctx context.Context) ([]GPUOccupancy, error) {
	pods, err := s.admin.CoreV1().Pods(metav1.NamespaceAll).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, err
	}
	var out []GPUOccupancy
	for _, n := range s.nodes {
		node, err := s.admin.CoreV1().Nodes().Get(ctx, n.cfg.Name, metav1.GetOptions{})
		if err != nil {
			return nil, err
		}
		gpus, err := api.DecodeInventory(node.Annotations[api.NodeInventoryAnnotation])
		if err != nil {
			return nil, fmt.Errorf("node %s: %w", n.cfg.Name, err)
		}
		byGPU := map[string][]inspect.SlotRange{}
		for i := range pods.Items {
			p := &pods.Items[i]
			if p.Spec.NodeName != n.cfg.Name || p.Status.Phase == v1.PodSucceeded || p.Status.Phase == v1.PodFailed {
				continue
			}
			raw, ok := p.Annotations[api.MigReservationsAnnotation]
			if !ok {
				continue
			}
			recs, err := api.DecodeMigReservations(raw)
			if err != nil {
				return nil, fmt.Errorf("pod %s/%s: %w", p.Namespace, p.Name, err)
			}
			name := p.Name
			if p.Namespace != metav1.NamespaceDefault {
				name = p.Namespace + "/" + p.Name
			}
			for _, r := range recs {
				byGPU[r.GPUUUID] = append(byGPU[r.GPUUUID], inspect.SlotRange{Placement: r.Placement, Pod: name, Profile: r.Profile, MIGUUID: r.MigUUID})
			}
		}
		for _, g := range gpus {
			o := GPUOccupancy{Node: n.cfg.Name, GPU: g}
			if g.Mode == api.ModeMIG {
				o.Slots = inspect.SlotMap(g.SlotCount(), byGPU[g.ID])
			}
			out = append(out, o)
		}
	}
	return out, nil
}

// MakeInstance creates a MIG instance (GPU and compute instance) of profile at placement on
// node's simulated GPU of that index, as someone other than dynamig would (nvidia-smi mig
// -cgi … -C): no pod holds it and no checkpoint records it.
func (s *Sandbox) MakeInstance(ctx context.Context, node string, gpu int, profile string, placement api.Placement) error {
	n := s.node(node)
	if n == nil {
		return fmt.Errorf("no sandbox node %q", node)
	}
	ids := n.info().GPUUUIDs
	if gpu < 0 || gpu >= len(ids) {
		return fmt.Errorf("node %s has %d GPUs, not a GPU %d", node, len(ids), gpu)
	}
	mgr, err := instances.New(n.gpus)
	if err != nil {
		return err
	}
	unlock, err := mgr.Lock(ids[gpu])
	if err != nil {
		return err
	}
	defer unlock()
	_, err = mgr.Create(ctx, ids[gpu], profile, placement)
	return err
}
