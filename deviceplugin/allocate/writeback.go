package allocate

import (
	"context"
	"encoding/json"
	"fmt"

	coordinationv1 "k8s.io/api/coordination/v1"
	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"

	"github.com/dynamig/dynamig/api"
)

// writeBack patches the runtime identity into the pod's reservation annotation, with the
// resourceVersion it was read at as a precondition; after the last container it also sets
// bind-phase success. A conflict is retried on a fresh read whose reservation must still
// be the one realised.
func (a *Allocator) writeBack(ctx context.Context, pod *v1.Pod, recs []api.MigReservation, last bool) error {
	for attempt := 0; attempt < 5; attempt++ {
		raw, err := api.EncodeMigReservations(recs)
		if err != nil {
			return err
		}
		annotations := map[string]any{api.MigReservationsAnnotation: raw}
		if last {
			annotations[api.BindPhaseAnnotation] = api.BindPhaseSuccess
		}
		patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{"resourceVersion": pod.ResourceVersion, "annotations": annotations}})
		_, err = a.opts.Client.CoreV1().Pods(pod.Namespace).Patch(ctx, pod.Name, types.MergePatchType, patch, metav1.PatchOptions{})
		if err == nil {
			return nil
		}
		if !apierrors.IsConflict(err) {
			return fmt.Errorf("writing the runtime identity to pod %s/%s: %w", pod.Namespace, pod.Name, err)
		}
		fresh, err := a.opts.Client.CoreV1().Pods(pod.Namespace).Get(ctx, pod.Name, metav1.GetOptions{})
		if err != nil {
			return fmt.Errorf("re-reading pod %s/%s after a conflict: %w", pod.Namespace, pod.Name, err)
		}
		if fresh.UID != pod.UID {
			return fmt.Errorf("pod %s/%s was replaced while allocating", pod.Namespace, pod.Name)
		}
		pod = fresh
	}
	return fmt.Errorf("writing the runtime identity to pod %s/%s: too many conflicts", pod.Namespace, pod.Name)
}

// failed marks the pod's bind phase failed with the reason, and releases the Lease so the
// node's next pod is not held up.
func (a *Allocator) failed(ctx context.Context, pod *v1.Pod, cause error) {
	patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]any{
		api.BindPhaseAnnotation: api.BindPhaseFailed, bindFailureAnnotation: cause.Error(),
	}}})
	if _, err := a.opts.Client.CoreV1().Pods(pod.Namespace).Patch(ctx, pod.Name, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		klog.FromContext(ctx).Error(err, "Marking the bind phase failed")
	}
	if lease, err := a.opts.Client.CoordinationV1().Leases(a.opts.LeaseNamespace).Get(ctx, api.HandoffLeaseName(a.opts.NodeName), metav1.GetOptions{}); err == nil {
		a.releaseLease(ctx, lease)
	}
}

// bindFailureAnnotation says why the device plugin gave up on a pod.
const bindFailureAnnotation = "dynamig.io/bind-failure"

// releaseLease clears the hand-off Lease's holder; the resourceVersion it was read at guards
// against clearing a newer holder's hand-off.
func (a *Allocator) releaseLease(ctx context.Context, lease *coordinationv1.Lease) {
	l := lease.DeepCopy()
	l.Spec.HolderIdentity = nil
	if _, err := a.opts.Client.CoordinationV1().Leases(l.Namespace).Update(ctx, l, metav1.UpdateOptions{}); err != nil {
		klog.FromContext(ctx).Info("Hand-off Lease not released (a newer holder, or an API error)", "lease", klog.KObj(l), "err", err)
	}
}
