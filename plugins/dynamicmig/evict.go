package dynamicmig

import (
	"context"
	"time"

	v1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	clientset "k8s.io/client-go/kubernetes"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/klog/v2"

	"github.com/dynamig/dynamig/api"
)

// evictor evicts the pods a node's device plugin gave up on (bind-phase failed with
// dynamig.io/bind-failure: the reservation can never be realised on that node), so their
// controllers recreate them and the scheduler places them elsewhere. It is the scheduler's
// job, not the node agent's: RBAC cannot narrow the right to evict to one node's pods, and
// admission never sees an Eviction's target. The Eviction API keeps disruption budgets; an
// eviction they refuse, or one that fails, is retried with backoff.
type evictor struct {
	client clientset.Interface
	queue  workqueue.TypedRateLimitingInterface[evictee]
}

// evictee is one pod, by name and UID: a pod recreated under its name is not evicted.
type evictee struct {
	namespace, name string
	uid             types.UID
}

func newEvictor(client clientset.Interface) *evictor {
	return &evictor{client: client, queue: workqueue.NewTypedRateLimitingQueueWithConfig(
		workqueue.NewTypedItemExponentialFailureRateLimiter[evictee](time.Second, time.Minute),
		workqueue.TypedRateLimitingQueueConfig[evictee]{Name: "dynamig_evictions"})}
}

// onPod queues the pod when its node's device plugin gave it up and it is not going away.
func (e *evictor) onPod(obj any) {
	p, ok := obj.(*v1.Pod)
	if !ok || !givenUp(p) {
		return
	}
	e.queue.Add(evictee{namespace: p.Namespace, name: p.Name, uid: p.UID})
}

func givenUp(p *v1.Pod) bool {
	return p.Spec.NodeName != "" && p.DeletionTimestamp == nil && p.Status.Phase != v1.PodSucceeded && p.Status.Phase != v1.PodFailed &&
		p.Annotations[api.BindPhaseAnnotation] == api.BindPhaseFailed && p.Annotations[api.BindFailureAnnotation] != ""
}

// run evicts queued pods until ctx ends.
func (e *evictor) run(ctx context.Context) {
	go func() {
		<-ctx.Done()
		e.queue.ShutDown()
	}()
	for {
		item, shutdown := e.queue.Get()
		if shutdown {
			return
		}
		if err := e.evict(ctx, item); err != nil {
			klog.FromContext(ctx).Error(err, "Evicting a pod its device plugin gave up on; retrying", "pod", klog.KRef(item.namespace, item.name))
			e.queue.AddRateLimited(item)
		} else {
			e.queue.Forget(item)
		}
		e.queue.Done(item)
	}
}

// evict evicts the pod if it is still the one given up; gone or replaced is done.
func (e *evictor) evict(ctx context.Context, item evictee) error {
	if err := evictPod(ctx, e.client, item.namespace, item.name, item.uid); err != nil {
		return err
	}
	klog.FromContext(ctx).Info("Evicted a pod its device plugin gave up on", "pod", klog.KRef(item.namespace, item.name))
	return nil
}

// evictPod evicts the pod of that name through the Eviction API, which keeps disruption
// budgets, if it is still the pod of uid (a precondition): one gone, or replaced by another
// of its name, counts as evicted.
func evictPod(ctx context.Context, client clientset.Interface, namespace, name string, uid types.UID) error {
	eviction := &policyv1.Eviction{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name},
		DeleteOptions: &metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &uid}}}
	err := client.PolicyV1().Evictions(namespace).Evict(ctx, eviction)
	if apierrors.IsNotFound(err) || apierrors.IsConflict(err) {
		return nil
	}
	return err
}
