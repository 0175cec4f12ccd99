package dynamicmig

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"
	fwk "k8s.io/kube-scheduler/framework"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/dynamig/dynamig/api"
	"github.com/dynamig/dynamig/plugins/dynamicmig/placement"
	"github.com/dynamig/dynamig/plugins/dynamicmig/request"
)

var (
	relocations = prometheus.NewCounter(prometheus.CounterOpts{
		Namespace: "dynamig", Subsystem: "scheduler", Name: "relocations_total",
		Help: "Relocations started: a pending GPU pod nominated to a GPU whose relocatable pods are evicted for it.",
	})
	relocationEvictions = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "dynamig", Subsystem: "scheduler", Name: "relocation_evictions_total",
		Help: "Evictions of relocatable pods, by result: evicted, refused (a disruption budget or the API server said no), failed.",
	}, []string{"result"})
)

func init() { Registry.MustRegister(relocations, relocationEvictions) }

// PostFilter relocates, when the args turn relocation on: for a MIG pod that fits on a GPU
// only if pods annotated dynamig.io/relocatable leave it, and each of them fits elsewhere
// now, it evicts the smallest such set (Eviction API: disruption budgets hold) and nominates
// the pod to the node, so that the room freed is held for it. It runs after kube-scheduler's
// preemption (the default plugins come first), which keeps priority first: only where no
// lower-priority pod's preemption helps. A pod moved is of equal or lower priority, owned by
// a controller (which makes it again), allowed by its disruption budgets, and of a
// controller none of whose pods was relocated within the interval.
func (pl *DynamicMIG) PostFilter(ctx context.Context, state fwk.CycleState, pod *v1.Pod, statuses fwk.NodeToStatusReader) (*fwk.PostFilterResult, *fwk.Status) {
	// No reason where relocation does not apply: kube-scheduler adds every PostFilter
	// plugin's reasons to the pod's FailedScheduling message.
	if !pl.args.Relocation.Enabled {
		return nil, fwk.NewStatus(fwk.Unschedulable)
	}
	s, err := readState(state)
	if err != nil {
		return nil, fwk.NewStatus(fwk.Unschedulable)
	}
	if leaving := pl.stillLeaving(pod); leaving != "" {
		// Its relocation is under way: the room is held for it (its nomination) until the
		// pods moved for it are gone; no other pod is moved meanwhile.
		return nil, fwk.NewStatus(fwk.Unschedulable, "waiting for "+leaving+", relocated for it, to leave")
	}
	candidates, err := statuses.NodesForStatusCode(pl.handle.SnapshotSharedLister().NodeInfos(), fwk.Unschedulable)
	if err != nil {
		return nil, fwk.AsStatus(err)
	}
	// Only nodes DynamicMIG alone refused: another plugin's refusal stays after a relocation.
	candidates = slices.DeleteFunc(candidates, func(ni fwk.NodeInfo) bool {
		st := statuses.Get(ni.Node().Name)
		return st == nil || st.Plugin() != Name
	})
	plan, recent, until := pl.planRelocation(ctx, pod, s, candidates, time.Now())
	if plan == nil {
		msg := "no relocation of relocatable pods makes room"
		if len(recent) > 0 {
			msg += fmt.Sprintf(" (pods of %s are not moved again within %v of their last relocation)", strings.Join(recent, ", "), pl.args.Relocation.Interval.Duration)
			// The interval running out is no cluster event: the pod is tried again then.
			logger := klog.FromContext(ctx)
			pl.relocated.wakeAt(pod.UID, until, func() {
				logger.V(4).Info("Relocation interval over; activating the pod", "pod", klog.KObj(pod))
				pl.handle.Activate(logger, map[string]*v1.Pod{pod.Namespace + "/" + pod.Name: pod})
			})
		}
		return nil, fwk.NewStatus(fwk.Unschedulable, msg)
	}
	pl.relocate(ctx, pod, plan)
	return &fwk.PostFilterResult{NominatingInfo: &fwk.NominatingInfo{NominatedNodeName: plan.node, NominatingMode: fwk.ModeOverride}},
		fwk.NewStatus(fwk.Success, fmt.Sprintf("relocating %s", keys(plan.moved)))
}

