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

// reasonRank is a reason's position in Reasons, from 1; ReasonNone's is 0.
var reasonRank = func() map[Reason]int {
	m := map[Reason]int{ReasonNone: 0}
	for i, r := range Reasons {
		m[r] = i + 1
	}
	return m
}()

// refusal is one reason with its node-specific detail.
type refusal struct {
	reason Reason
	detail string
}

// worst keeps the refusal closer to fitting: a
// fragmented GPU says more than one with no big-enough profile.
func (r refusal) closer(o refusal) refusal {
	if reasonRank[o.reason] > reasonRank[r.reason] {
		return o
	}
	return r
}
