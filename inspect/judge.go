package inspect

import (
	"fmt"
	"slices"
	"strings"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	v1 "k8s.io/api/core/v1"
	resourcehelper "k8s.io/component-helpers/resource"
	corev1helpers "k8s.io/component-helpers/scheduling/corev1"
	"k8s.io/component-helpers/scheduling/corev1/nodeaffinity"
	"k8s.io/klog/v2"

	"github.com/dynamig/dynamig/api"
	"github.com/dynamig/dynamig/config"
	"github.com/dynamig/dynamig/plugins/dynamicmig/placement"
	"github.com/dynamig/dynamig/plugins/dynamicmig/quota"
	"github.com/dynamig/dynamig/plugins/dynamicmig/request"
)

// Policy is what the scheduler decides with besides the cluster's objects: DynamicMIG's
// args (the cluster's scheduler ConfigMap, or the shipped defaults) and the device config.
type Policy struct {
	Args   *config.DynamicMIGArgs
	Device *config.DeviceConfig
	// Quotas are the cluster's ResourceQuotas: those with GPU limits refuse a pod whose grant
	// would take its namespace past them (Explain).
	Quotas []v1.ResourceQuota
}

// quotaCheck is the pod's namespace's GPU quota check as the scheduler's PreFilter counts
// it, over the bound pods of candidates and the pods a simulation placed; nil when no quota
// limits the namespace.
func (p *Policy) quotaCheck(pod *v1.Pod, candidates []*candidate) *quota.Check {
	names := quota.NamesOf(p.Args.ResourceMemoryName, p.Args.ResourceCoreName)
	check := &quota.Check{Namespace: pod.Namespace}
	for i := range p.Quotas {
		if l, ok := names.Of(&p.Quotas[i]); ok && p.Quotas[i].Namespace == pod.Namespace {
			check.Limits = append(check.Limits, l)
		}
	}
	if len(check.Limits) == 0 {
		return nil
	}
	if used := namespaceGrants(candidates)[pod.Namespace]; used != nil {
		check.Used = *used
	}
	return check
}

func (p *Policy) options() placement.Options {
	return placement.Options{MIGPolicy: p.Args.MIGGPUSchedulerPolicy, HAMiCorePolicy: p.Args.HAMiCoreGPUSchedulerPolicy,
		FragmentationAware: p.Args.FragmentationAware == nil || *p.Args.FragmentationAware,
		DefaultMemory:      p.Device.Nvidia.DefaultMemory, DefaultCores: p.Device.Nvidia.DefaultCores}
}

// parse reads pod's GPU request as the scheduler's PreFilter does.
func (p *Policy) parse(pod *v1.Pod) (*request.Request, error) {
	req, err := request.Parse(pod, p.Args.ResourceNames, p.Args.NodeSchedulerPolicy)
	if err != nil {
		return nil, fmt.Errorf("pod %s/%s: %w", pod.Namespace, pod.Name, err)
	}
	if req == nil {
		return nil, fmt.Errorf("pod %s/%s asks for no %s: it is not a GPU pod", pod.Namespace, pod.Name, p.Args.ResourceCountName)
	}
	return req, nil
}

// preFilter is DynamicMIG's PreFilter refusal of req on the cluster of candidates: more
// memory per device than any node's largest device of the mode, or no node with a GPU of the
// mode; or "".
func (p *Policy) preFilter(req *request.Request, candidates []*candidate) string {
	largest := 0
	for _, c := range candidates {
		for i := range c.inventory {
			if g := &c.inventory[i]; req.Mode == "" || g.Mode == req.Mode {
				largest = max(largest, g.LargestDeviceMiB())
			}
		}
	}
	if err := req.CheckLargest(largest, p.Args.ResourceMemoryName); err != nil {
		return err.Error()
	}
	if !slices.ContainsFunc(candidates, func(c *candidate) bool { return c.preFiltered(req.Mode) }) {
		return placement.NoGPUNodeMessage(req.Mode)
	}
	return ""
}

