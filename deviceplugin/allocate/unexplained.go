package allocate

import (
	"context"
	"errors"
	"fmt"
	"slices"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/klog/v2"

	"github.com/dynamig/dynamig/api"
)

// Unexplained lists, per GPU, the MIG instances that no reservation explains by the
// scheduler's own rule (a pod of this node, neither Succeeded nor Failed, whose
// hami.io/vgpu-mig-allocations names the GPU and the placement): instances someone else
// made, and those reclaim keeps because processes still run after their pod ended. The
// inventory publishes them, so the scheduler does not reserve their placements again. It
// reads the pods from the informer, which must have synced. A GPU whose instances cannot be
// listed is left out.
func (a *Allocator) Unexplained(ctx context.Context) (map[string][]api.Instance, error) {
	if a.opts.Pods == nil {
		return nil, errors.New("no pod informer: the instances no reservation explains cannot be told")
	}
	pods, err := a.opts.Pods.List(labels.Everything())
	if err != nil {
		return nil, fmt.Errorf("listing the node's pods: %w", err)
	}
	type slot struct {
		gpu       string
		placement api.Placement
	}
	explained := map[slot]bool{}
	for _, p := range pods {
		if p.Spec.NodeName != a.opts.NodeName || p.Status.Phase == v1.PodSucceeded || p.Status.Phase == v1.PodFailed {
			continue
		}
		raw, ok := p.Annotations[api.MigReservationsAnnotation]
		if !ok {
			continue
		}
		// A reservation that does not decode explains nothing (the scheduler then places
		// nothing on the node anyway).
		recs, err := api.DecodeMigReservations(raw)
		if err != nil {
			continue
		}
		for _, r := range recs {
			explained[slot{r.GPUUUID, r.Placement}] = true
		}
	}
	out := map[string][]api.Instance{}
	for _, gpu := range a.opts.Instances.GPUs() {
		list, err := a.opts.Instances.List(gpu)
		if err != nil {
			// A GPU NVML cannot list (fallen off the bus) is published unhealthy, and the
			// scheduler places nothing on it: the others' instances are still published.
			klog.FromContext(ctx).Error(err, "Listing MIG instances for the inventory", "gpu", gpu)
			continue
		}
		for _, in := range list {
			if !explained[slot{gpu, in.Placement}] {
				out[gpu] = append(out[gpu], api.Instance{Profile: in.Profile, Placement: in.Placement})
			}
		}
		// In slot order, not NVML's: the annotation changes only when the instances do.
		slices.SortFunc(out[gpu], func(a, b api.Instance) int { return a.Placement.Start - b.Placement.Start })
	}
	return out, nil
}
