package placement

// Reason is why a pod does not fit a node. The strings are stable: the scheduler shows them
// as unschedulable reasons, and it groups equal reasons across nodes.
type Reason string

// Reasons, from the least to the most hopeful (see refusal.closer).
const (
	ReasonNone            Reason = ""
	ReasonNoGPU           Reason = "no GPU of the requested mode"
	ReasonUnusable        Reason = "GPU unusable in its node's mode"
	ReasonNotSelected     Reason = "no GPU of the requested type or UUID"
	ReasonNoMIGGPU        Reason = "no MIG-capable GPU of the allowed type"
	ReasonNoProfile       Reason = "no allowlisted MIG profile big enough"
	ReasonShareLimit      Reason = "GPU share limit reached (shares, memory or cores)"
	ReasonPlacementsTaken Reason = "all MIG placements taken"
	ReasonInstanceLimit   Reason = "MIG instance limit reached"
	ReasonFragmented      Reason = "MIG GPU fragmented: enough free slots but no legal placement"
	// ReasonNUMA: the pod fits the node, but not on the GPUs of one NUMA node, which
	// nvidia.com/numa-bind asks.
	ReasonNUMA Reason = "no NUMA node has room for all the pod's GPU devices"
)

// Reasons of DynamicMIG's Filter before the allocator runs (the node's device plugin).
const (
	ReasonNoInventory Reason = "node publishes no GPU inventory (no dynamig-device-plugin)"
	ReasonHeartbeat   Reason = "node's dynamig-device-plugin heartbeat expired"
)

// Reasons lists the allocator's reasons, from the least to the most hopeful.
var Reasons = []Reason{ReasonNoGPU, ReasonUnusable, ReasonNotSelected, ReasonNoMIGGPU, ReasonNoProfile,
	ReasonShareLimit, ReasonPlacementsTaken, ReasonInstanceLimit, ReasonFragmented, ReasonNUMA}

// rank is a reason's position in Reasons, from 1; ReasonNone's is 0. A switch, not a map:
// every node a pod does not fit ranks a refusal per GPU, and hashing the strings was an
// eighth of the packing benchmark's relocation replay.
func (r Reason) rank() int {
	switch r {
	case ReasonNoGPU:
		return 1
	case ReasonUnusable:
		return 2
	case ReasonNotSelected:
		return 3
	case ReasonNoMIGGPU:
		return 4
	case ReasonNoProfile:
		return 5
	case ReasonShareLimit:
		return 6
	case ReasonPlacementsTaken:
		return 7
	case ReasonInstanceLimit:
		return 8
	case ReasonFragmented:
		return 9
	case ReasonNUMA:
		return 10
	}
	return 0
}

// refusal is one reason with its node-specific detail.
type refusal struct {
	reason Reason
	detail string
}

// closer keeps the refusal closer to fitting: a fragmented GPU says more than one with no
// big-enough profile.
func (r refusal) closer(o refusal) refusal {
	if o.reason.rank() > r.reason.rank() {
		return o
	}
	return r
}
