// Package inspect reads what dynamig did out of the cluster's objects — each node's GPU
// inventory and heartbeat Lease, each pod's reservations — into per-GPU slot maps, per-profile
// room and per-pod states, for kubectl-dynamig and the sandbox. It computes from the objects
// it is given and calls no API server.
package inspect

import (
	"cmp"
	"slices"
	"strings"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	v1 "k8s.io/api/core/v1"

	"github.com/dynamig/dynamig/api"
	"github.com/dynamig/dynamig/plugins/dynamicmig/placement"
)

// Cluster is the GPU side of a cluster at one moment.
type Cluster struct {
	Nodes []Node `json:"nodes"`
	Pods  []Pod  `json:"pods"`
}

// Node is one node that publishes (or should publish) a GPU inventory.
type Node struct {
	Name string `json:"name"`
	// Inventory is "" when the node's inventory annotation decoded, else what is wrong with it
	// ("missing", or the decode error).
	Inventory string `json:"inventory,omitempty"`
	// Heartbeat is the device plugin's heartbeat: "fresh", "expired" or "missing".
	Heartbeat string `json:"heartbeat"`
	// HeartbeatUntil is when a fresh heartbeat expires (zero when missing).
	HeartbeatUntil time.Time `json:"heartbeatUntil,omitzero"`
	GPUs           []GPU     `json:"gpus"`
}

// GPU is one GPU of a node's inventory with what holds it.
type GPU struct {
	api.GPU `json:",inline"`
	// Slots covers the GPU's memory slots in order (MIG GPUs): each reservation's placement
	// and the free intervals between them.
	Slots []SlotRange `json:"slots,omitempty"`
	// Room is, per profile the GPU offers, how many more instances fit now and where (MIG).
	Room []ProfileRoom `json:"room,omitempty"`
	// Shares are the hami-core devices allocated on the GPU.
	Shares []Share `json:"shares,omitempty"`
}

// SlotRange is a placement interval and the reservation holding it; Pod is "" for free slots
// and for an instance no reservation explains (Unexplained).
type SlotRange struct {
	Placement api.Placement `json:"placement"`
	// Unexplained: a MIG instance the device plugin reports that no live reservation
	// explains (made by someone else, or still running processes after its pod ended).
	Unexplained bool `json:"unexplained,omitempty"`
	// Pod is namespace/name.
	Pod     string `json:"pod,omitempty"`
	Profile string `json:"profile,omitempty"`
	MIGUUID string `json:"migUUID,omitempty"`
}

// ProfileRoom is how many more instances of a profile fit on a GPU as it is occupied now,
// by the scheduler's own allocator rules (plugins/dynamicmig/placement), the free placements
// they could take, and the rule that allows no more, if one does.
type ProfileRoom struct {
	Profile string          `json:"profile"`
	More    int             `json:"more"`
	Free    []api.Placement `json:"free"`
	Limit   string          `json:"limit,omitempty"`
}

// Share is one hami-core device of a pod.
type Share struct {
	Pod       string `json:"pod"`
	MemoryMiB int    `json:"memoryMiB"`
	Cores     int    `json:"cores"`
}

// Pod is a GPU pod: one with a reservation, or one asking for the count resource.
type Pod struct {
	Namespace string    `json:"namespace"`
	Name      string    `json:"name"`
	Node      string    `json:"node,omitempty"`
	Phase     string    `json:"phase"`
	Created   time.Time `json:"created"`
	// State is "pending" (not bound), "reserved" (bound, not realised yet), "realised",
	// "failed" (the device plugin gave up; Reason says why) or "ended".
	State        string               `json:"state"`
	Reason       string               `json:"reason,omitempty"`
	Reservations []api.MigReservation `json:"reservations,omitempty"`
	Shares       []api.HAMiCoreDevice `json:"shares,omitempty"`
}

// Key is namespace/name.
func (p *Pod) Key() string { return p.Namespace + "/" + p.Name }

// Build reads the cluster's GPU side from its objects: nodes (those with an inventory
// annotation or a heartbeat Lease count), pods and the heartbeat Leases, at now. resource is
// the count resource (nvidia.com/gpu) that makes a pod without reservations a GPU pod.
func Build(nodes []v1.Node, pods []v1.Pod, leases []coordinationv1.Lease, resource v1.ResourceName, now time.Time) *Cluster {
	c := &Cluster{}
	for i := range pods {
		if p, ok := buildPod(&pods[i], resource); ok {
			c.Pods = append(c.Pods, p)
		}
	}
	slices.SortFunc(c.Pods, func(a, b Pod) int { return cmp.Compare(a.Key(), b.Key()) })
	for _, n := range readNodes(nodes, leases, now) {
		for _, g := range n.inventory {
			n.GPUs = append(n.GPUs, buildGPU(g, n.Name, c.Pods))
		}
		c.Nodes = append(c.Nodes, n.Node)
	}
	return c
}

// nodeState is a node's heartbeat and inventory state with its decoded inventory.
type nodeState struct {
	Node
	inventory []api.GPU
}

