package dynamicmig

import (
	"context"
	"strings"
	"sync"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	v1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/klog/v2"
	fwk "k8s.io/kube-scheduler/framework"

	"github.com/dynamig/dynamig/api"
)

// EventsToRegister requeues a pod this plugin refused only on events that can help it: a
// node added or its inventory changed, a GPU node's allocatable device count grown (a device
// plugin registered again: the kubelet advertises none for a moment after a restart), a pod
// with GPU reservations deleted (the scheduler sees a pod that ended as deleted). A
// heartbeat Lease renewed after it had expired is not a scheduler event; the plugin's Lease
// handler activates the pods it refused for it. With relocation on, also a disruption budget
// deleted or allowing more; a relocation interval running out activates the pods that
// waited for it (PostFilter).
func (pl *DynamicMIG) EventsToRegister(context.Context) ([]fwk.ClusterEventWithHint, error) {
	events := []fwk.ClusterEventWithHint{
		{Event: fwk.ClusterEvent{Resource: fwk.Node, ActionType: fwk.Add | fwk.UpdateNodeAnnotation | fwk.UpdateNodeAllocatable}, QueueingHintFn: pl.isSchedulableAfterNodeChange},
		{Event: fwk.ClusterEvent{Resource: fwk.Pod, ActionType: fwk.Delete}, QueueingHintFn: pl.isSchedulableAfterPodDelete},
	}
	if pl.args.Relocation.Enabled {
		// A disruption budget that allows more may let a relocation through: kube-scheduler
		// watches the kind for this (a dynamic informer), no built-in event covers it.
		events = append(events, fwk.ClusterEventWithHint{Event: fwk.ClusterEvent{Resource: disruptionBudgets, ActionType: fwk.Update | fwk.Delete}, QueueingHintFn: pl.isSchedulableAfterBudgetChange})
	}
	return events, nil
}

// disruptionBudgets is PodDisruptionBudget as a kube-scheduler event resource: plural kind,
// version, group.
const disruptionBudgets fwk.EventResource = "poddisruptionbudgets.v1.policy"

// isSchedulableAfterBudgetChange queues a pod when a disruption budget is deleted or allows
// more disruptions than before; a relocation may then evict what the budget held.
func (pl *DynamicMIG) isSchedulableAfterBudgetChange(logger klog.Logger, pod *v1.Pod, oldObj, newObj any) (fwk.QueueingHint, error) {
	if newObj == nil {
		logger.V(5).Info("Disruption budget deleted", "pod", klog.KObj(pod))
		return fwk.Queue, nil
	}
	before, okOld := disruptionsAllowed(oldObj)
	now, okNew := disruptionsAllowed(newObj)
	if !okOld || !okNew || now > before {
		logger.V(5).Info("Disruption budget allows more", "pod", klog.KObj(pod), "before", before, "now", now)
		return fwk.Queue, nil
	}
	return fwk.QueueSkip, nil
}

// disruptionsAllowed is a PodDisruptionBudget's status.disruptionsAllowed, typed or as the
// dynamic informer delivers it.
func disruptionsAllowed(obj any) (int64, bool) {
	switch o := obj.(type) {
	case *policyv1.PodDisruptionBudget:
		return int64(o.Status.DisruptionsAllowed), true
	case *unstructured.Unstructured:
		n, _, err := unstructured.NestedInt64(o.Object, "status", "disruptionsAllowed")
		return n, err == nil
	}
	return 0, false
}

func (pl *DynamicMIG) isSchedulableAfterNodeChange(logger klog.Logger, pod *v1.Pod, oldObj, newObj any) (fwk.QueueingHint, error) {
	newNode, ok := newObj.(*v1.Node)
	if !ok {
		return fwk.Queue, nil
	}
	inv, has := newNode.Annotations[api.NodeInventoryAnnotation]
	if !has {
		return fwk.QueueSkip, nil
	}
	oldNode, ok := oldObj.(*v1.Node)
	if !ok || oldNode.Annotations[api.NodeInventoryAnnotation] != inv {
		logger.V(5).Info("GPU inventory added or changed", "pod", klog.KObj(pod), "node", klog.KObj(newNode))
		return fwk.Queue, nil
	}
	count := v1.ResourceName(pl.args.ResourceCountName)
	if before, now := oldNode.Status.Allocatable[count], newNode.Status.Allocatable[count]; now.Cmp(before) > 0 {
		logger.V(5).Info("GPU devices grew", "pod", klog.KObj(pod), "node", klog.KObj(newNode), "devices", now.String())
		return fwk.Queue, nil
	}
	return fwk.QueueSkip, nil
}

