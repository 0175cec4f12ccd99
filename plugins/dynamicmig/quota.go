package dynamicmig

import (
	"fmt"
	"sync"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"
	fwk "k8s.io/kube-scheduler/framework"

	"github.com/dynamig/dynamig/api"
	"github.com/dynamig/dynamig/plugins/dynamicmig/placement"
	"github.com/dynamig/dynamig/plugins/dynamicmig/quota"
)

// Namespace GPU quotas (package quota): a pod whose grant would take its namespace past a
// limit is not scheduled, and is tried again when a GPU pod ends or a quota of its namespace
// changes. Nothing running is ever evicted: pods that predate a quota, or a quota lowered
// below what runs, count against it, and new pods wait.

// gpuQuotas are the namespace's ResourceQuotas that limit GPU memory or cores.
func (pl *DynamicMIG) gpuQuotas(namespace string) ([]quota.Limits, error) {
	all, err := pl.quotaLister.ResourceQuotas(namespace).List(labels.Everything())
	if err != nil {
		return nil, err
	}
	var quotas []quota.Limits
	for _, q := range all {
		if g, ok := pl.quotaNames.Of(q); ok {
			quotas = append(quotas, g)
		}
	}
	return quotas, nil
}

// quotaCheckFor is the pod's namespace's quota check, nil when no quota limits it. The
// namespace's grant is summed over the snapshot's pods, which costs a pass over every pod of
// the cluster, made only for pods of a namespace with a GPU quota.
//
// The use is counted at the cycle's start over the snapshot, which holds the pods reserved by
// earlier cycles (assumed) as well as the bound ones, so that two pods scheduled one after the
// other cannot both pass a limit only one fits in.
func (pl *DynamicMIG) quotaCheckFor(pod *v1.Pod, nodes []fwk.NodeInfo) (*quota.Check, error) {
	quotas, err := pl.gpuQuotas(pod.Namespace)
	if err != nil || len(quotas) == 0 {
		return nil, err
	}
	c := &quota.Check{Namespace: pod.Namespace, Limits: quotas}
	for _, ni := range nodes {
		for _, pi := range ni.GetPods() {
			p := pi.GetPod()
			if p.Namespace != pod.Namespace || p.UID == pod.UID || p.Status.Phase == v1.PodSucceeded || p.Status.Phase == v1.PodFailed {
				continue
			}
			g, err := pl.granted(p, ni.Node())
			if err != nil {
				return nil, fmt.Errorf("counting the GPU quota of namespace %s: pod %s: %w", pod.Namespace, p.Name, err)
			}
			c.Used.Add(g)
		}
	}
	return c, nil
}

// granted is what a pod on node holds: from its reservation annotations once bound (its
// MIG profiles as the node's inventory publishes them), else from what Reserve recorded.
// An unreadable reservation or inventory is an error: it could hide a grant.
func (pl *DynamicMIG) granted(p *v1.Pod, node *v1.Node) (placement.Grant, error) {
	held, found, err := placement.DecodeHeld(p.Annotations, pl.reservations.decode)
	if err != nil {
		return placement.Grant{}, err
	}
	if !found {
		if r, ok := pl.reservations.get(p.UID); ok {
			return r.result.Grant(), nil
		}
		return placement.Grant{}, nil
	}
	var gpus []api.GPU
	if len(held.MIG) > 0 {
		if gpus, _, err = pl.inventory.get(node); err != nil {
			return placement.Grant{}, fmt.Errorf("node %s's GPU inventory: %w", node.Name, err)
		}
	}
	return held.Grant(gpus), nil
}

// quotaWaiters are the pods refused for their namespace's GPU quota, by namespace: a change
// of a quota of theirs is no scheduler event, so the quota handler activates them (a GPU
// pod's end is one, and requeues them through the Pod/Delete hint).
type quotaWaiters struct {
	mu   sync.Mutex
	pods map[string]map[types.UID]*v1.Pod
}

func newQuotaWaiters() *quotaWaiters { return &quotaWaiters{pods: map[string]map[types.UID]*v1.Pod{}} }

func (w *quotaWaiters) add(p *v1.Pod) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.pods[p.Namespace] == nil {
		w.pods[p.Namespace] = map[types.UID]*v1.Pod{}
	}
	w.pods[p.Namespace][p.UID] = p
}

func (w *quotaWaiters) remove(p *v1.Pod) {
	w.mu.Lock()
	defer w.mu.Unlock()
	delete(w.pods[p.Namespace], p.UID)
	if len(w.pods[p.Namespace]) == 0 {
		delete(w.pods, p.Namespace)
	}
}

// take returns and forgets the namespace's waiting pods.
func (w *quotaWaiters) take(namespace string) map[string]*v1.Pod {
	w.mu.Lock()
	defer w.mu.Unlock()
	pods := make(map[string]*v1.Pod, len(w.pods[namespace]))
	for _, p := range w.pods[namespace] {
		pods[p.Namespace+"/"+p.Name] = p
	}
	delete(w.pods, namespace)
	return pods
}

// onQuotaEvent activates the pods refused for their namespace's GPU quota when a quota of
// the namespace that sets a GPU limit is added, changed or removed.
func (pl *DynamicMIG) onQuotaEvent(oldObj, newObj any) {
	var oldQ, newQ *v1.ResourceQuota
	oldQ, _ = deletedObject(oldObj).(*v1.ResourceQuota)
	newQ, _ = newObj.(*v1.ResourceQuota)
	q := newQ
	if q == nil {
		q = oldQ
	}
	if q == nil {
		return
	}
	oldLimits, oldGPU := quota.Limits{}, false
	if oldQ != nil {
		oldLimits, oldGPU = pl.quotaNames.Of(oldQ)
	}
	newLimits, newGPU := quota.Limits{}, false
	if newQ != nil {
		newLimits, newGPU = pl.quotaNames.Of(newQ)
	}
	if !oldGPU && !newGPU || oldLimits == newLimits {
		return
	}
	if pods := pl.quotaWaiting.take(q.Namespace); len(pods) > 0 {
		logger := klog.Background().WithName(Name)
		logger.V(4).Info("A GPU quota changed; activating the pods it refused", "resourceQuota", klog.KObj(q), "pods", len(pods))
		pl.handle.Activate(logger, pods)
	}
}

// quotaHandler is the ResourceQuota informer's handler.
func (pl *DynamicMIG) quotaHandler() cache.ResourceEventHandler {
	return cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { pl.onQuotaEvent(nil, obj) },
		UpdateFunc: pl.onQuotaEvent,
		DeleteFunc: func(obj any) { pl.onQuotaEvent(obj, nil) },
	}
}

// reasonQuota is the refusal's and the metric's reason.
const reasonQuota = quota.Reason