// relocationPlan is a relocation chosen for a pending pod.
type relocationPlan struct {
	node  string
	gpu   string // the GPU's UUID
	moved []*v1.Pod
	fit   *placement.Result
}

// planRelocation finds, over the candidate nodes in name order, the relocation that moves
// the fewest pods (placement.Relocate on each node), or nil, the controllers ("Kind
// namespace/name", sorted) whose pods it did not consider because they were relocated
// within the interval, and when the first of them may be moved again.
func (pl *DynamicMIG) planRelocation(ctx context.Context, pod *v1.Pod, s *stateData, candidates []fwk.NodeInfo, now time.Time) (*relocationPlan, []string, time.Time) {
	logger := klog.FromContext(ctx)
	all, err := pl.handle.SnapshotSharedLister().NodeInfos().List()
	if err != nil {
		logger.Error(err, "Listing nodes for a relocation")
		return nil, nil, time.Time{}
	}
	recent := map[string]bool{}
	var until time.Time
	slices.SortFunc(candidates, func(a, b fwk.NodeInfo) int { return strings.Compare(a.Node().Name, b.Node().Name) })
	var best *relocationPlan
	for _, ni := range candidates {
		gpus, _, _, st := pl.nodeGPUs(ni)
		if st != nil || !pl.leaseTimes.heartbeatFresh(ni.Node().Name, now) {
			continue
		}
		byKey := map[string]*v1.Pod{}
		var movables []placement.Movable
		for _, pi := range ni.GetPods() {
			q := pi.GetPod()
			if !request.Relocatable(q, pod) {
				continue
			}
			owner := metav1.GetControllerOf(q)
			if t, held := pl.relocated.heldUntil(owner.UID, now, pl.args.Relocation.Interval.Duration); held {
				recent[owner.Kind+" "+q.Namespace+"/"+owner.Name] = true
				if until.IsZero() || t.Before(until) {
					until = t
				}
				continue
			}
			m, ok := pl.movable(q, gpus)
			if !ok {
				continue
			}
			byKey[m.Key] = q
			movables = append(movables, m)
		}
		if len(movables) == 0 {
			continue
		}
		maxPods := pl.args.Relocation.MaxPods
		if best != nil {
			maxPods = min(maxPods, len(best.moved)-1)
		}
		accept := func(moved []string) bool {
			pods := make([]*v1.Pod, len(moved))
			for i, k := range moved {
				pods[i] = byKey[k]
			}
			return pl.budgetsAllow(pods) && pl.fitElsewhere(pods, ni.Node().Name, all, now)
		}
		rel, ok := placement.Relocate(gpus, &s.req.Request, pl.opts, movables, maxPods, accept)
		if !ok {
			continue
		}
		plan := &relocationPlan{node: ni.Node().Name, gpu: gpus[rel.GPU].Info.ID, fit: rel.Result}
		for _, k := range rel.Moved {
			plan.moved = append(plan.moved, byKey[k])
		}
		best = plan
		if len(best.moved) == 1 {
			break
		}
	}
	if best != nil {
		return best, nil, time.Time{}
	}
	return nil, slices.Sorted(maps.Keys(recent)), until
}

// movable is what a relocatable pod q holds on the node's GPUs (placement.MovableOf).
func (pl *DynamicMIG) movable(q *v1.Pod, gpus []placement.GPU) (placement.Movable, bool) {
	raw, ok := q.Annotations[api.MigReservationsAnnotation]
	if !ok {
		return placement.Movable{}, false
	}
	recs, err := pl.reservations.decode(raw)
	if err != nil {
		return placement.Movable{}, false
	}
	return placement.MovableOf(q.Namespace+"/"+q.Name, recs, gpus)
}

