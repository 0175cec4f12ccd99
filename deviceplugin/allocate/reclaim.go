package allocate

import (
	"context"
	"errors"
	"fmt"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/klog/v2"

	"github.com/dynamig/dynamig/api"
	"github.com/dynamig/dynamig/deviceplugin/checkpoint"
	"github.com/dynamig/dynamig/deviceplugin/metrics"
)

// Reclaim destroys, on every GPU, this plugin's instances whose pods ended. It is what the
// reconcile loop runs.
func (a *Allocator) Reclaim(ctx context.Context) error {
	var errs []error
	for _, gpu := range a.opts.Instances.GPUs() {
		unlock, err := a.opts.Instances.Lock(gpu)
		if err != nil {
			return err
		}
		if err := a.reclaimLocked(ctx, gpu); err != nil {
			errs = append(errs, err)
		}
		unlock()
	}
	if len(errs) > 0 {
		return fmt.Errorf("reclaim: %w", errors.Join(errs...))
	}
	return nil
}

// reclaimLocked destroys the GPU's checkpointed instances whose owner is known, from a
// direct read of the API, to be deleted, Succeeded or Failed. Any read that fails stops it:
// an unreadable API never destroys anything. An instance that cannot be destroyed (a
// process still runs on it) is logged and left for the next pass; the others still go. The
// GPU lock is held.
func (a *Allocator) reclaimLocked(ctx context.Context, gpu string) error {
	var errs []error
	for _, e := range a.opts.Checkpoint.Entries() {
		if e.GPUUUID != gpu {
			continue
		}
		p, err := a.ownerPod(ctx, e)
		if err != nil {
			return errors.Join(append(errs, fmt.Errorf("not reclaiming on %s: %w", gpu, err))...)
		}
		if p != nil && !ended(p) {
			continue
		}
		if err := a.reclaim(ctx, e, p); err != nil {
			klog.FromContext(ctx).Error(err, "Reclaim failed; the next pass retries", "pod", klog.KRef(e.PodNamespace, e.PodName),
				"gpu", gpu, "placement", e.Placement.String(), "migUUID", e.MigUUID)
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// reclaim destroys the instance of an ended pod's checkpoint entry and forgets the entry;
// pod is the ended pod, nil when it is gone. The GPU lock is held.
func (a *Allocator) reclaim(ctx context.Context, e checkpoint.Entry, pod *v1.Pod) error {
	destroyed := false
	if e.State == checkpoint.Created {
		_, state, err := a.find(e.GPUUUID, e)
		if err != nil {
			metrics.ObserveActions("reclaim_failed", 1)
			return fmt.Errorf("reclaiming the instance of %s/%s: %w", e.PodNamespace, e.PodName, err)
		}
		if state != gone { // whole, or what a failed destroy left: never forgotten before it is destroyed
			if err := a.opts.Instances.Destroy(ctx, e.GPUUUID, e.GPUInstanceID); err != nil {
				metrics.ObserveActions("reclaim_failed", 1)
				return fmt.Errorf("reclaiming the instance of %s/%s: %w", e.PodNamespace, e.PodName, err)
			}
			destroyed = true
		}
	} else if err := a.destroyAt(ctx, e); err != nil {
		metrics.ObserveActions("reclaim_failed", 1)
		return err
	}
	if err := a.opts.Checkpoint.Remove(e.Key); err != nil {
		return err
	}
	metrics.ObserveActions("reclaimed", 1)
	klog.FromContext(ctx).V(2).Info("Reclaimed the MIG instance of an ended pod", "pod", klog.KRef(e.PodNamespace, e.PodName), "podGone", pod == nil,
		"gpu", e.GPUUUID, "placement", e.Placement.String(), "migUUID", e.MigUUID)
	if destroyed {
		a.reclaimed(e, pod)
	}
	return nil
}

// destroyAt removes what an interrupted create of intent e left at its placement: an
// instance of its profile there that no other entry records and no other pod's live
// reservation names. Ownership is pod UID, container and device, never placement alone: an
// intent that outlived its create must not take the instance the next pod made there.
func (a *Allocator) destroyAt(ctx context.Context, e checkpoint.Entry) error {
	list, err := a.opts.Instances.List(e.GPUUUID)
	if err != nil {
		return err
	}
	for _, in := range list {
		if in.Placement != e.Placement || in.Profile != e.Profile || a.recordedForOther(e, in) {
			continue
		}
		if in.MigUUID != "" {
			other, err := a.namedByOther(ctx, e, in.MigUUID)
			if err != nil {
				return fmt.Errorf("not clearing the intent of %s/%s at %s on %s: %w", e.PodNamespace, e.PodName, e.Placement, e.GPUUUID, err)
			}
			if other != nil {
				klog.FromContext(ctx).Info("An intent's placement holds another pod's instance: left alone", "pod", klog.KRef(e.PodNamespace, e.PodName),
					"owner", klog.KObj(other), "gpu", e.GPUUUID, "placement", e.Placement.String(), "migUUID", in.MigUUID)
				continue
			}
		}
		return a.opts.Instances.Destroy(ctx, e.GPUUUID, in.GPUInstanceID)
	}
	return nil
}

// namedByOther finds the live pod on this node, other than the intent's, whose reservation
// names the MIG device, from a direct read of the API.
func (a *Allocator) namedByOther(ctx context.Context, intent checkpoint.Entry, migUUID string) (*v1.Pod, error) {
	list, err := a.opts.Client.CoreV1().Pods("").List(ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=" + a.opts.NodeName})
	if err != nil {
		return nil, fmt.Errorf("listing this node's pods: %w", err)
	}
	for i := range list.Items {
		p := &list.Items[i]
		raw, ok := p.Annotations[api.MigReservationsAnnotation]
		if !ok || string(p.UID) == intent.PodUID || p.Spec.NodeName != a.opts.NodeName || ended(p) {
			continue
		}
		recs, err := api.DecodeMigReservations(raw)
		if err != nil {
			// It may name the instance: destroy nothing.
			return nil, fmt.Errorf("pod %s/%s: %w", p.Namespace, p.Name, err)
		}
		for _, r := range recs {
			if r.MigUUID == migUUID {
				return p, nil
			}
		}
	}
	return nil, nil
}

// ownerPod reads the entry's pod from the API: nil when it is gone (or replaced by a pod of
// the same name).
func (a *Allocator) ownerPod(ctx context.Context, e checkpoint.Entry) (*v1.Pod, error) {
	p, err := a.opts.Client.CoreV1().Pods(e.PodNamespace).Get(ctx, e.PodName, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		return nil, nil
	case err != nil:
		return nil, err
	case string(p.UID) != e.PodUID:
		return nil, nil
	}
	return p, nil
}