// preFiltered tells whether DynamicMIG's PreFilter hands the node to kube-scheduler for a pod
// of mode: its inventory has a GPU of the mode, or does not decode (Filter says why).
func (c *candidate) preFiltered(mode string) bool {
	switch c.Inventory {
	case "missing":
		return false
	case "":
		return placement.HasGPUOfMode(c.inventory, mode)
	}
	return true
}

// kube-scheduler's own Filter reasons, as its plugins word them, for the filters that run
// before DynamicMIG's and that can be told from the objects: NodeUnschedulable, NodeName,
// TaintToleration, NodeAffinity and NodeResourcesFit.
const (
	ReasonNodeUnschedulable = "node(s) were unschedulable"
	// ReasonNotPreFiltered is kube-scheduler's word for the nodes outside a PreFilterResult:
	// DynamicMIG's leaves out the nodes without a GPU of the pod's mode, before every filter.
	ReasonNotPreFiltered = "node(s) didn't satisfy plugin(s) [DynamicMIG]"
	ReasonNodeName       = "node(s) didn't match the requested node name"
	ReasonTaints         = "node(s) had untolerated taint(s)"
	ReasonNodeAffinity   = "node(s) didn't match Pod's node affinity/selector"
	ReasonTooManyPods    = "Too many pods"
	reasonInsufficient   = "Insufficient "
)

// candidate is one node as the scheduler's filters see it: its inventory with what holds
// its GPUs, and the CPU, memory and pods already requested on it.
type candidate struct {
	nodeState
	node *v1.Node
	// gpuNode: the node publishes an inventory or renews a heartbeat.
	gpuNode bool
	// holders occupy the node's GPUs: bound pods with reservations, and pods a simulation
	// placed there.
	holders   []holder
	requested v1.ResourceList
	pods      int
	// broken is a reservation on the node that does not decode (the scheduler places
	// nothing on such a node).
	broken string
}

// holder is one pod's hold on a node's GPUs.
type holder struct {
	pod string
	// obj is a bound pod (nil for a simulated one).
	obj *v1.Pod
	// held is a bound pod's reservations, decoded once; assignments a simulated pod's.
	held        placement.Held
	assignments []placement.Assignment
}

// newCandidates reads every node with the pods bound to it (those that have not ended; skip
// excepted) and the heartbeats, at now.
func newCandidates(nodes []v1.Node, pods []v1.Pod, leases []coordinationv1.Lease, now time.Time, skip *v1.Pod) []*candidate {
	states := map[string]nodeState{}
	for _, st := range readNodes(nodes, leases, now) {
		states[st.Name] = st
	}
	byName := map[string]*candidate{}
	var out []*candidate
	for i := range nodes {
		n := &nodes[i]
		st, gpuNode := states[n.Name]
		if !gpuNode {
			st = nodeState{Node: Node{Name: n.Name, Heartbeat: "missing", Inventory: "missing"}}
		}
		c := &candidate{nodeState: st, node: n, gpuNode: gpuNode, requested: v1.ResourceList{}}
		byName[n.Name] = c
		out = append(out, c)
	}
	for i := range pods {
		p := &pods[i]
		c := byName[p.Spec.NodeName]
		if c == nil || p.Status.Phase == v1.PodSucceeded || p.Status.Phase == v1.PodFailed || skip != nil && p.Namespace == skip.Namespace && p.Name == skip.Name {
			continue
		}
		c.add(p)
		held, found, err := placement.DecodeHeld(p.Annotations, api.DecodeMigReservations)
		switch {
		case err != nil && c.broken == "":
			// As the scheduler words it: an unreadable reservation could hide an occupied placement.
			c.broken = fmt.Sprintf("node %s: pod %s/%s: %v", c.Name, p.Namespace, p.Name, err)
		case err == nil && found:
			c.holders = append(c.holders, holder{pod: p.Namespace + "/" + p.Name, obj: p, held: held})
		}
	}
	return out
}

// add counts a pod's requests on the node, as the scheduler's NodeInfo does.
func (c *candidate) add(p *v1.Pod) {
	for name, q := range resourcehelper.PodRequests(p, resourcehelper.PodResourcesOptions{}) {
		sum := c.requested[name]
		sum.Add(q)
		c.requested[name] = sum
	}
	c.pods++
}

