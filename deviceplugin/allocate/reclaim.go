package allocate

import (
	"context"
	"errors"
	"fmt"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/klog/v2"

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
		if _, found := a.find(e.GPUUUID, e); found {
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

// destroyAt removes what a create left at an intent's placement, if its profile matches.
func (a *Allocator) destroyAt(ctx context.Context, e checkpoint.Entry) error {
	list, err := a.opts.Instances.List(e.GPUUUID)
	if err != nil {
		return err
	}
	for _, in := range list {
		if in.Placement == e.Placement && in.Profile == e.Profile {
			return a.opts.Instances.Destroy(ctx, e.GPUUUID, in.GPUInstanceID)
		}
	}
	return nil
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