// budgetsAllow says whether the pods' disruption budgets allow evicting them all now; the
// Eviction API has the last word.
func (pl *DynamicMIG) budgetsAllow(pods []*v1.Pod) bool {
	if pl.pdbLister == nil {
		return true
	}
	taken := map[types.UID]int32{}
	for _, q := range pods {
		pdbs, err := pl.pdbLister.PodDisruptionBudgets(q.Namespace).List(labels.Everything())
		if err != nil {
			return false
		}
		for _, pdb := range pdbs {
			sel, err := metav1.LabelSelectorAsSelector(pdb.Spec.Selector)
			if err != nil || sel.Empty() || !sel.Matches(labels.Set(q.Labels)) {
				continue
			}
			taken[pdb.UID]++
			if taken[pdb.UID] > pdb.Status.DisruptionsAllowed {
				return false
			}
		}
	}
	return true
}

// fitElsewhere says whether the pods' GPU requests fit, one after the other, on the GPUs of
// nodes other than from, as they are now, on nodes whose device plugin's heartbeat is fresh
// (placement.FitInTurn).
func (pl *DynamicMIG) fitElsewhere(pods []*v1.Pod, from string, nodes []fwk.NodeInfo, now time.Time) bool {
	reqs := make([]*placement.Request, len(pods))
	for i, q := range pods {
		req, err := request.Parse(q, pl.args.ResourceNames, pl.args.NodeSchedulerPolicy)
		if err != nil || req == nil {
			return false
		}
		reqs[i] = &req.Request
	}
	return placement.FitInTurn(reqs, len(nodes), func(n int) ([]placement.GPU, bool) {
		name := nodes[n].Node().Name
		if name == from || !pl.leaseTimes.heartbeatFresh(name, now) {
			return nil, false
		}
		gpus, _, _, st := pl.nodeGPUs(nodes[n])
		return gpus, st == nil
	}, pl.opts)
}

// relocate records the relocation (the moved pods' controllers are not relocated from again
// within the interval), says so on the pending pod and on each moved pod, and evicts them in
// the background: PostFilter returns at once, and the pod, nominated, is tried again as they
// go.
func (pl *DynamicMIG) relocate(ctx context.Context, pod *v1.Pod, plan *relocationPlan) {
	logger := klog.FromContext(ctx)
	now := time.Now()
	for _, q := range plan.moved {
		pl.relocated.mark(metav1.GetControllerOf(q).UID, now, pl.args.Relocation.Interval.Duration)
	}
	pl.relocated.start(pod.UID, plan)
	relocations.Inc()
	logger.Info("Relocating pods to make room for a GPU pod", "pod", klog.KObj(pod), "node", plan.node, "gpu", plan.gpu, "moved", keys(plan.moved), "devices", describe(plan.fit))
	rec := pl.handle.EventRecorder()
	if rec != nil {
		rec.Eventf(pod, nil, v1.EventTypeNormal, "Relocating", "Scheduling",
			"evicting %s (%s) from GPU %s of node %s: the pod then fits there (%s)", keys(plan.moved), api.RelocatableAnnotation, plan.gpu, plan.node, describe(plan.fit))
	}
	ctx = klog.NewContext(context.WithoutCancel(ctx), logger)
	go func() {
		for _, q := range plan.moved {
			result, note := pl.evictRelocated(ctx, q)
			relocationEvictions.WithLabelValues(result).Inc()
			if rec == nil {
				continue
			}
			if result == "evicted" {
				rec.Eventf(q, pod, v1.EventTypeNormal, "Relocated", "Evicting",
					"evicted by dynamig-scheduler to make room for pod %s/%s on GPU %s of node %s; its controller makes it again", pod.Namespace, pod.Name, plan.gpu, plan.node)
			} else {
				rec.Eventf(q, pod, v1.EventTypeWarning, "RelocationFailed", "Evicting", "not relocated for pod %s/%s: %s", pod.Namespace, pod.Name, note)
				rec.Eventf(pod, q, v1.EventTypeWarning, "RelocationFailed", "Evicting", "pod %s/%s was not evicted: %s", q.Namespace, q.Name, note)
			}
		}
	}()
}