// gpus is the node's inventory with what its holders hold, without the holders at the
// indexes in without.
func (c *candidate) gpus(without ...int) []placement.GPU {
	gpus := placement.GPUsOf(c.inventory)
	for i, h := range c.holders {
		if slices.Contains(without, i) {
			continue
		}
		h.held.Add(gpus)
		placement.AddAssignments(gpus, h.assignments)
	}
	return gpus
}

// judgement is a verdict with what Score needs.
type judgement struct {
	Verdict
	candidate *candidate
	result    *placement.Result
	score     int64
}

// judge runs, for pod on c, kube-scheduler's object-only filters in its order, then
// DynamicMIG's Filter (heartbeat, inventory, reservations, the allocator, the namespace's
// GPU quotas when quotas is not nil) and, when the pod fits, DynamicMIG's Score.
func (p *Policy) judge(pod *v1.Pod, req *request.Request, c *candidate, quotas *quota.Check) judgement {
	j := judgement{Verdict: Verdict{Node: c.Name}, candidate: c}
	if !c.preFiltered(req.Mode) {
		j.Reason, j.Detail = ReasonNotPreFiltered, "the node publishes no GPU inventory"
		if c.Inventory == "" {
			j.Detail = fmt.Sprintf("the node's inventory has no %s GPU", req.Mode)
		}
		return j
	}
	if why := p.schedulerFilters(pod, c); why != "" {
		j.Reason = why
		return j
	}
	switch {
	case c.Heartbeat != "fresh":
		j.Reason, j.Detail = string(placement.ReasonHeartbeat), "heartbeat Lease "+c.Heartbeat
		if c.Heartbeat == "expired" {
			j.Detail += " at " + c.HeartbeatUntil.UTC().Format(time.RFC3339)
		}
		return j
	case c.Inventory == "missing":
		j.Reason = string(placement.ReasonNoInventory)
		return j
	case c.Inventory != "":
		j.Reason = "unreadable GPU inventory: " + c.Inventory
		return j
	case c.broken != "":
		j.Reason = c.broken
		return j
	}
	gpus := c.gpus()
	res, refusal := placement.Fit(gpus, &req.Request, p.options())
	if refusal != nil {
		j.Reason, j.Detail = string(refusal.Reason), refusal.Detail
		if blockable(refusal.Reason) {
			j.Layout = layouts(c, gpus)
			j.FitsWithout = p.fitsWithout(req, c)
		}
		return j
	}
	if quotas != nil {
		if msg := quotas.Exceeded(res.Grant(), quota.NamesOf(p.Args.ResourceMemoryName, p.Args.ResourceCoreName)); msg != "" {
			j.Reason = msg
			return j
		}
	}
	j.Fits, j.result = true, res
	for _, a := range res.Assignments {
		j.Devices = append(j.Devices, describe(a))
	}
	alloc := c.node.Status.Allocatable
	host := placement.HostUtilisation(c.requested.Cpu().MilliValue(), alloc.Cpu().MilliValue(), c.requested.Memory().Value(), alloc.Memory().Value())
	j.score = placement.NodeScore(placement.NodeUtilisation(gpus, res), host, placement.InUse(gpus), res.Cost, req.NodePolicy, p.options().FragmentationAware)
	return j
}