// readNodes reads, for every node that publishes an inventory or renews a heartbeat Lease,
// the heartbeat's state at now and the inventory, in node order.
func readNodes(nodes []v1.Node, leases []coordinationv1.Lease, now time.Time) []nodeState {
	heartbeats := map[string]time.Time{}
	for i := range leases {
		l := &leases[i]
		if node, ok := strings.CutPrefix(l.Name, api.HeartbeatLeasePrefix); ok {
			heartbeats[node] = time.Time{}
			if l.Spec.RenewTime != nil && l.Spec.LeaseDurationSeconds != nil {
				heartbeats[node] = l.Spec.RenewTime.Add(time.Duration(*l.Spec.LeaseDurationSeconds) * time.Second)
			}
		}
	}
	var out []nodeState
	for i := range nodes {
		n := &nodes[i]
		raw, published := n.Annotations[api.NodeInventoryAnnotation]
		until, beating := heartbeats[n.Name]
		if !published && !beating {
			continue
		}
		st := nodeState{Node: Node{Name: n.Name, Heartbeat: "missing"}}
		if beating {
			st.Heartbeat, st.HeartbeatUntil = "expired", until
			if now.Before(until) {
				st.Heartbeat = "fresh"
			}
		}
		gpus, err := api.DecodeInventory(raw)
		switch {
		case !published:
			st.Inventory = "missing"
		case err != nil:
			st.Inventory = err.Error()
		default:
			st.inventory = gpus
		}
		out = append(out, st)
	}
	slices.SortFunc(out, func(a, b nodeState) int { return cmp.Compare(a.Name, b.Name) })
	return out
}

// buildPod reads a pod's GPU state; ok is false for pods that neither ask for the count
// resource nor carry a reservation.
func buildPod(p *v1.Pod, resource v1.ResourceName) (Pod, bool) {
	out := Pod{Namespace: p.Namespace, Name: p.Name, Node: p.Spec.NodeName, Phase: string(p.Status.Phase), Created: p.CreationTimestamp.Time}
	raw, hasMIG := p.Annotations[api.MigReservationsAnnotation]
	shares, hasShares := p.Annotations[api.DevicesAllocatedAnnotation]
	if !hasMIG && !hasShares && !asksFor(p, resource) {
		return out, false
	}
	if hasMIG {
		recs, err := api.DecodeMigReservations(raw)
		if err != nil {
			out.State, out.Reason = "failed", "unreadable reservation: "+err.Error()
			return out, true
		}
		out.Reservations = recs
	}
	if hasShares {
		if devs, err := api.DecodeHAMiCoreDevices(api.DevicesAllocatedAnnotation, shares); err == nil {
			for _, c := range devs {
				out.Shares = append(out.Shares, c...)
			}
		}
	}
	switch {
	case p.Status.Phase == v1.PodSucceeded || p.Status.Phase == v1.PodFailed:
		out.State = "ended"
	case p.Spec.NodeName == "":
		out.State = "pending"
	case p.Annotations[api.BindPhaseAnnotation] == api.BindPhaseFailed:
		out.State, out.Reason = "failed", p.Annotations[api.BindFailureAnnotation]
	case p.Annotations[api.BindPhaseAnnotation] == api.BindPhaseSuccess:
		out.State = "realised"
	default:
		out.State = "reserved"
	}
	return out, true
}

func asksFor(p *v1.Pod, resource v1.ResourceName) bool {
	for _, cs := range [][]v1.Container{p.Spec.InitContainers, p.Spec.Containers} {
		for _, c := range cs {
			if _, ok := c.Resources.Limits[resource]; ok {
				return true
			}
			if _, ok := c.Resources.Requests[resource]; ok {
				return true
			}
		}
	}
	return false
}

// buildGPU lays the reservations of the node's pods that have not ended out on g.
func buildGPU(g api.GPU, node string, pods []Pod) GPU {
	out := GPU{GPU: g}
	var used []SlotRange
	for i := range pods {
		p := &pods[i]
		if p.Node != node || p.State == "ended" {
			continue
		}
		for _, r := range p.Reservations {
			if r.GPUUUID == g.ID {
				used = append(used, SlotRange{Placement: r.Placement, Pod: p.Key(), Profile: r.Profile, MIGUUID: r.MigUUID})
			}
		}
		for _, s := range p.Shares {
			if s.UUID == g.ID {
				out.Shares = append(out.Shares, Share{Pod: p.Key(), MemoryMiB: s.MemoryMiB, Cores: s.Cores})
			}
		}
	}
	if g.Mode != api.ModeMIG {
		return out
	}
	for _, in := range g.Unexplained {
		used = append(used, SlotRange{Placement: in.Placement, Profile: in.Profile, Unexplained: true})
	}
	out.Slots = SlotMap(g.SlotCount(), used)
	instances := make([]placement.Instance, len(used))
	for i, u := range used {
		instances[i] = placement.Instance{Profile: u.Profile, Placement: u.Placement}
	}
	for _, r := range placement.Room(&g, instances) {
		out.Room = append(out.Room, ProfileRoom{Profile: r.Profile, More: r.More, Free: r.Free, Limit: r.Limit})
	}
	return out
}

// SlotMap lays used out over slots memory slots, in order, with the free intervals between.
func SlotMap(slots int, used []SlotRange) []SlotRange {
	used = slices.Clone(used)
	slices.SortFunc(used, func(a, b SlotRange) int { return a.Placement.Start - b.Placement.Start })
	var out []SlotRange
	at := 0
	for _, r := range used {
		if r.Placement.Start > at {
			out = append(out, SlotRange{Placement: api.Placement{Start: at, Size: r.Placement.Start - at}})
		}
		out = append(out, r)
		at = max(at, r.Placement.End())
	}
	if slots > at {
		out = append(out, SlotRange{Placement: api.Placement{Start: at, Size: slots - at}})
	}
	return out
}
