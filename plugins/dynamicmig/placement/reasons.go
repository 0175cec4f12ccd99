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
)

var reasonRank = map[Reason]int{
	ReasonNone: 0, ReasonNoGPU: 1, ReasonUnusable: 2, ReasonNotSelected: 3, ReasonNoMIGGPU: 4, ReasonNoProfile: 5,
	ReasonShareLimit: 6, ReasonPlacementsTaken: 7, ReasonInstanceLimit: 8, ReasonFragmented: 9,
}

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
