package allocate

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"

	"github.com/dynamig/dynamig/api"
)

// writeBack records the container's runtime identity in the pod's reservation annotation,
// and bind-phase success once every reservation of the pod is realised. Nothing is written
// when the pod already says so (a container restart that adopted its instances). The patch
// holds only for the pod it was computed from (patchAnnotations); when the pod changed
// meanwhile (another container of the pod wrote first) it is computed again on a fresh read.
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
		annotations := map[string]string{}
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
		if pod, err = a.patchAnnotations(ctx, pod, annotations); !errors.Is(err, errPodChanged) {
			return err
		}
	}
	return fmt.Errorf("writing the runtime identity to pod %s/%s: too many conflicts", pod.Namespace, pod.Name)
}

// errPodChanged says the pod changed since it was read: patchAnnotations returns it with the
// pod read afresh, for the caller to compute its patch again.
var errPodChanged = errors.New("the pod changed since it was read")

// patchAnnotations sets the pod's annotations if the pod is still the one read: a JSON
// patch whose test operations make its UID (and resourceVersion, when it has one) the
// precondition, so a pod recreated under the name is never written. On a failure it reads
// the pod again: the same pod changed is errPodChanged with the fresh pod; another pod of
// the name is an error.
func (a *Allocator) patchAnnotations(ctx context.Context, pod *v1.Pod, annotations map[string]string) (*v1.Pod, error) {
	ops := []map[string]any{{"op": "test", "path": "/metadata/uid", "value": pod.UID}}
	if pod.ResourceVersion != "" {
		ops = append(ops, map[string]any{"op": "test", "path": "/metadata/resourceVersion", "value": pod.ResourceVersion})
	}
	if pod.Annotations == nil {
		ops = append(ops, map[string]any{"op": "add", "path": "/metadata/annotations", "value": map[string]string{}})
	}
	for _, k := range slices.Sorted(maps.Keys(annotations)) {
		ops = append(ops, map[string]any{"op": "add", "path": "/metadata/annotations/" + jsonPointerEscaper.Replace(k), "value": annotations[k]})
	}
	patch, _ := json.Marshal(ops)
	_, err := a.opts.Client.CoreV1().Pods(pod.Namespace).Patch(ctx, pod.Name, types.JSONPatchType, patch, metav1.PatchOptions{})
	if err == nil {
		return pod, nil
	}
	fresh, gerr := a.opts.Client.CoreV1().Pods(pod.Namespace).Get(ctx, pod.Name, metav1.GetOptions{})
	switch {
	case gerr != nil:
		return pod, fmt.Errorf("writing to pod %s/%s: %w; reading it again: %w", pod.Namespace, pod.Name, err, gerr)
	case fresh.UID != pod.UID:
		return pod, fmt.Errorf("pod %s/%s (UID %s) was replaced by a pod of the same name (UID %s) while its devices were prepared", pod.Namespace, pod.Name, pod.UID, fresh.UID)
	case fresh.ResourceVersion != pod.ResourceVersion:
		return fresh, errPodChanged
	}
	return pod, fmt.Errorf("writing to pod %s/%s: %w", pod.Namespace, pod.Name, err)
}

// jsonPointerEscaper escapes an annotation key as a JSON Pointer segment (RFC 6901).
var jsonPointerEscaper = strings.NewReplacer("~", "~0", "/", "~1")

// fail gives up on a pod whose reservation can never be realised here: a Warning event
// says why (what names the container and device), and bind-phase failed with
// dynamig.io/bind-failure records it on the pod. dynamig-scheduler then evicts the pod (the
// Eviction API, so disruption budgets hold) for its controller to recreate and the scheduler
// to place elsewhere: a node agent has no right to evict, since that right could not be
// narrowed to its own node's pods.
func (a *Allocator) fail(ctx context.Context, pod *v1.Pod, what string, cause error) {
	logger := klog.FromContext(ctx)
	logger.Error(cause, "Reservation cannot be realised; marking the pod failed for dynamig-scheduler to evict", "pod", klog.KObj(pod), "target", what)
	a.eventf(pod, v1.EventTypeWarning, ReasonUnrealisable, "Evicting: %s: %v", what, cause)
	// Through patchAnnotations, so a pod that took the name meanwhile is never marked.
	annotations := map[string]string{api.BindPhaseAnnotation: api.BindPhaseFailed, api.BindFailureAnnotation: cause.Error()}
	marked, err := pod, error(nil)
	for attempt := 0; attempt < 5; attempt++ {
		if marked, err = a.patchAnnotations(ctx, marked, annotations); !errors.Is(err, errPodChanged) {
			break
		}
	}
	if err != nil {
		logger.Error(err, "Marking the bind phase failed", "pod", klog.KObj(pod))
	}
}