// schedulerFilters is the first of kube-scheduler's object-only filters that refuses pod on
// c, in the order its default profile runs them, or "".
func (p *Policy) schedulerFilters(pod *v1.Pod, c *candidate) string {
	logger := klog.Background()
	n := c.node
	if n.Spec.Unschedulable && !corev1helpers.TolerationsTolerateTaint(logger, pod.Spec.Tolerations,
		&v1.Taint{Key: v1.TaintNodeUnschedulable, Effect: v1.TaintEffectNoSchedule}, false) {
		return ReasonNodeUnschedulable
	}
	if pod.Spec.NodeName != "" && pod.Spec.NodeName != n.Name {
		return ReasonNodeName
	}
	if _, untolerated := corev1helpers.FindMatchingUntoleratedTaint(logger, n.Spec.Taints, pod.Spec.Tolerations, func(t *v1.Taint) bool {
		return t.Effect == v1.TaintEffectNoSchedule || t.Effect == v1.TaintEffectNoExecute
	}, false); untolerated {
		return ReasonTaints
	}
	if ok, _ := nodeaffinity.GetRequiredNodeAffinity(pod).Match(n); !ok {
		return ReasonNodeAffinity
	}
	names := p.Args.ResourceNames
	// The GPU request's resources: DynamicMIG takes them out of NodeResourcesFit's request,
	// checks the device count first in its Filter, and leaves memory and cores, which no node
	// advertises, to the allocator.
	count := v1.ResourceName(names.ResourceCountName)
	gpu := map[v1.ResourceName]bool{count: true, v1.ResourceName(names.ResourceMemoryName): true,
		v1.ResourceName(names.ResourceMemoryPercentageName): true, v1.ResourceName(names.ResourceCoreName): true,
		v1.ResourceName(p.Device.Nvidia.ResourcePriorityName): true}
	if r := c.insufficient(pod, func(name v1.ResourceName) bool { return !gpu[name] }); r != "" {
		return r
	}
	return c.insufficient(pod, func(name v1.ResourceName) bool { return name == count })
}

// insufficient is NodeResourcesFit's refusal for the resources it checks: too many pods, or
// a requested resource the node has not enough of left, or "".
func (c *candidate) insufficient(pod *v1.Pod, checks func(v1.ResourceName) bool) string {
	alloc := c.node.Status.Allocatable
	if max, ok := alloc[v1.ResourcePods]; ok && int64(c.pods+1) > max.Value() {
		return ReasonTooManyPods
	}
	var short []string
	for name, want := range resourcehelper.PodRequests(pod, resourcehelper.PodResourcesOptions{}) {
		if want.IsZero() || !checks(name) {
			continue
		}
		have := alloc[name]
		used := c.requested[name]
		have.Sub(used)
		if want.Cmp(have) > 0 {
			short = append(short, reasonInsufficient+string(name))
		}
	}
	slices.Sort(short)
	return strings.Join(short, ", ")
}

// blockable reasons are those that other pods' instances or shares cause.
func blockable(r placement.Reason) bool {
	switch r {
	case placement.ReasonPlacementsTaken, placement.ReasonInstanceLimit, placement.ReasonFragmented, placement.ReasonShareLimit:
		return true
	}
	return false
}

// fitsWithout is the smallest change that makes req fit c: the holders whose ending alone
// would make room (each on its own), else the pairs that would; nil when no pair does.
func (p *Policy) fitsWithout(req *request.Request, c *candidate) [][]string {
	var out [][]string
	try := func(idx ...int) {
		if _, refusal := placement.Fit(c.gpus(idx...), &req.Request, p.options()); refusal == nil {
			set := make([]string, len(idx))
			for k, i := range idx {
				set[k] = c.holders[i].pod
			}
			out = append(out, set)
		}
	}
	for i := range c.holders {
		try(i)
	}
	if len(out) > 0 || len(c.holders) > maxPairHolders {
		return out
	}
	for i := range c.holders {
		for k := i + 1; k < len(c.holders); k++ {
			try(i, k)
		}
	}
	return out
}