// evictRelocated evicts q (evictPod) and returns the result label and, unless evicted, why
// not.
func (pl *DynamicMIG) evictRelocated(ctx context.Context, q *v1.Pod) (result, note string) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	err := evictPod(ctx, pl.client, q.Namespace, q.Name, q.UID)
	switch {
	case err == nil:
		return "evicted", ""
	case apierrors.IsTooManyRequests(err), apierrors.IsForbidden(err):
		klog.FromContext(ctx).Info("A relocation's eviction was refused", "pod", klog.KObj(q), "err", err)
		return "refused", err.Error()
	default:
		klog.FromContext(ctx).Error(err, "A relocation's eviction failed", "pod", klog.KObj(q))
		return "failed", err.Error()
	}
}

// keys is "ns/a, ns/b".
func keys(pods []*v1.Pod) string {
	out := make([]string, len(pods))
	for i, p := range pods {
		out[i] = p.Namespace + "/" + p.Name
	}
	return strings.Join(out, ", ")
}

// stillLeaving names the pods relocated for pod that the snapshot still shows on their node
// ("" when none, or when no relocation was made for it).
func (pl *DynamicMIG) stillLeaving(pod *v1.Pod) string {
	plan, ok := pl.relocated.plan(pod.UID)
	if !ok {
		return ""
	}
	ni, err := pl.handle.SnapshotSharedLister().NodeInfos().Get(plan.node)
	if err != nil {
		pl.relocated.finish(pod.UID)
		return ""
	}
	var left []*v1.Pod
	for _, pi := range ni.GetPods() {
		if slices.ContainsFunc(plan.moved, func(q *v1.Pod) bool { return q.UID == pi.GetPod().UID }) {
			left = append(left, pi.GetPod())
		}
	}
	if len(left) == 0 {
		pl.relocated.finish(pod.UID)
		return ""
	}
	return keys(left)
}

// relocationLog remembers when each controller's pods were last relocated, the relocations
// under way, by the pod they make room for, and the pods waiting for an interval to end.
type relocationLog struct {
	mu      sync.Mutex
	at      map[types.UID]time.Time
	moving  map[types.UID]*relocationPlan
	waiting map[types.UID]*time.Timer
}

func newRelocationLog() *relocationLog {
	return &relocationLog{at: map[types.UID]time.Time{}, moving: map[types.UID]*relocationPlan{}, waiting: map[types.UID]*time.Timer{}}
}

// wakeAt calls wake at t for pod, once: a pod already waiting keeps its time (the earliest
// interval end it was told, which later tries only confirm or bring nearer by a tick).
func (l *relocationLog) wakeAt(pod types.UID, t time.Time, wake func()) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if _, ok := l.waiting[pod]; ok {
		return
	}
	l.waiting[pod] = time.AfterFunc(time.Until(t), func() {
		l.mu.Lock()
		delete(l.waiting, pod)
		l.mu.Unlock()
		wake()
	})
}

func (l *relocationLog) start(pod types.UID, plan *relocationPlan) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.moving[pod] = plan
}

func (l *relocationLog) plan(pod types.UID) (*relocationPlan, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	p, ok := l.moving[pod]
	return p, ok
}

// finish forgets the relocation made for pod: its pods are gone, or it is bound or deleted.
func (l *relocationLog) finish(pod types.UID) {
	l.mu.Lock()
	defer l.mu.Unlock()
	delete(l.moving, pod)
}

// mark records a relocation of owner's pods, and forgets those past the interval.
func (l *relocationLog) mark(owner types.UID, now time.Time, interval time.Duration) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for uid, t := range l.at {
		if now.Sub(t) >= interval {
			delete(l.at, uid)
		}
	}
	l.at[owner] = now
}

// heldUntil says whether owner's pods were relocated within the interval before now, and
// until when they are held.
func (l *relocationLog) heldUntil(owner types.UID, now time.Time, interval time.Duration) (time.Time, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	t, ok := l.at[owner]
	if !ok || now.Sub(t) >= interval {
		return time.Time{}, false
	}
	return t.Add(interval), true
}