func (pl *DynamicMIG) isSchedulableAfterPodDelete(logger klog.Logger, pod *v1.Pod, oldObj, _ any) (fwk.QueueingHint, error) {
	deleted, ok := oldObj.(*v1.Pod)
	if !ok {
		return fwk.Queue, nil // a tombstone: be safe
	}
	if deleted.Spec.NodeName == "" {
		return fwk.QueueSkip, nil
	}
	if _, inflight := pl.reservations.get(deleted.UID); !hasReservation(deleted) && !inflight {
		return fwk.QueueSkip, nil
	}
	logger.V(5).Info("GPU pod deleted", "pod", klog.KObj(pod), "deleted", klog.KObj(deleted))
	return fwk.Queue, nil
}

// onLeaseEvent records the heartbeat and activates the pods refused for an expired
// heartbeat when one comes back.
func (pl *DynamicMIG) onLeaseEvent(_, newObj any) {
	l, ok := newObj.(*coordinationv1.Lease)
	if !ok {
		return
	}
	node, ok := strings.CutPrefix(l.Name, api.HeartbeatLeasePrefix)
	if !ok || node == "" {
		return
	}
	now := time.Now()
	wasFresh := pl.leaseTimes.heartbeatFresh(node, now)
	pl.leaseTimes.set(l, now)
	if wasFresh || !pl.leaseTimes.heartbeatFresh(node, now) {
		return // nothing changed for waiting pods
	}
	pods := map[string]*v1.Pod{}
	pl.heartbeatWaiters.Range(func(k, v any) bool {
		p := v.(*v1.Pod)
		pods[p.Namespace+"/"+p.Name] = p
		pl.heartbeatWaiters.Delete(k)
		return true
	})
	if len(pods) > 0 {
		logger := klog.Background().WithName(Name)
		logger.V(4).Info("Device plugin heartbeat is back; activating pods", "lease", klog.KObj(l), "pods", len(pods))
		pl.handle.Activate(logger, pods)
	}
}

func (pl *DynamicMIG) onLeaseAdd(obj any)               { pl.onLeaseEvent(nil, obj) }
func (pl *DynamicMIG) onLeaseUpdate(oldObj, newObj any) { pl.onLeaseEvent(oldObj, newObj) }
func (pl *DynamicMIG) onLeaseDelete(obj any) {
	if l, ok := deletedObject(obj).(*coordinationv1.Lease); ok {
		pl.leaseTimes.remove(l)
	}
}

// leaseTimes holds, per node, until when its device plugin's heartbeat is fresh, from the
// Lease informer: Filter asks for every node of every cycle, so it looks up a time instead
// of reading and parsing Leases. A sync.Map: Filter's parallel readers never contend, and
// writes come only with Lease events.
//
// A renewal counts from when the scheduler saw it, on its own clock, not from the renew
// time the node wrote, so clock skew between the scheduler and a node neither expires a
// live node early (its clock behind) nor keeps a dead one alive longer (ahead), as the
// node lifecycle controller does with kubelet Leases. A Lease seen for the first time (an
// add, or a restarted scheduler's list), or one whose renew time moved back, has only the
// node's word: fresh until its renew time plus duration, and never past now plus duration.
type leaseTimes struct {
	heartbeat sync.Map // node name → heartbeatSeen
}

type heartbeatSeen struct {
	renewed time.Time // the Lease's renew time, as the node wrote it
	expiry  time.Time // on the scheduler's clock
}

func newLeaseTimes() *leaseTimes { return &leaseTimes{} }

// set records the node's heartbeat Lease as seen at now; other Leases are ignored.
func (t *leaseTimes) set(l *coordinationv1.Lease, now time.Time) {
	node, ok := strings.CutPrefix(l.Name, api.HeartbeatLeasePrefix)
	if !ok {
		return
	}
	if l.Spec.RenewTime == nil || l.Spec.LeaseDurationSeconds == nil {
		t.heartbeat.Store(node, heartbeatSeen{})
		return
	}
	renewed, duration := l.Spec.RenewTime.Time, time.Duration(*l.Spec.LeaseDurationSeconds)*time.Second
	if prev, ok := t.heartbeat.Load(node); ok {
		switch p := prev.(heartbeatSeen); {
		case p.renewed.Equal(renewed):
			return // not renewed: another field changed
		case !p.renewed.IsZero() && renewed.After(p.renewed):
			t.heartbeat.Store(node, heartbeatSeen{renewed: renewed, expiry: now.Add(duration)})
			return
		}
		// A renew time moved back is no renewal (the Lease was rewritten): the node's word.
	}
	expiry := renewed.Add(duration)
	if limit := now.Add(duration); expiry.After(limit) {
		expiry = limit
	}
	t.heartbeat.Store(node, heartbeatSeen{renewed: renewed, expiry: expiry})
}

func (t *leaseTimes) remove(l *coordinationv1.Lease) {
	if node, ok := strings.CutPrefix(l.Name, api.HeartbeatLeasePrefix); ok {
		t.heartbeat.Delete(node)
	}
}

// heartbeatFresh reports whether the node's device plugin heartbeat is fresh at now.
func (t *leaseTimes) heartbeatFresh(node string, now time.Time) bool {
	h, ok := t.heartbeat.Load(node)
	return ok && h.(heartbeatSeen).expiry.After(now)
}
