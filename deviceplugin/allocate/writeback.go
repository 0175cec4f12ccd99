package allocate

import (
	"context"
	"encoding/json"
	"fmt"

	v1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"

	"github.com/dynamig/dynamig/api"
)

// writeBack records the container's runtime identity in the pod's reservation annotation,
// and bind-phase success once every reservation of the pod is realised. Nothing is written
// when the pod already says so (a container restart that adopted its instances). The patch
// carries the resourceVersion it was computed from; on a conflict (another container of the
// pod wrote first) it is computed again on a fresh read.
func (a *Allocator) writeBack(ctx context.Context, pod *v1.Pod, mine []made) error {
	for attempt := 0; attempt < 5; attempt++ {
		recs, err := api.DecodeMigReservations(pod.Annotations[api.MigReservationsAnnotation])
		if err != nil {
			return fmt.Errorf("pod %s/%s: %w", pod.Namespace, pod.Name, err)
		}
		changed, all := false, true
		for i := range recs {
			for _, in := range mine {
				r := &recs[i]
				if r.ContainerIndex == in.containerIndex && r.DeviceIndex == in.deviceIndex &&
					(!r.Realized() || r.MigUUID != in.MigUUID || *r.GPUInstanceID != uint32(in.GPUInstanceID) || *r.ComputeInstanceID != uint32(in.ComputeInstanceID)) {
					r.SetRuntime(in.MigUUID, uint32(in.GPUInstanceID), uint32(in.ComputeInstanceID))
					changed = true
				}
			}
			all = all && recs[i].Realized()
		}
		annotations := map[string]any{}
		if changed {
			raw, err := api.EncodeMigReservations(recs)
			if err != nil {
				return err
			}
			annotations[api.MigReservationsAnnotation] = raw
		}
		if all && pod.Annotations[api.BindPhaseAnnotation] != api.BindPhaseSuccess {
			annotations[api.BindPhaseAnnotation] = api.BindPhaseSuccess
		}
		if len(annotations) == 0 {
			return nil
		}
		if pod, err = a.patchAnnotations(ctx, pod, annotations); err == nil || !apierrors.IsConflict(err) {
			return err
		}
	}
	return fmt.Errorf("writing the runtime identity to pod %s/%s: too many conflicts", pod.Namespace, pod.Name)
}

// patchAnnotations patches the pod's annotations with its resourceVersion as a
// precondition. On a conflict it returns the pod read afresh (the same pod: a new pod of
// the same name is an error) with the conflict.
func (a *Allocator) patchAnnotations(ctx context.Context, pod *v1.Pod, annotations map[string]any) (*v1.Pod, error) {
	patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{"resourceVersion": pod.ResourceVersion, "annotations": annotations}})
	_, err := a.opts.Client.CoreV1().Pods(pod.Namespace).Patch(ctx, pod.Name, types.MergePatchType, patch, metav1.PatchOptions{})
	if err == nil {
		return pod, nil
	}
	if !apierrors.IsConflict(err) {
		return pod, fmt.Errorf("writing to pod %s/%s: %w", pod.Namespace, pod.Name, err)
	}
	fresh, gerr := a.opts.Client.CoreV1().Pods(pod.Namespace).Get(ctx, pod.Name, metav1.GetOptions{})
	switch {
	case gerr != nil:
		return pod, fmt.Errorf("re-reading pod %s/%s after a conflict: %w", pod.Namespace, pod.Name, gerr)
	case fresh.UID != pod.UID:
		return pod, fmt.Errorf("pod %s/%s was replaced while its devices were prepared", pod.Namespace, pod.Name)
	}
	return fresh, err
}

// bindFailureAnnotation says why the device plugin gave up on a pod.
const bindFailureAnnotation = "dynamig.io/bind-failure"

// fail gives up on a pod whose reservation can never be realised here: a Warning event
// says why (what names the container and device), bind-phase failed records it on the pod,
// and the pod is evicted (the Eviction API, so disruption budgets hold) for its controller
// to recreate and the scheduler to place elsewhere.
func (a *Allocator) fail(ctx context.Context, pod *v1.Pod, what string, cause error) {
	logger := klog.FromContext(ctx)
	logger.Error(cause, "Reservation cannot be realised; evicting the pod", "pod", klog.KObj(pod), "target", what)
	a.eventf(pod, v1.EventTypeWarning, ReasonUnrealisable, "Evicting: %s: %v", what, cause)
	patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]any{
		api.BindPhaseAnnotation: api.BindPhaseFailed, bindFailureAnnotation: cause.Error(),
	}}})
	if _, err := a.opts.Client.CoreV1().Pods(pod.Namespace).Patch(ctx, pod.Name, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		logger.Error(err, "Marking the bind phase failed", "pod", klog.KObj(pod))
	}
	eviction := &policyv1.Eviction{ObjectMeta: metav1.ObjectMeta{Namespace: pod.Namespace, Name: pod.Name},
		DeleteOptions: &metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &pod.UID}}}
	if err := a.opts.Client.PolicyV1().Evictions(pod.Namespace).Evict(ctx, eviction); err != nil && !apierrors.IsNotFound(err) {
		logger.Error(err, "Evicting the pod", "pod", klog.KObj(pod))
	}
}