// relocation is, with the args' relocation on, what DynamicMIG's PostFilter would move to
// make room for pod on c: the smallest set of relocatable pods on one GPU (placement.Relocate,
// request.Relocatable) each of whose GPU requests fits on another node now, one after the
// other; nil when none. Disruption budgets and the relocation interval are not read here.
func (p *Policy) relocation(pod *v1.Pod, req *request.Request, c *candidate, all []*candidate) []string {
	gpus := c.gpus()
	var movables []placement.Movable
	byKey := map[string]*v1.Pod{}
	for _, h := range c.holders {
		if h.obj == nil || !request.Relocatable(h.obj, pod) {
			continue
		}
		if m, ok := placement.MovableOf(h.pod, h.held.MIG, gpus); ok {
			movables = append(movables, m)
			byKey[h.pod] = h.obj
		}
	}
	accept := func(moved []string) bool {
		reqs := make([]*placement.Request, len(moved))
		for i, key := range moved {
			q, err := p.parse(byKey[key])
			if err != nil {
				return false
			}
			reqs[i] = &q.Request
		}
		return placement.FitInTurn(reqs, len(all), func(n int) ([]placement.GPU, bool) {
			o := all[n]
			if o == c || o.Heartbeat != "fresh" || o.Inventory != "" || o.broken != "" {
				return nil, false
			}
			return o.gpus(), true
		}, p.options())
	}
	rel, ok := placement.Relocate(gpus, &req.Request, p.options(), movables, p.Args.Relocation.MaxPods, accept)
	if !ok {
		return nil
	}
	return rel.Moved
}

// maxPairHolders bounds the pair search (n² fits) to nodes a person can read about.
const maxPairHolders = 64

// layouts are the slot maps of c's MIG GPUs as gpus occupies them: "GPU 0 GPU-1e4b6a9d
// |a a b b . . c .| a=default/x 2g.10gb [0,2) b=…".
func layouts(c *candidate, gpus []placement.GPU) []string {
	var out []string
	for i := range gpus {
		g := &gpus[i].Info
		if g.Mode != api.ModeMIG {
			continue
		}
		var used []SlotRange
		for _, h := range c.holders {
			for _, r := range holdings(h) {
				if r.GPUUUID == g.ID {
					used = append(used, SlotRange{Placement: r.Placement, Pod: h.pod, Profile: r.Profile})
				}
			}
		}
		for _, in := range g.Unexplained {
			used = append(used, SlotRange{Placement: in.Placement, Profile: in.Profile, Unexplained: true})
		}
		cells, legend := SlotCells(SlotMap(g.SlotCount(), used))
		line := fmt.Sprintf("GPU %d %s |%s|", g.Index, g.ID, strings.Join(cells, " "))
		for _, l := range legend {
			switch {
			case l.Unexplained:
				line += fmt.Sprintf(" %s=%s %s %s", l.Mark, unexplainedHolder, l.Profile, l.Placement)
			case l.Pod != "":
				line += fmt.Sprintf(" %s=%s %s %s", l.Mark, l.Pod, l.Profile, l.Placement)
			}
		}
		out = append(out, line)
	}
	return out
}

// holdings are a holder's MIG reservations.
func holdings(h holder) []api.MigReservation {
	out := slices.Clip(h.held.MIG) // appending never writes into the decoded records
	for _, a := range h.assignments {
		if a.Mode == api.ModeMIG {
			out = append(out, api.MigReservation{GPUUUID: a.GPUUUID, Profile: a.Profile, Placement: a.Placement})
		}
	}
	return out
}

// Cell is one slot range of a slot map with the letter that marks it ("." when free).
type Cell struct {
	Mark string
	SlotRange
}

// unexplainedHolder names the holder of an instance no reservation explains.
const unexplainedHolder = "(no reservation: not dynamig's, or processes still run)"

// SlotCells draws a slot map: one cell per memory slot, a letter per reservation (a, b, …
// in slot order), "x" for an instance no reservation explains and "." for free slots, with
// the ranges in order and their marks.
func SlotCells(slots []SlotRange) (cells []string, legend []Cell) {
	n := 0
	if len(slots) > 0 {
		n = slots[len(slots)-1].Placement.End()
	}
	cells = make([]string, n)
	for i := range cells {
		cells[i] = "."
	}
	letter := 0
	for _, s := range slots {
		mark := "."
		switch {
		case s.Unexplained:
			mark = "x"
		case s.Pod != "":
			mark = string(rune('a' + letter%26))
			letter++
		}
		for c := s.Placement.Start; c < s.Placement.End() && c < n; c++ {
			cells[c] = mark
		}
		legend = append(legend, Cell{Mark: mark, SlotRange: s})
	}
	return cells, legend
}
